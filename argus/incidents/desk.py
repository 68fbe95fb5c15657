"""The one way in for incidents: file a finding, change an incident's state, and tell the subscribers.

The detection loop, Alertmanager's webhook, the API and the web page all go through an IncidentDesk, so a
finding is correlated and deduplicated the same way wherever it comes from, and every incident that opens or
is resolved reaches the same subscribers (IM, webhooks, reports, remediation, metrics) as the same event.
Filing returns what happened as a value (`Filed`); the events go to the bus, which delivers them off the
caller's thread.

A fault that comes back within `reopen_window_s` of its incident being resolved (a flapping rank, a node that
drops out again) reopens that incident, counted, instead of opening another: one fault, one incident, one
history. The reopening is announced as UPDATED, not OPENED, so what reacts to new incidents (reports,
remediation plans, the opened counter) does not treat it as new; see RemediationSubscriber for why.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Literal, Protocol

from loguru import logger

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.events import IncidentEvent
from core import signal_keys as keys
from core.refs import refs_of
from core.types import Action, Category, Finding, Incident, IncidentState, Recovery, Report, Severity, SubjectKind


class IncidentStore(Protocol):
    """What the desk needs of the store (argus.store.store.Store implements it), and `list_incidents`, which
    the desk does not call but the Argus metrics read through the desk's store (argus.wiring)."""

    def file_finding(
        self, finding: Finding, *, reopen_within_s: float = 0.0
    ) -> tuple[Incident, Literal["opened", "folded", "raised", "reopened"]]: ...  # pragma: no cover

    def attach_finding(self, incident_id: str, finding: Finding) -> Incident: ...  # pragma: no cover

    def merge_into(self, echo_id: str, root_id: str) -> Incident: ...  # pragma: no cover

    def find_open(self, fingerprint: str) -> Incident | None: ...  # pragma: no cover

    def set_state(self, incident_id: str, state: IncidentState | str, *, by: str = "",
                  reason: str = "") -> Incident: ...  # pragma: no cover

    def set_severity(self, incident_id: str, severity: Severity | str, *,
                     reason: str) -> Incident: ...  # pragma: no cover

    def get_incident(self, incident_id: str) -> Incident: ...  # pragma: no cover

    def findings_for(self, incident_id: str) -> list[Finding]: ...  # pragma: no cover

    def list_incidents(
        self, *, state: IncidentState | str | None = None, since: datetime | None = None, limit: int = 100,
        offset: int = 0, states: Collection[IncidentState] | None = None,
        categories: Collection[Category] | None = None, not_subject_kind: SubjectKind | None = None,
        mentions: str | None = None,
    ) -> list[Incident]: ...  # pragma: no cover

    def count_incidents(self, states: Collection[IncidentState]) -> dict[str, int]: ...  # pragma: no cover


class Outcome(str, Enum):
    OPENED = "opened"  # a new incident
    FOLDED = "folded"  # another occurrence of an open incident with the same fingerprint
    ECHO = "echo"  # filed under the open incident of its root cause (another fingerprint)
    REOPENED = "reopened"  # the incident with its fingerprint, resolved within the reopen window, is open again


@dataclass(frozen=True)
class Filed:
    outcome: Outcome
    incident: Incident


class IncidentDesk:
    """`events`: the bus that tells the subscribers (without one, events reach nobody). `correlator`: echoes and
    duplicates of open root causes; without it every fingerprint is its own incident. `reopen_window_s`: a
    finding whose incident was resolved at most this long ago reopens it (Settings.reopen_window_s; 0, the
    default here, never reopens: a desk built without settings behaves as before reopening existed)."""

    def __init__(self, store: IncidentStore, *, events: EventBus | None = None,
                 correlator: Correlator | None = None, reopen_window_s: float = 0.0) -> None:
        if reopen_window_s < 0:
            raise ValueError(f"reopen_window_s must be 0 (never reopen) or more, got {reopen_window_s}")
        self.store = store
        self.events = events if events is not None else EventBus().start([])
        self.correlator = correlator
        self.reopen_window_s = reopen_window_s

    # -- filing ---------------------------------------------------------------------------------------------

    def file(self, finding: Finding) -> Filed:
        """File one finding: as an echo of an open root cause, as a repeat, by reopening its recently resolved
        incident (announced as updated), or as a new incident (announced as opened)."""
        root = self.correlator.root_for(finding) if self.correlator else None
        if root is not None and root.fingerprint != finding.fingerprint:
            incident = self.store.attach_finding(root.id, finding)
            own = self.store.find_open(finding.fingerprint)
            if own is not None and own.id != root.id:  # its own incident, opened before the link was known
                self._merge(own.id, root.id)
            logger.bind(incident=root.id).info(
                "{} on {} filed as an echo of {} ({})", finding.category.value, finding.subject.id,
                root.id, root.category.value,
            )
            return Filed(Outcome.ECHO, incident)
        if _cannot_recur(finding) and (told := self._told(finding)) is not None:
            # Read late, about a fault already told: a line of a job that had already ended (Ray lists a short job's
            # driver log after it failed), or about a Ray node that already died (the GCS's log read after the
            # node's incident closed): an ended job cannot fail again and a node id dies once. Evidence for that
            # incident, which stays as it is: resolved ones are not reopened.
            incident = self.store.attach_finding(told.id, finding)
            logger.bind(incident=told.id).info("a late {} finding about {} kept with the incident that told it",
                                               finding.category.value, finding.subject.id)
            return Filed(Outcome.FOLDED, incident)
        incident, recorded = self.store.file_finding(finding, reopen_within_s=self.reopen_window_s)
        log = logger.bind(incident=incident.id, category=incident.category.value)
        if recorded == "folded":
            log.debug("finding folded into incident ({} occurrences)", incident.occurrences)
            if finding.subject.kind is not SubjectKind.NODE and refs_of(finding).affected_node_id is not None:
                self._absorb_echoes(incident)  # this repeat may name the struck node its first finding did not
            return Filed(Outcome.FOLDED, incident)
        if recorded == "raised":  # one fault whose evidence grew worse (a disk's trend, then its floor): told once
            reason = f"severity raised to {incident.severity.value}: {finding.summary[:300]}"
            log.warning("incident {}", reason)
            self.events.publish(IncidentEvent.state_changed(incident, by="argus", reason=reason))
            return Filed(Outcome.FOLDED, incident)
        # Opened or reopened, the root cause is open now: open echoes of its jobs are filed under it.
        self._absorb_echoes(incident)
        if recorded == "reopened":
            reason = f"reopened ({ordinal(incident.reopened)} time): {finding.summary[:300]}"
            log.warning("incident {}", reason)
            self.events.publish(IncidentEvent.reopened(incident, finding, by="argus", reason=reason))
            return Filed(Outcome.REOPENED, incident)
        log.warning("incident opened: {}", incident.summary)
        self.events.publish(IncidentEvent.opened(incident, finding))
        return Filed(Outcome.OPENED, incident)

    def _told(self, finding: Finding) -> Incident | None:
        """The newest incident seen within the last hour (or the reopen window, if longer) before `finding`, open or
        resolved, that holds its fingerprint as its own or as a finding filed under it; for a line of an ended job,
        else the newest that holds any finding about that job."""
        since = finding.detected_at - timedelta(seconds=max(self.reopen_window_s, 3600.0))
        fingerprint = finding.fingerprint
        for incident in self.store.list_incidents(since=since, limit=1000, mentions=fingerprint):
            if incident.attrs.get("merged_into"):
                continue
            if incident.fingerprint == fingerprint or fingerprint in (incident.attrs.get("echoes") or []):
                return incident
        if not finding.attrs.get(keys.JOB_ENDED):
            return None
        recent = [i for i in self.store.list_incidents(since=since, limit=1000) if not i.attrs.get("merged_into")]
        # An ended job's late line under another category than its end was told in (the FAILED message matched no
        # signature, the line names the lost node): the incident that told the job's end holds it.
        job = finding.subject.id
        for incident in recent[:200]:
            if job in refs_of(incident).job_ids or any(
                    job in refs_of(f).job_ids for f in self.store.findings_for(incident.id)):
                return incident
        return None

    def _absorb_echoes(self, incident: Incident) -> None:
        """Merge into `incident` the open incidents the correlator says it explains (echoes; its node's own)."""
        if self.correlator is not None:
            for echo in self.correlator.echoes_of(incident):
                self._merge(echo.id, incident.id)

    def _merge(self, echo_id: str, root_id: str) -> None:
        """Fold an open incident into its root's, and announce it resolved (merged): webhooks that heard it open
        hear it end, and an IM opening of it still waiting to leave is not sent at all (argus.notify)."""
        self.store.merge_into(echo_id, root_id)
        merged = self.store.get_incident(echo_id)
        reason = f"merged into {root_id}: the same fault, told there"
        logger.bind(incident=echo_id).info("incident {}", reason)
        self.events.publish(IncidentEvent.state_changed(merged, by="argus", reason=reason))

    # -- changing state ------------------------------------------------------------------------------------------

    def resolve(self, incident_id: str, *, by: str, reason: str = "") -> Incident:
        """Resolve the incident and announce it; NotFound for an unknown id. Resolving twice announces once."""
        return self.set_state(incident_id, IncidentState.RESOLVED, by=by, reason=reason)

    def recover(self, recovery: Recovery) -> Incident | None:
        """Resolve the open incident of a fault its detector saw end (announced with the reason); None when no
        incident with that fingerprint is open (it was an echo filed elsewhere, or a person resolved it). A
        fault seen twice is one incident under the fingerprint seen first (the job's line "Raylet is terminated",
        then Ray's node state): the end of the one seen second ends that incident too. A recovery with a lower
        severity than the incident's lowers it first (recorded), and the resolve event says what it was."""
        incident = self.store.find_open(recovery.fingerprint) or self._same_fault_under(recovery.fingerprint)
        if incident is None:
            return None
        was = None
        if recovery.severity is not None and recovery.severity.rank < incident.severity.rank:
            self.store.set_severity(incident.id, recovery.severity, reason=recovery.reason)
            was = incident.severity
        return self.set_state(incident.id, IncidentState.RESOLVED, by=f"argus:{recovery.detector}",
                              reason=recovery.reason, severity_was=was)

    def _same_fault_under(self, fingerprint: str) -> Incident | None:
        """The open incident that took in the finding with `fingerprint` as the same fault: a finding of its own
        category filed under it. An echo of another category ending (an NCCL error under a lost node) says nothing
        of whether the root cause has."""
        for state in (IncidentState.OPEN, IncidentState.MITIGATING):
            for incident in self.store.list_incidents(state=state, limit=1000, mentions=fingerprint):
                if fingerprint not in (incident.attrs.get("echoes") or []):
                    continue
                if any(f.fingerprint == fingerprint and f.category is incident.category
                       for f in self.store.findings_for(incident.id)):
                    return incident
        return None

    def set_state(self, incident_id: str, state: IncidentState, *, by: str, reason: str = "",
                  severity_was: Severity | None = None) -> Incident:
        """Move the incident to `state`; subscribers hear of it when its state really changed. `severity_was`:
        the severity it had before this change lowered it, for the event's record."""
        before = self.store.get_incident(incident_id)
        changed = self.store.set_state(incident_id, state, by=by, reason=reason)
        if before.state is not changed.state:
            logger.bind(incident=incident_id).info("incident {} by {}{}", changed.state.value, by,
                                                   f": {reason}" if reason else "")
            self.events.publish(IncidentEvent.state_changed(changed, by=by, reason=reason, severity_was=severity_was))
        return changed

    # -- announcing what others produced --------------------------------------------------------------------------

    def report_ready(self, incident: Incident, report: Report) -> None:
        self.events.publish(IncidentEvent.report_ready(incident, report))

    def approval_needed(self, incident: Incident, actions: Sequence[Action]) -> None:
        """Steps wait for a person (or the agent): they are told, with approve/reject links where configured."""
        if actions:
            self.events.publish(IncidentEvent.approval_needed(incident, actions))


def _cannot_recur(finding: Finding) -> bool:
    """A finding whose fault cannot happen again to its subject: about a job that had ended when its line was read,
    or the death of a Ray node (a node id is one raylet's life; a node that comes back is a new id)."""
    if finding.attrs.get(keys.JOB_ENDED):
        return True
    return finding.category is Category.NODE_LOST and finding.subject.kind is SubjectKind.NODE


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
