"""Waiting is visible: a job that waits for a place longer than `alert_s` (Settings.pending_alert_s) is a finding
(category unschedulable, a warning) that says what it waits for and how much of it the cluster has free.

Two waits per job, each its own finding (fingerprint: the category, the job, and "driver" or "placement_groups"):
- driver: the job is PENDING in Ray: its driver has not started, as no node offers what its entrypoint asks for
  (entrypoint resources / num_cpus / num_gpus / memory and label selector, as its supervisor actor carries them:
  the job record the APIs give lists neither, collectors/ray_state.py). Counted from Ray's start_time, when Ray
  accepted the submission.
- placement_groups: the job is RUNNING and created placement groups Ray has not placed (PENDING, or RESCHEDULING
  after a node loss): its bundles ("2 bundles of {GPU: 8}"), strategy and bundle label selectors. Counted from the
  earliest creation request of those groups; the wait goes on while any group of the job waits.
What the cluster has free is per alive node, from Ray's autoscaler report ("largest free on one node: 4 GPU; 3
alive nodes with GPU: 8/8/4 free"); the words are core.waits', the same as the job controller's timeout reason.

Inputs (signals from collectors/ray_state.py, keys in core.signal_keys): JOB_STATE (status, start_time,
entrypoint_resources, label_selector, waiting_groups) and NODE_STATE (state, node_ip, labels, resources_total,
resources_available). A tick without any NODE_STATE signal (Ray's state not polled) changes nothing, and the loop
skips this detector while ray_state is down (argus/wiring.py `needs`). A RUNNING job whose groups were not read
this poll (`waiting_groups` None) neither starts nor ends a groups wait.

One finding per wait: it is reported once, when it passes `alert_s`, never again while it goes on. History is not
news: only a wait going on now is judged, so a job that waited long ago and then ran or ended opens nothing. A
wait that began before Argus started and still goes on is news, reported at once: Ray's times say how long it has
waited.

Recovery (`recoveries()`): a reported wait ends when the job's driver starts (RUNNING), no group of it waits any
more (placed, or removed: a stopped job's groups are removed a moment before Ray marks it STOPPED; the reason says
which, from the job's placed group ids), the job ends (FAILED, STOPPED, SUCCEEDED), or Ray lists it no more; its
incident may close. With a `memory`
(core.ports.DetectorMemory) the reported waits survive an Argus restart, so one that ended while Argus was down
closes its incident on the first poll after; unreported waits need no memory (their start is Ray's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from loguru import logger

from core import signal_keys as keys
from core.errors import ConfigError
from core.ports import DetectorMemory
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
    fingerprint_of,
    utcnow,
)
from core.waits import NodeFree, amounts, bundles_text, driver_advice, driver_wants, free_text, selector_text
from detectors.memory import (
    SavedState,
    StateUnreadable,
    job_key,
    keep_newest,
    read_str,
    read_time,
    read_version,
)
from detectors.timestamps import parse_iso

DRIVER = "driver"
GROUPS = "placement_groups"
REASONS = {DRIVER: "JobPendingTooLong", GROUPS: "PlacementGroupsUnplaced"}
STATE_VERSION = 1
_MAX_EVIDENCE_NODES = 10
_MAX_GROUPS_SHOWN = 5
_MAX_REMEMBERED_GROUPS = 50
GROUPS_ACTION = (
    "Free what the groups ask for (stop jobs holding it idle), add nodes that have it, or resubmit the job with "
    "bundles that fit one node (fewer GPUs per bundle, fewer replicas); `ray status` lists the demand Ray cannot "
    "place. Stop the job (`ray job stop {job}`) if it is no longer wanted: it holds whatever it has placed so far."
)


@dataclass
class _Wait:
    job: str  # the job's subject id (submission id, else Ray job id)
    kind: str  # DRIVER or GROUPS
    since: datetime
    fingerprint: str | None = None  # set once reported: its incident's, for the recovery
    groups: set[str] = field(default_factory=set)  # GROUPS: the ids of every group seen waiting in it


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class WaitingJobDetector:
    name = "waiting"

    def __init__(self, *, alert_s: float = 300.0, max_remembered: int = 10_000,
                 memory: DetectorMemory | None = None, clock: Callable[[], datetime] = utcnow) -> None:
        """`memory`: where reported waits are kept across restarts (loaded here, saved after each poll); None
        keeps them in this process only."""
        if alert_s <= 0:
            raise ConfigError(f"waiting alert_s={alert_s} must be > 0", hint="e.g. pending_alert_s: 300")
        self.alert = timedelta(seconds=alert_s)
        self.max_remembered = max_remembered
        self._clock = clock
        self._waits: dict[str, _Wait] = {}  # "<job>|<kind>" -> the wait going on
        self._recovered: list[Recovery] = []
        self._saved = SavedState(memory, self.name)
        self._recall()

    # -- the verbs ---------------------------------------------------------------------------------------

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        node_signals = [s for s in signals if s.kind is SignalKind.NODE_STATE]
        if not node_signals:
            return []  # Ray's state was not polled this tick: neither start nor end a wait
        now = self._clock()
        nodes = [_node_free(s) for s in node_signals if s.attrs.get(keys.STATE) == "ALIVE"]
        current: dict[str, tuple[Signal, str, datetime]] = {}
        unknown: set[str] = set()
        statuses: dict[str, str | None] = {}
        placed: dict[str, set[str]] = {}
        for job in signals:
            if job.kind is not SignalKind.JOB_STATE or job.subject.kind is not SubjectKind.JOB:
                continue
            status = job.attrs.get(keys.STATUS)
            statuses[job.subject.id] = status
            placed[job.subject.id] = set(job.attrs.get(keys.PLACED_GROUPS) or [])
            if status == "PENDING":
                since = parse_iso(job.attrs.get(keys.START_TIME)) or job.observed_at
                current[_key(job.subject.id, DRIVER)] = (job, DRIVER, since)
            elif status == "RUNNING":
                groups = job.attrs.get(keys.WAITING_GROUPS)
                if groups is None:
                    unknown.add(_key(job.subject.id, GROUPS))
                elif groups:
                    starts = [t for g in groups if (t := parse_iso(g.get(keys.SINCE))) is not None]
                    current[_key(job.subject.id, GROUPS)] = (job, GROUPS, min(starts, default=job.observed_at))

        findings = []
        for key, (job, kind, since) in current.items():
            wait = self._waits.get(key)
            if wait is None:
                wait = self._waits[key] = _Wait(job.subject.id, kind, since)
            if kind == GROUPS:
                wait.groups |= {str(g.get(keys.GROUP_ID)) for g in job.attrs.get(keys.WAITING_GROUPS) or []}
            if wait.fingerprint is None and now - wait.since >= self.alert:
                finding = self._finding(job, wait, nodes, now)
                wait.fingerprint = finding.fingerprint
                findings.append(finding)
        for key in [k for k in self._waits if k not in current and k not in unknown]:
            wait = self._waits.pop(key)
            if wait.fingerprint is not None:
                self._recovered.append(Recovery(
                    fingerprint=wait.fingerprint, detector=self.name, observed_at=now,
                    reason=_ended(wait, statuses.get(wait.job, "gone"), placed.get(wait.job, set()), now)))
        self._remember()
        return findings

    def recoveries(self) -> list[Recovery]:
        """Reported waits that ended since the last call (see the module docstring)."""
        done, self._recovered = self._recovered, []
        return done

    # -- memory across restarts ----------------------------------------------------------------------------

    def _recall(self) -> None:
        readable = []
        for key, value in self._saved.load().items():
            try:
                read_version(value, STATE_VERSION)
                ids = value.get("groups", [])
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                    raise StateUnreadable(f"groups is {ids!r}, not a list of ids")
                wait = _Wait(job=read_str(value.get("job"), "job"), kind=read_str(value.get("kind"), "kind"),
                             since=read_time(value.get("since"), "since"),
                             fingerprint=read_str(value.get("fingerprint"), "fingerprint"), groups=set(ids))
                if wait.kind not in REASONS:
                    raise StateUnreadable(f"kind {wait.kind!r} is neither {DRIVER} nor {GROUPS}")
            except StateUnreadable as err:
                logger.warning("waiting detector: the remembered wait {} is unreadable ({}): forgotten", key, err)
                self._saved.forget_loaded(key)
                continue
            readable.append((key, _key(wait.job, wait.kind), wait))
        for ident, wait in keep_newest(self._saved, readable, self.max_remembered, lambda w: w.since):
            self._waits[ident] = wait
        if self._waits:
            logger.info("waiting detector remembers {} reported wait(s) from before the restart", len(self._waits))

    def _remember(self) -> None:
        """Save the reported waits as they are after this poll (only what changed is written); forget ended ones."""
        values: dict[str, dict[str, Any] | None] = {key: None for key in self._saved.keys()}
        for ident, wait in self._waits.items():
            if wait.fingerprint is not None:
                values[job_key(ident)] = {"v": STATE_VERSION, "job": wait.job, "kind": wait.kind,
                                          "since": wait.since.isoformat(), "fingerprint": wait.fingerprint,
                                          "groups": sorted(wait.groups)[:_MAX_REMEMBERED_GROUPS]}
        self._saved.save(values)

    # -- the finding -------------------------------------------------------------------------------------------

    def _finding(self, job: Signal, wait: _Wait, nodes: list[NodeFree], now: datetime) -> Finding:
        attrs = job.attrs
        waited = (now - wait.since).total_seconds()
        subject = Subject(kind=SubjectKind.JOB, id=job.subject.id, name=job.subject.name)
        evidence = [Evidence(source=job.source, at=wait.since, text=(
            f"job {job.subject.id} (ray job {attrs.get(keys.JOB_ID)}) status={attrs.get(keys.STATUS)} since "
            f"{wait.since.isoformat()}, entrypoint={str(attrs.get(keys.ENTRYPOINT) or '')[:200]}"))]
        details: dict[str, Any]
        if wait.kind == DRIVER:
            known = attrs.get(keys.ENTRYPOINT_RESOURCES) is not None or attrs.get(keys.LABEL_SELECTOR) is not None
            demand = dict(attrs.get(keys.ENTRYPOINT_RESOURCES) or {})
            selector = dict(attrs.get(keys.LABEL_SELECTOR) or {})
            cluster = free_text(demand, nodes, selector)
            wants = driver_wants(demand, selector) if known else "what it asks for (unknown: Ray did not list it)"
            summary = (f"job {job.subject.id} has been PENDING for {_duration(waited)}: its driver has not started, "
                       f"as no node offered {wants}. Cluster: {cluster}")
            action = f"{driver_advice(selector)}; or stop it (`ray job stop {job.subject.id}`) if no longer wanted"
            evidence.append(Evidence(source=job.source, text=(
                f"its driver asks for resources {amounts(demand) or 'none'}, labels {selector_text(selector) or 'any'}"
                if known else "what its driver asks for is unknown: Ray did not list its supervisor actor")))
            details = {"demand": attrs.get(keys.ENTRYPOINT_RESOURCES),
                       keys.LABEL_SELECTOR: attrs.get(keys.LABEL_SELECTOR)}
        else:
            groups = list(attrs.get(keys.WAITING_GROUPS) or [])
            demand = {}
            for group in groups:
                for bundle in group.get(keys.BUNDLES) or []:
                    demand.update({k: v for k, v in bundle.items() if k not in demand})
            cluster = free_text(demand, nodes)
            shown = "; ".join(_group_text(g) for g in groups[:_MAX_GROUPS_SHOWN])
            more = f"; and {len(groups) - _MAX_GROUPS_SHOWN} more" if len(groups) > _MAX_GROUPS_SHOWN else ""
            summary = (f"job {job.subject.id} is RUNNING but {len(groups)} placement group"
                       f"{'s have' if len(groups) != 1 else ' has'} waited {_duration(waited)} for a place: "
                       f"{shown}{more}. Cluster: {cluster}")
            action = GROUPS_ACTION.format(job=job.subject.id)
            evidence += [Evidence(source="ray.placement_groups", text=_group_text(g), at=parse_iso(g.get(keys.SINCE)))
                         for g in groups[:_MAX_GROUPS_SHOWN]]
            details = {keys.WAITING_GROUPS: groups}
        evidence += [Evidence(source="ray.autoscaler", text=f"node {n.name}: free "
                              f"{amounts({k: (n.free or {}).get(k, 0.0) for k in demand if k in n.total}) or 'none'}"
                              f" of {amounts({k: n.total[k] for k in demand if k in n.total}) or 'none of it'}")
                     for n in nodes[:_MAX_EVIDENCE_NODES] if n.free is not None]
        return Finding(
            category=Category.UNSCHEDULABLE,
            reason=REASONS[wait.kind],
            subject=subject,
            summary=summary,
            severity=Severity.WARNING,
            evidence=tuple(evidence),
            first_seen=wait.since,
            detected_at=now,
            recommended_action=action,
            fingerprint=fingerprint_of(Category.UNSCHEDULABLE, subject, wait.kind),
            attrs={
                keys.SUBMISSION_ID: attrs.get(keys.SUBMISSION_ID),
                keys.JOB_ID: attrs.get(keys.JOB_ID),
                "wait": wait.kind,
                "waiting_since": wait.since.isoformat(),
                "waited_s": round(waited, 1),
                "pending_alert_s": self.alert.total_seconds(),
                "cluster_free": cluster,
                "free_by_node": {n.name: dict(n.free) for n in nodes if n.free is not None},
                **details,
            },
        )


def _key(job: str, kind: str) -> str:
    return f"{job}|{kind}"


def _node_free(signal: Signal) -> NodeFree:
    attrs = signal.attrs
    free = attrs.get(keys.RESOURCES_AVAILABLE)
    return NodeFree(
        name=str(attrs.get(keys.NODE_IP) or signal.subject.name or signal.subject.id),
        labels={str(k): str(v) for k, v in (attrs.get(keys.LABELS) or {}).items()},
        total=dict(attrs.get(keys.RESOURCES_TOTAL) or {}),
        free=dict(free) if isinstance(free, dict) else None,
    )


def _group_text(group: dict[str, Any]) -> str:
    """"group 3f2a1c9e (PENDING, INFEASIBLE): 2 bundles of {GPU: 8}, strategy STRICT_SPREAD"."""
    ident = group.get(keys.GROUP_NAME) or str(group.get(keys.GROUP_ID) or "?")[:12]
    why = ", ".join(str(w) for w in (group.get(keys.STATE), group.get(keys.SCHEDULING_STATE)) if w)
    text = f"group {ident}{f' ({why})' if why else ''}: {bundles_text(group.get(keys.BUNDLES) or [])}"
    if group.get(keys.STRATEGY):
        text += f", strategy {group[keys.STRATEGY]}"
    selectors = [s for s in group.get(keys.BUNDLE_SELECTORS) or [] if s]
    if selectors:
        distinct = list(dict.fromkeys(selector_text(s) for s in selectors))
        text += f", label selectors {'; '.join(distinct)}"
    return text


def _ended(wait: _Wait, status: str | None, placed: set[str], now: datetime) -> str:
    """Why a reported wait is over, for the resolve message; `placed`: the job's placed group ids now."""
    waited = _duration((now - wait.since).total_seconds())
    if status == "gone":
        return f"job {wait.job} is no longer listed by Ray (waited {waited})"
    if wait.kind == DRIVER:
        if status == "RUNNING":
            return f"job {wait.job} is RUNNING: its driver started after waiting {waited}"
        return f"job {wait.job} ended ({status}) after waiting {waited} for its driver to start"
    if status != "RUNNING":
        return f"job {wait.job} ended ({status}); its placement groups had waited {waited}"
    got = len(wait.groups & placed)
    if got == len(wait.groups):
        return f"every placement group of job {wait.job} is placed (the first waited {waited})"
    gone = len(wait.groups) - got
    if not got:
        return (f"job {wait.job} removed the placement group{'s' if gone != 1 else ''} it waited on, unplaced "
                f"(the first waited {waited}; a job being stopped removes its groups first)")
    return (f"no placement group of job {wait.job} waits any more: {got} placed, {gone} removed unplaced (the first "
            f"waited {waited})")
