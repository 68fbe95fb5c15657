"""Tells IM groups and webhooks about incidents: one message per incident event, grouped in a storm, within each
platform's rate limit, retried, recorded, never repeated.

Per channel ("lane"):
- Dedup: each (incident, event, channel) has a key; an event with a detail (the state an update moved to, the
  report id, the proposed actions) keys that too. A key the delivery log holds as sent is never sent again, also
  after a restart, since the log is the store.
- Grouping: the first "opened" goes at once and opens a window of `group_window_s`; further "opened" events within
  it wait and leave as one digest when it closes. A storm is a couple of messages per window, not a flood.
- Rate limit: a token bucket per channel under the platform's documented limit (and `rate_per_minute`). What finds
  no token is folded into the next digest, which lists the most urgent items and says "N more incidents" with a
  link to the list. Nothing is dropped silently.
- Flapping: an incident whose fault came back after it was resolved (reopened) is told at most once per
  `renotify_interval_s` per channel. Its reopen and resolve messages within the interval after the last message
  about it wait, the newest replacing the one before, and leave when the interval ends as one message that says how
  many changes it tells ("3 changes since the last message"); each change it carries is recorded as delivered with
  it. So the first opening goes at once (it is no reopening), and the last state, a final resolve too, is always
  told, at the latest one interval later. The interval runs from the last successful delivery in the delivery log,
  so it holds across a restart; what waits in memory is sent by `close()`.
- First message: a new incident's "opened" waits for its report and its plan (remediation's steps, each with what it
  would do or why it would not, and those that wait for approval), which come a moment later from their own
  workers, and tells them in one message. It leaves as soon as all it awaits is in (`awaits`: "report_ready",
  "planned"; the plan is known even when it has no step, `notify_planned`), at the latest after
  `first_message_wait_s` (Settings) (each recorded as delivered with it, "folded_into" the opening). What comes
  later, or while an opening waits in a digest, is folded the same way while it can be; after that it is told on
  its own (a plan with no step is not told). A group hears a fault twice: when it opens and when it is resolved.
- Failures: `argus.notify.delivery.deliver` retries 429/5xx/platform codes with backoff; a channel whose delivery
  failed is left alone for `cooldown_s` (its events fold into the digest) so a dead receiver costs the loop one
  retry sequence, not one per incident.
- Every attempt, ok or not, is recorded through `delivery_log` (one row per incident event, a digest's rows
  sharing its outcome), and told to `on_delivery(channel name, "sent" | "failed")` once per message or digest
  (wiring points it at Argus's metrics; notify itself knows nothing of Prometheus). Nothing raises into the
  caller.

Digests waiting in memory are sent by `flush()`, which `notify*` calls and `start()` runs every second; pending
digests are lost if the process dies before that (the events are then recorded nowhere). Sending happens in the
calling thread: a first failure costs the caller the retry sequence (attempts x timeout plus backoff). That caller
is the IM subscriber's own worker on the incident bus (argus/incidents/bus.py), never the detection tick. A delivery
that failed is recorded and not tried again unless the same event is notified again.

One module past 400 lines on purpose: the lanes, an opening that waits for its report, the digest of a storm and
the rate limits are one state machine per channel; split, each part would reach into the others' state.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx
from loguru import logger

from argus.notify.channels import Channel, Item
from argus.notify.delivery import Outcome, deliver
from argus.notify.message import ApprovalLink, Message, build_message, digest_of
from core.types import Action, Incident, Report, utcnow


class DeliveryLog(Protocol):
    """What the dispatcher needs of the store (argus.store.store.Store implements it)."""

    def record_delivery(
        self, *, key: str, incident_id: str | None, event: str, channel: str, ok: bool, attempts: int,
        status: int | None = None, error: str | None = None, detail: dict[str, Any] | None = None,
    ) -> Any: ...  # pragma: no cover

    def delivery_sent(self, key: str) -> bool: ...  # pragma: no cover

    def last_delivery_at(self, incident_id: str, channel: str) -> datetime | None: ...  # pragma: no cover


def delivery_key(incident_id: str, event: str, channel: str, detail: str = "") -> str:
    tail = hashlib.sha256(detail.encode("utf-8", "surrogatepass")).hexdigest()[:12] if detail else "-"
    return f"{incident_id}:{event}:{channel}:{tail}"


class TokenBucket:
    """At most `per_minute` in any minute: a burst of `burst`, then refilled at (per_minute - burst) a minute, so
    the burst plus a minute's refill never exceeds the platform's count for one minute."""

    def __init__(self, per_minute: float, now: float) -> None:
        self.burst = max(1, min(5, int(per_minute // 4)))
        self.rate_s = max(per_minute - self.burst, 0.1) / 60.0
        self.tokens = float(self.burst)
        self.at = now

    def take(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.rate_s)
        self.at = max(self.at, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _Pending:
    key: str
    message: Message
    earlier: tuple[_Pending, ...] = ()  # what this message tells too (recorded with it): a report, held changes

    @property
    def keys(self) -> list[str]:
        return [self.key, *(p.key for p in self.earlier)]


@dataclass
class _Held:
    """The changes of one flapping incident waiting for its renotify interval to end: the newest is told."""

    latest: _Pending
    due: float
    earlier: list[_Pending] = field(default_factory=list)

    def add(self, newer: _Pending) -> None:
        self.earlier.append(self.latest)
        self.latest = newer

    def release(self) -> _Pending:
        told = len(self.earlier) + 1
        message = self.latest.message.folding(told) if told > 1 else self.latest.message
        return _Pending(self.latest.key, message, tuple(self.earlier))


@dataclass
class _Opening:
    """A new incident's opening message, waiting (until `due` at the latest) for what it should tell too."""

    pending: _Pending
    due: float
    awaits: set[str] = field(default_factory=set)  # what has not come yet: "report_ready", "planned"


@dataclass
class _Lane:
    channel: Channel
    bucket: TokenBucket
    pending: list[_Pending] = field(default_factory=list)
    held: dict[str, _Held] = field(default_factory=dict)  # by incident id
    first: dict[str, _Opening] = field(default_factory=dict)  # openings waiting for their report and plan
    window_until: float = 0.0
    down_until: float = 0.0
    # The keys of every message parked in this lane (pending, first, held, or folded into one of those), so that
    # "already queued?" is one lookup: scanning the lane for each offer made a storm's thousands of waiting
    # openings cost their square.
    parked: set[str] = field(default_factory=set)
    # No opening in `first` is due before this (it may be earlier than the earliest left: then a pass finds none
    # due and sets it again), so a flush need not look through every waiting opening on each offer.
    first_due: float = float("inf")

    def queued(self, key: str) -> bool:
        return key in self.parked

    def park(self, p: _Pending) -> None:
        self.parked.add(p.key)

    def unpark(self, p: _Pending) -> None:
        """`p` and what was folded into it left the lane (sent, or dropped)."""
        self.parked.discard(p.key)
        self.parked.difference_update(e.key for e in p.earlier)

    def wait_first(self, incident_id: str, opening: _Opening) -> None:
        self.first[incident_id] = opening
        self.first_due = min(self.first_due, opening.due)

    def due_now(self, opening: _Opening, now: float) -> None:
        opening.due = now
        self.first_due = min(self.first_due, now)

    def drop_opening(self, incident_id: str) -> _Pending | None:
        """Take the incident's opening (and what was folded into it) out of the lane if it has not left yet."""
        dropped: _Pending | None
        if incident_id in self.first:
            dropped = self.first.pop(incident_id).pending
        else:
            dropped = self.opening_of(incident_id)
            if dropped is None:
                return None
            self.pending.remove(dropped)
        self.unpark(dropped)
        return dropped

    def opening_of(self, incident_id: str) -> _Pending | None:
        """The incident's opening message if it has not left yet: waiting for its report, or in a digest to come."""
        if incident_id in self.first:
            return self.first[incident_id].pending
        return next((p for p in self.pending if p.message.incident_id == incident_id
                     and p.message.event == "opened"), None)


class Dispatcher:
    """A Notifier for every configured IM channel and webhook. Thread-safe: the loop, the API and `start()`'s
    flusher may call it at once (one at a time inside)."""

    name = "im"

    def __init__(
        self,
        channels: Sequence[Channel],
        delivery_log: DeliveryLog,
        *,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        rate_per_minute: float = 60.0,
        group_window_s: float = 30.0,
        public_url: str | None = None,
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
        attempts: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        cooldown_s: float = 60.0,
        renotify_interval_s: float = 900.0,
        first_message_wait_s: float = 0.0,
        on_delivery: Callable[[str, str], None] | None = None,
    ) -> None:
        names = [c.name for c in channels]
        if len(set(names)) != len(names):
            raise ValueError(f"channel names must be unique, got {names}")
        self._log = delivery_log
        self._clock = clock
        self._sleep = sleep
        self.group_window_s = max(0.0, group_window_s)
        self.public_url = public_url.rstrip("/") if public_url else None
        self._client = client or httpx.Client(timeout=timeout_s)
        self._retry: dict[str, Any] = {"attempts": attempts, "backoff_s": backoff_s, "max_backoff_s": max_backoff_s}
        self.cooldown_s = cooldown_s
        self.renotify_interval_s = max(0.0, renotify_interval_s)
        self.first_message_wait_s = max(0.0, first_message_wait_s)
        self.on_delivery = on_delivery
        now = clock().timestamp()
        self._lanes = [_Lane(c, TokenBucket(min(rate_per_minute, c.per_minute), now)) for c in channels]
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the Notifier protocol and its siblings ------------------------------------------------------

    def notify(self, incident: Incident, event: str, *, awaits: frozenset[str] = frozenset()) -> bool:
        """`awaits`, for an opening: what it waits for before it leaves ("report_ready", "planned"), at most
        `first_message_wait_s`; with nothing named it waits that long for whatever comes."""
        return self._guarded(incident, event, lambda: self._offer_all(incident, event, report=None, approvals=(),
                                                                      awaits=awaits))

    def notify_planned(self, incident: Incident, actions: Sequence[Action] = ()) -> bool:
        """Remediation has planned the incident's steps (those waiting for a person came before, as
        notify_approval): an opening that waited for the plan tells them, one line each, and may leave once
        nothing else is awaited; one that has left already is followed by the plan on its own."""
        if actions:
            return self._guarded(incident, "planned", lambda: self._offer_all(
                incident, "planned", report=None, approvals=(), actions=tuple(actions)))

        def work() -> bool:
            now = self._clock().timestamp()
            for lane in self._lanes:
                opening = lane.first.get(incident.id)
                if opening is not None:
                    opening.awaits.discard("planned")
                    if not opening.awaits:
                        lane.due_now(opening, now)
                self._flush_lane(lane, now)
            return True
        return self._guarded(incident, "planned", work)

    def notify_step_finished(self, incident: Incident, action: Action) -> bool:
        """One of the incident's steps ended: what it did, or why not. After the opening, as any later news."""
        return self._guarded(incident, "step_finished", lambda: self._offer_all(
            incident, "step_finished", report=None, approvals=(), actions=(action,)))

    def notify_report(self, incident: Incident, report: Report) -> bool:
        return self._guarded(incident, "report_ready",
                             lambda: self._offer_all(incident, "report_ready", report=report, approvals=()))

    def notify_approval(
        self, incident: Incident, approvals: Sequence[ApprovalLink], report: Report | None = None
    ) -> bool:
        return self._guarded(incident, "approval_needed", lambda: self._offer_all(
            incident, "approval_needed", report=report, approvals=tuple(approvals)))

    def flush(self, *, force: bool = False) -> bool:
        """Send the digests that are due (all waiting ones with `force`, rate limits still holding)."""
        try:
            with self._lock:
                now = self._clock().timestamp()
                return all([self._flush_lane(lane, now, force=force) for lane in self._lanes])
        except Exception as exc:  # a bug here must not reach the loop or the flusher thread
            logger.opt(exception=exc).error("flushing notification digests failed")
            return False

    def pending(self) -> dict[str, int]:
        """Messages waiting per channel: in a digest to come, or a flapping incident's held until its interval ends."""
        with self._lock:
            return {lane.channel.name: len(lane.pending) + len(lane.held) + len(lane.first) for lane in self._lanes}

    def start(self, interval_s: float = 1.0) -> Dispatcher:
        """Flush due digests every `interval_s` on a daemon thread, until `close()`."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, args=(interval_s,), name="notify-flush", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None
        self.flush(force=True)
        held = {name: n for name, n in self.pending().items() if n}
        if held:  # the rate limit still holds them: say so rather than lose them quietly
            logger.warning("notifications still held back at shutdown and not sent: {}", held)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.flush()

    # ---- inside ----------------------------------------------------------------------------------------

    def _guarded(self, incident: Incident, event: str, work: Callable[[], bool]) -> bool:
        try:
            with self._lock:
                return work()
        except Exception as exc:  # the Notifier contract: never raise into the loop
            logger.bind(incident=incident.id).opt(exception=exc).error("notifying {} failed", event)
            return False

    def _offer_all(
        self, incident: Incident, event: str, *, report: Report | None, approvals: tuple[ApprovalLink, ...],
        awaits: frozenset[str] = frozenset(), actions: tuple[Action, ...] = (),
    ) -> bool:
        message = build_message(incident, event, report=report, approvals=approvals, public_url=self.public_url,
                                actions=actions)
        detail = _detail(incident, event, report, approvals, actions)
        now = self._clock().timestamp()
        lanes = self._lanes
        if event == "resolved" and incident.attrs.get("merged_into"):
            lanes = [lane for lane in lanes if not self._unsaid(lane, incident)]
        results = [self._offer(lane, delivery_key(incident.id, event, lane.channel.name, detail), message, now,
                               awaits) for lane in lanes]
        now = self._clock().timestamp()
        for lane in self._lanes:
            self._flush_lane(lane, now)
        return all(results)

    def _unsaid(self, lane: _Lane, incident: Incident) -> bool:
        """An incident merged into another before its opening left this lane: the group is told nothing of it (its
        fault is told under the incident it joined), neither its opening nor its end. False: the opening was sent,
        and the end is told as usual."""
        dropped = lane.drop_opening(incident.id)
        if dropped is None:
            return False
        logger.bind(incident=incident.id).info(
            "{} is not told about this incident: it was merged into {} before its opening left ({} message(s))",
            lane.channel.name, incident.attrs.get("merged_into"), len(dropped.keys))
        return True

    def _offer(self, lane: _Lane, key: str, message: Message, now: float,
               awaits: frozenset[str] = frozenset()) -> bool:
        if not lane.channel.wants(message.severity, message.category):
            return True
        if lane.queued(key) or self._sent(key):
            return True
        offered = _Pending(key, message)
        if message.event in ("report_ready", "approval_needed", "planned"):
            opening = lane.opening_of(message.incident_id)
            if opening is not None:  # the opening has not left yet: it tells this too
                opening.message = opening.message.telling(message)
                opening.earlier = (*opening.earlier, offered)
                lane.park(offered)
                waiting = lane.first.get(message.incident_id)
                if waiting is not None and waiting.awaits:
                    waiting.awaits.discard(message.event)
                    if not waiting.awaits:  # all it waited for is in: it leaves with this flush
                        lane.due_now(waiting, now)
                return True
        if message.incident_id in lane.first:  # anything else about it (an update, the resolve) must come after it
            self._offer_now(lane, lane.first.pop(message.incident_id).pending, now)
        if message.event == "opened" and self.first_message_wait_s > 0 and not message.reopened:
            lane.wait_first(message.incident_id, _Opening(offered, now + self.first_message_wait_s, set(awaits)))
            lane.park(offered)
            return True
        if _flapping(message):
            held = lane.held.get(message.incident_id)
            if held is not None:
                held.add(offered)
                lane.park(offered)
                return True
            quiet_until = self._quiet_until(lane, message.incident_id)
            if quiet_until is not None and now < quiet_until:
                lane.held[message.incident_id] = _Held(offered, due=quiet_until)
                lane.park(offered)
                logger.bind(incident=message.incident_id).info(
                    "{} was told about this flapping incident less than {:.0f} s ago: its {} waits and is folded "
                    "into one message then", lane.channel.name, self.renotify_interval_s, message.event)
                return True
        return self._offer_now(lane, offered, now)

    def _offer_now(self, lane: _Lane, offered: _Pending, now: float) -> bool:
        message = offered.message
        grouping = message.event == "opened" and (now < lane.window_until or bool(lane.pending))
        if now < lane.down_until or grouping or not lane.bucket.take(now):
            lane.pending.append(offered)
            lane.park(offered)
            return True
        ok = self._send(lane, message, [offered])
        if message.event == "opened":
            lane.window_until = now + self.group_window_s
        return ok

    def _quiet_until(self, lane: _Lane, incident_id: str) -> float | None:
        """When the channel may be told about the incident again: its renotify interval after the last message."""
        if self.renotify_interval_s <= 0:
            return None
        try:
            last = self._log.last_delivery_at(incident_id, lane.channel.name)
        except Exception as exc:  # unknown: rather a repeat than silence
            logger.bind(incident=incident_id).opt(exception=exc).error(
                "could not read when {} was last told about this incident", lane.channel.name)
            return None
        return None if last is None else last.timestamp() + self.renotify_interval_s

    def _release_held(self, lane: _Lane, now: float, *, force: bool) -> bool:
        """Offer each flapping incident's newest change whose interval has ended (all with `force`)."""
        results = []
        for incident_id, held in list(lane.held.items()):
            if force or now >= held.due:
                del lane.held[incident_id]
                results.append(self._offer_now(lane, held.release(), now))
        return all(results)

    def _release_first(self, lane: _Lane, now: float, *, force: bool) -> bool:
        """Offer each opening whose wait for its report has ended (all with `force`)."""
        if not force and now < lane.first_due:
            return True
        results = []
        for incident_id, opening in list(lane.first.items()):
            if force or now >= opening.due:
                del lane.first[incident_id]
                results.append(self._offer_now(lane, opening.pending, now))
        lane.first_due = min((o.due for o in lane.first.values()), default=float("inf"))
        return all(results)

    def _flush_lane(self, lane: _Lane, now: float, *, force: bool = False) -> bool:
        first = self._release_first(lane, now, force=force) if lane.first else True
        released = (self._release_held(lane, now, force=force) if lane.held else True) and first
        return self._flush_pending(lane, now, force=force) and released

    def _flush_pending(self, lane: _Lane, now: float, *, force: bool = False) -> bool:
        if not lane.pending or now < lane.down_until:
            return True
        if not force and now < lane.window_until:
            return True
        if not lane.bucket.take(now):
            return True  # still held back; it stays pending and grows
        batch, lane.pending = lane.pending, []
        item: Item = batch[0].message if len(batch) == 1 else digest_of([p.message for p in batch], self.public_url)
        ok = self._send(lane, item, batch)
        lane.window_until = now + self.group_window_s
        return ok

    def _send(self, lane: _Lane, item: Item, batch: list[_Pending]) -> bool:
        channel = lane.channel
        for p in batch:  # out of the lane from here, whatever the outcome (a failed digest is not sent again)
            lane.unpark(p)
        outcome = deliver(channel, item, client=self._client, clock=self._clock, sleep=self._sleep, **self._retry)
        if not outcome.ok:
            lane.down_until = self._clock().timestamp() + self.cooldown_s
        digest = f"{len(batch)} grouped" if len(batch) > 1 else None
        for p in batch:
            for earlier in p.earlier:  # a flapping incident's changes this message told in one, in their order
                self._record(earlier, channel.name, outcome, digest, folded_into=p.key)
            self._record(p, channel.name, outcome, digest)
        self._tell(channel.name, "sent" if outcome.ok else "failed")
        ids = batch[0].message.incident_id if len(batch) == 1 else f"{len(batch)} incidents"
        if outcome.ok:
            logger.info("{} told about {} ({} attempt(s))", channel.name, ids, outcome.attempts)
        else:
            logger.warning("{} could not be told about {} after {} attempt(s): {}", channel.name, ids,
                           outcome.attempts, outcome.error)
        return outcome.ok

    def _record(self, p: _Pending, channel: str, outcome: Outcome, digest: str | None,
                folded_into: str | None = None) -> None:
        detail: dict[str, Any] = {"kind": "digest" if digest else "message"}
        if digest:
            detail["grouped"] = digest
        if folded_into:
            detail["folded_into"] = folded_into
        elif p.message.folded > 1:
            detail["folded"] = p.message.folded
        if outcome.code:
            detail["platform_code"] = outcome.code
        try:
            self._log.record_delivery(
                key=p.key, incident_id=p.message.incident_id, event=p.message.event, channel=channel, ok=outcome.ok,
                attempts=outcome.attempts, status=outcome.status, error=outcome.error, detail=detail,
            )
        except Exception as exc:  # the store being down must not stop notifications
            logger.bind(incident=p.message.incident_id).opt(exception=exc).error(
                "could not record the delivery {} to {}", p.key, channel)

    def _tell(self, channel: str, outcome: str) -> None:
        if self.on_delivery is None:
            return
        try:
            self.on_delivery(channel, outcome)
        except Exception as exc:  # metrics bookkeeping must not stop notifications
            logger.opt(exception=exc).error("the delivery hook failed for {}", channel)

    def _sent(self, key: str) -> bool:
        try:
            return self._log.delivery_sent(key)
        except Exception as exc:  # unknown: rather a repeat than silence
            logger.opt(exception=exc).error("could not check whether {} was sent", key)
            return False


def _flapping(message: Message) -> bool:
    """A change of an incident that was reopened: what the renotify interval limits (an opening, a report or an
    approval request is always told)."""
    return message.reopened > 0 and message.event in ("updated", "resolved")


def _detail(incident: Incident, event: str, report: Report | None, approvals: tuple[ApprovalLink, ...],
            actions: tuple[Action, ...] = ()) -> str:
    """What makes two events of one kind different notifications."""
    if event == "updated":  # each reopening is news of its own, with the same state and severity as the last
        again = f"/reopened-{incident.reopened}" if incident.reopened else ""
        return f"{incident.state.value}/{incident.severity.value}{again}"
    if event == "resolved":
        return incident.resolved_at.isoformat() if incident.resolved_at else ""
    if event == "report_ready":
        return report.id if report is not None else ""
    if event == "approval_needed":
        return ",".join(sorted(a.action_id for a in approvals))
    if event in ("planned", "step_finished"):
        return ",".join(sorted(a.id for a in actions))
    return ""
