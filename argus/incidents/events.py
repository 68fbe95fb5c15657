"""What happens to an incident, as one value that every subscriber receives.

The kinds are the moments people and tools care about: an incident was opened, its state changed (updated), it
was resolved, its report is ready, remediation planned its steps, some of them wait for a person, or one ended.
Each event carries the incident as it was at that moment, so a subscriber that runs later still tells the truth
about that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from core.types import Action, Finding, Incident, IncidentState, Report, Severity


class EventKind(str, Enum):
    OPENED = "opened"
    UPDATED = "updated"
    RESOLVED = "resolved"
    REPORT_READY = "report_ready"
    APPROVAL_NEEDED = "approval_needed"
    PLANNED = "planned"  # remediation planned the incident's steps (after APPROVAL_NEEDED when some wait)
    STEP_FINISHED = "step_finished"  # one of those steps ended: succeeded, failed, rejected, skipped or cancelled


# The kinds that are a change of the incident itself: what webhooks and IM groups hear about it.
LIFECYCLE = frozenset({EventKind.OPENED, EventKind.UPDATED, EventKind.RESOLVED})


@dataclass(frozen=True)
class IncidentEvent:
    kind: EventKind
    incident: Incident
    finding: Finding | None = None  # OPENED: the finding that opened it; a reopening UPDATED: the one that reopened it
    report: Report | None = None  # REPORT_READY
    # APPROVAL_NEEDED: the steps waiting for a decision; PLANNED: all planned; STEP_FINISHED: the one that ended
    actions: tuple[Action, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)  # who changed it and why, for the record

    @classmethod
    def opened(cls, incident: Incident, finding: Finding | None = None) -> IncidentEvent:
        return cls(EventKind.OPENED, incident, finding=finding)

    @classmethod
    def state_changed(cls, incident: Incident, *, by: str = "", reason: str = "",
                      severity_was: Severity | None = None) -> IncidentEvent:
        """RESOLVED when the incident now is, UPDATED otherwise (mitigating, reopened, severity). `severity_was`:
        the severity the same change lowered (the incident carries the new one)."""
        kind = EventKind.RESOLVED if incident.state is IncidentState.RESOLVED else EventKind.UPDATED
        was = severity_was.value if severity_was is not None else ""
        detail = {k: v for k, v in (("by", by), ("reason", reason), ("severity_was", was)) if v}
        return cls(kind, incident, detail=detail)

    @classmethod
    def reopened(cls, incident: Incident, finding: Finding, *, by: str, reason: str) -> IncidentEvent:
        """UPDATED: the fault of a resolved incident came back and reopened it; detail "reopened" is its count, so
        a subscriber tells a reopening from other updates without reading the reason."""
        return cls(EventKind.UPDATED, incident, finding=finding,
                   detail={"by": by, "reason": reason, "reopened": incident.reopened})

    @classmethod
    def report_ready(cls, incident: Incident, report: Report) -> IncidentEvent:
        return cls(EventKind.REPORT_READY, incident, report=report)

    @classmethod
    def approval_needed(cls, incident: Incident, actions: Sequence[Action]) -> IncidentEvent:
        return cls(EventKind.APPROVAL_NEEDED, incident, actions=tuple(actions))

    @classmethod
    def planned(cls, incident: Incident, actions: Sequence[Action]) -> IncidentEvent:
        return cls(EventKind.PLANNED, incident, actions=tuple(actions))

    @classmethod
    def step_finished(cls, incident: Incident, action: Action) -> IncidentEvent:
        return cls(EventKind.STEP_FINISHED, incident, actions=(action,))

    def describe(self) -> str:
        return f"{self.kind.value} {self.incident.id}"
