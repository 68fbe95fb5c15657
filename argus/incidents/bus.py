"""Incident events to an explicit list of subscribers, each on a worker of its own, off the caller's thread.

Why a worker per subscriber: telling people is slow and can hang (a webhook that never answers costs its
retries and timeouts, about 31 s per URL with the defaults), planning remediation reads the store, reports
queue LLM passes. None of that may delay the detection tick that published the event, nor one subscriber hold
back another. So `publish` only puts the event in each subscriber's mailbox and returns; each mailbox keeps its
events in order, and a subscriber that raises is logged with its name and keeps receiving.

A mailbox is bounded: a subscriber that stays stuck while thousands of incidents open loses the newest events
beyond `capacity`, each loss logged and counted in `dropped`, rather than growing without bound. `drain()` waits
until every event published so far has been handled (tests, shutdown); `close()` drains and stops the workers.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from loguru import logger

from argus.incidents.events import IncidentEvent
from core.readers import Readers

DEFAULT_CAPACITY = 10_000


@runtime_checkable
class Subscriber(Protocol):
    """Reacts to incident events. `receive` runs on the subscriber's own worker; it may be slow, not fatal."""

    name: str

    def receive(self, event: IncidentEvent) -> None: ...


class EventSink(Protocol):
    """What a producer of events needs: the bus, or anything that records what it is given."""

    def publish(self, event: IncidentEvent) -> None: ...


@dataclass
class _Mailbox:
    subscriber: Subscriber
    events: queue.Queue[IncidentEvent | None]
    thread: threading.Thread | None = None
    dropped: int = 0
    failed: int = 0
    done: threading.Condition = field(default_factory=threading.Condition)


class EventBus:
    """`start(subscribers)` once with the whole list; `publish` from any thread; `close()` on the way out."""

    def __init__(self, *, capacity: int = DEFAULT_CAPACITY, readers: Readers | None = None) -> None:
        """`readers`: the API's requests being answered; each subscriber gives way to them between events
        (core/readers.py)."""
        self.capacity = max(1, capacity)
        self.readers = readers
        self._mailboxes: list[_Mailbox] = []
        self._early: list[IncidentEvent] = []  # published before start(): handed over when it runs
        self._lock = threading.Lock()
        self._started = False

    def start(self, subscribers: Sequence[Subscriber]) -> EventBus:
        names = [s.name for s in subscribers]
        if len(set(names)) != len(names):
            raise ValueError(f"subscriber names must be unique, got {names}")
        with self._lock:
            if self._started:
                raise RuntimeError("the event bus is started once, with its whole list of subscribers")
            self._started = True
            for subscriber in subscribers:
                box = _Mailbox(subscriber, queue.Queue(maxsize=self.capacity))
                box.thread = threading.Thread(target=self._work, args=(box,), name=f"argus-events-{subscriber.name}",
                                              daemon=True)
                box.thread.start()
                self._mailboxes.append(box)
            early, self._early = self._early, []
        for event in early:
            self.publish(event)
        logger.debug("incident events go to: {}", ", ".join(names) or "nobody")
        return self

    @property
    def subscribers(self) -> list[str]:
        return [box.subscriber.name for box in self._mailboxes]

    def publish(self, event: IncidentEvent) -> None:
        """Hand the event to every subscriber's mailbox; never blocks and never raises."""
        with self._lock:
            if not self._started:
                if len(self._early) < self.capacity:
                    self._early.append(event)
                return
            boxes = list(self._mailboxes)
        for box in boxes:
            try:
                box.events.put_nowait(event)
            except queue.Full:
                box.dropped += 1
                logger.bind(incident=event.incident.id).error(
                    "subscriber {} has {} events waiting and is not keeping up: {} dropped ({} so far)",
                    box.subscriber.name, self.capacity, event.describe(), box.dropped)

    def pending(self) -> dict[str, int]:
        """Events published and not yet handled, per subscriber."""
        return {box.subscriber.name: box.events.unfinished_tasks for box in self._mailboxes}

    def dropped(self) -> dict[str, int]:
        return {box.subscriber.name: box.dropped for box in self._mailboxes}

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every event published so far has been handled; False if some are still waiting."""
        deadline = time.monotonic() + timeout_s
        for box in self._mailboxes:
            with box.done:
                while box.events.unfinished_tasks:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    box.done.wait(min(left, 0.5))
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Handle what is waiting (up to `timeout_s`), then stop the workers; events published later are lost."""
        if not self.drain(timeout_s):
            logger.warning("incident events still waiting at shutdown, not handled: {}",
                           {k: v for k, v in self.pending().items() if v})
        for box in self._mailboxes:
            try:
                box.events.put_nowait(None)
            except queue.Full:
                pass  # a stuck worker: it is a daemon thread and ends with the process
        for box in self._mailboxes:
            if box.thread is not None:
                box.thread.join(timeout=1.0)

    def _work(self, box: _Mailbox) -> None:
        while True:
            event = box.events.get()
            try:
                if event is None:
                    return
                if self.readers is not None:
                    self.readers.give_way()
                box.subscriber.receive(event)
            except Exception as exc:  # one subscriber's bug must not silence it for the next event
                box.failed += 1
                logger.bind(incident=event.incident.id if event else None).opt(exception=exc).error(
                    "subscriber {} failed on {}", box.subscriber.name, event.describe() if event else "stop")
            finally:
                box.events.task_done()
                with box.done:
                    box.done.notify_all()

