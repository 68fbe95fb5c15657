"""Extension points: one verb each. Implementations are registered in one explicit list in `argus/`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from core.types import Action, Finding, Incident, Recovery, Signal


@runtime_checkable
class Collector(Protocol):
    """Observes the outside world. Raises SourceUnavailable when its source cannot be reached."""

    name: str

    def collect(self) -> list[Signal]: ...


@runtime_checkable
class Committing(Protocol):
    """A collector whose reading moves a saved position (log offsets). The loop calls `commit()` once the tick's
    findings are filed, so a process killed between reading and filing reads those lines again after its restart
    (at least once; a repeat folds into its incident), never skips them."""

    name: str

    def commit(self) -> None: ...


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
class DetectorMemory(Protocol):
    """Where a stateful detector keeps what its verdict needs, so an Argus restart does not reset it (a job
    already hung before the restart is still found within its usual threshold). Per detector name: one JSON
    object per key (a job's submission id). The detector owns the objects' shape and must survive any object
    it reads (written by another version, or edited by hand): it starts that key fresh.

    Implementations are bounded: they may drop the least recently saved keys of a detector past a cap.
    """

    def load_all(self, detector: str) -> dict[str, dict[str, Any]]:
        """Every object saved for `detector`, by key. Raises StoreError when the store cannot be read."""
        ...

    def save(self, detector: str, changed: Mapping[str, dict[str, Any] | None]) -> None:
        """Replace the objects of `changed`'s keys, in one go; None forgets a key. Raises InputError for an
        object that is not JSON or too large (nothing of the call is saved) and StoreError when the store is
        down."""
        ...


@runtime_checkable
class Notifier(Protocol):
    """Tells people or agents about an incident event. Returns whether delivery succeeded; never raises. `actions`:
    the remediation steps the event is about (a step that ended)."""

    name: str

    def notify(self, incident: Incident, event: str, *, actions: Sequence[Action] = ()) -> bool: ...
