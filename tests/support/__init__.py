"""Fakes the unit tests share: a clock moved by hand, Incident / Finding builders with plain defaults, a
subscriber that records incident events, and a collector that hands the loop what the test gives it.

Nothing here starts a process or imports Ray (the real-stack helpers are tests/helpers.py and
tests/node_helpers.py). A builder's defaults are a job's failure at T0; a test names what it cares about.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from core.types import Category, Evidence, Finding, Incident, IncidentState, Severity, Signal, Subject, SubjectKind

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    """A clock the test moves by hand, so time-based logic is deterministic without sleeping."""

    def __init__(self, now: datetime = T0) -> None:
        self.start = self.now = now

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def at(self, seconds: float) -> datetime:
        """Set the clock `seconds` past where it started."""
        self.now = self.start + timedelta(seconds=seconds)
        return self.now


def job(job_id: str = "job-1") -> Subject:
    return Subject(kind=SubjectKind.JOB, id=job_id)


def make_incident(**fields: Any) -> Incident:
    """An open, critical incident about a job that failed at T0; `fields` replace any default."""
    at = fields.get("first_seen", T0)
    defaults: dict[str, Any] = dict(
        id="inc-000000000001", fingerprint="f", category=Category.UNKNOWN, subject=job(), state=IncidentState.OPEN,
        severity=Severity.CRITICAL, summary="job job-1 failed", reason="JobFailed", first_seen=at, last_seen=at,
        detected_at=at,
    )
    return Incident(**{**defaults, **fields})


def make_finding(text: str = "job failed", *, source: str = "ray.jobs", **fields: Any) -> Finding:
    """A critical finding about a job at T0 whose one evidence line is `text` (also its summary)."""
    defaults: dict[str, Any] = dict(
        category=Category.UNKNOWN, reason="JobFailed", subject=job(), summary=text, severity=Severity.CRITICAL,
        evidence=(Evidence(source=source, text=text),), first_seen=T0,
    )
    return Finding(**{**defaults, **fields})


class RecordingSubscriber:
    """An incident-event subscriber that keeps what it receives, in order (read it after `bus.drain()`)."""

    name = "recorder"

    def __init__(self) -> None:
        self.events: list[Any] = []

    def receive(self, event: Any) -> None:
        self.events.append(event)


class Feed:
    """A collector over a list the test fills (`feed.batch = [...]`): the next tick collects it, once."""

    name = "feed"

    def __init__(self) -> None:
        self.batch: list[Signal] = []

    def collect(self) -> list[Signal]:
        batch, self.batch = self.batch, []
        return batch


def read_as_the_loop_does(collector: Any) -> list[Any]:
    """A collector's `collect()` and then its `commit()`, as argus.pipeline does once a tick's findings are filed:
    what a test of restarts needs before a new collector reads the saved offsets back."""
    signals = collector.collect()
    collector.commit()
    return list(signals)
