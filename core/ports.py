"""Extension points: one verb each. Implementations are registered in one explicit list in `argus/`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from core.types import Finding, Incident, Recovery, Signal


@runtime_checkable
class Collector(Protocol):
    """Observes the outside world. Raises SourceUnavailable when its source cannot be reached."""

    name: str

    def collect(self) -> list[Signal]: ...


@runtime_checkable
class Detector(Protocol):
    """Turns signals into findings. May keep state between calls (stall, idle, lost node)."""

    name: str

    def detect(self, signals: Sequence[Signal]) -> list[Finding]: ...


@runtime_checkable
class Recovering(Protocol):
    """A detector that also says when a fault it found has ended. The loop asks it after each `detect()` it ran,
    so a detector blind this tick (a source it needs is down) claims no recovery either."""

    name: str

    def recoveries(self) -> list[Recovery]: ...


@runtime_checkable
class Notifier(Protocol):
    """Tells people or agents about an incident event. Returns whether delivery succeeded; never raises."""

    name: str

    def notify(self, incident: Incident, event: str) -> bool: ...
