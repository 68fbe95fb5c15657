"""The store: findings deduplicated into incidents, actions, reports, API tokens, the audit log,
notification deliveries, detector state and leases, in SQLite or PostgreSQL.

Store opens the database (migrating it, or checking its revision) and hands out one repository per
aggregate, sharing its engine and clock: `incidents` (with their findings), `actions`, `reports`,
`tokens`, `audit_log`, `deliveries`, `detector_state` (the core.ports.DetectorMemory that wiring hands
to the stateful detectors), `leases` (which replica leads, argus/leader.py) and `nodes()`. Its methods
are the names the rest of Argus calls (core.ports, argus.pipeline.IncidentSink, the API, the runner),
each handed to its repository.

One Store is shared by the API and the daemon loop, from different threads: every call opens its own
short transaction. Every database error leaves here as one of core.errors, with the password masked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from loguru import logger

from argus.store import migrate
from argus.store.actions import ActionRepository
from argus.store.alert_inbox import AlertInboxRepository
from argus.store.api_tokens import TokenRepository
from argus.store.audit import AuditRepository
from argus.store.deliveries import DeliveryRepository
from argus.store.detector_state import DetectorStateRepository
from argus.store.incidents import MAX_FINDINGS_PER_INCIDENT, IncidentRepository, Recorded
from argus.store.job_queue import JobQueueRepository
from argus.store.leases import LeaseRepository
from argus.store.models import DeliveryRecord
from argus.store.nodes import SqlNodeRegistry
from argus.store.reports import ReportRepository
from argus.store.repository import MAX_LIST_LIMIT, new_id
from argus.store.tokens import AuditRecord, Role, TokenRecord
from core.errors import StoreError
from core.types import (
    Action,
    ActionState,
    Category,
    Finding,
    Incident,
    IncidentState,
    Report,
    Severity,
    SubjectKind,
    utcnow,
)

__all__ = ["MAX_FINDINGS_PER_INCIDENT", "MAX_LIST_LIMIT", "DeliveryRecord", "Store", "new_id"]


class Store:
    """Incidents, their findings, actions and reports. Thread-safe; one per process is enough."""

    def __init__(
        self,
        url: str,
        *,
        auto_migrate: bool = True,
        clock: Callable[[], datetime] = utcnow,
        max_findings_per_incident: int = MAX_FINDINGS_PER_INCIDENT,
    ) -> None:
        self._engine = migrate.open_engine(url)
        self._url = self._engine.url
        self._clock = clock
        try:
            if auto_migrate:
                migrate.upgrade_engine(self._engine)
            else:
                self._check_revision()
        except BaseException:
            self._engine.dispose()
            raise
        self.incidents = IncidentRepository(
            self._engine, clock=clock, max_findings_per_incident=max_findings_per_incident
        )
        self.actions = ActionRepository(self._engine, clock=clock)
        self.reports = ReportRepository(self._engine)
        self.tokens = TokenRepository(self._engine, clock=clock)
        self.audit_log = AuditRepository(self._engine, clock=clock)
        self.deliveries = DeliveryRepository(self._engine, clock=clock)
        self.detector_state = DetectorStateRepository(self._engine, clock=clock)
        self.leases = LeaseRepository(self._engine, clock=clock)
        self.alert_inbox = AlertInboxRepository(self._engine, clock=clock)
        self.job_queue = JobQueueRepository(self._engine, clock=clock)
        logger.debug("incident store ready at {}", self.address)

    @property
    def address(self) -> str:
        """The database URL with the password masked: safe to log and show."""
        return migrate.mask_url(self._url)

    def close(self) -> None:
        self._engine.dispose()

    def nodes(self) -> SqlNodeRegistry:
        """The registry of GPU nodes in this store's database, sharing its connections and clock."""
        return SqlNodeRegistry(self._engine, clock=self._clock)

    def _check_revision(self) -> None:
        have, want = migrate.revision_of(self._engine), migrate.head_revision()
        if have != want:
            raise StoreError(
                f"database {self.address} is at schema revision {have or 'none'}, this Argus needs {want}",
                hint="run `argus db upgrade`, or start the Store with auto_migrate=True",
            )

    # ---- incidents and findings (IncidentRepository) ------------------------------------------------

    def record_finding(self, finding: Finding) -> tuple[Incident, bool]:
        """File `finding` under its fingerprint's open incident, or open one; True when opened now."""
        return self.incidents.record(finding)

    def file_finding(self, finding: Finding, *, reopen_within_s: float = 0.0) -> tuple[Incident, Recorded]:
        """Like record_finding, and an incident with its fingerprint resolved at most `reopen_within_s` ago (and
        none open) is reopened, counted in attrs "reopened"; says whether it "opened", "folded", "raised" (folded, its
        severity higher now) or "reopened"."""
        return self.incidents.file(finding, reopen_within_s=reopen_within_s)

    def attach_finding(self, incident_id: str, finding: Finding) -> Incident:
        """File `finding` under an existing incident it is an echo of (another fingerprint, same cause)."""
        return self.incidents.attach(incident_id, finding)

    def merge_into(self, echo_id: str, root_id: str) -> Incident:
        """Fold incident `echo_id` into `root_id`: its findings join the root and it is resolved as merged."""
        return self.incidents.merge(echo_id, root_id)

    def get_incident(self, incident_id: str) -> Incident:
        return self.incidents.get(incident_id)

    def find_open(self, fingerprint: str) -> Incident | None:
        """The not-resolved incident with `fingerprint`, if any."""
        return self.incidents.find_open(fingerprint)

    def list_incidents(
        self,
        *,
        state: IncidentState | str | None = None,
        category: Category | str | None = None,
        subject_id: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
        states: Collection[IncidentState] | None = None,
        categories: Collection[Category] | None = None,
        not_subject_kind: SubjectKind | None = None,
        mentions: str | None = None,
    ) -> list[Incident]:
        """Incidents, newest opened first. `since` keeps those seen (last_seen) at or after it; the rest narrow
        in the database (IncidentRepository.list)."""
        return self.incidents.list(
            state=state, category=category, subject_id=subject_id, since=since, limit=limit, offset=offset,
            states=states, categories=categories, not_subject_kind=not_subject_kind, mentions=mentions,
        )

    def count_incidents(self, states: Collection[IncidentState]) -> dict[str, int]:
        """Incidents in `states` per category value."""
        return self.incidents.count_by_category(states)

    def findings_for(self, incident_id: str) -> list[Finding]:
        """The findings kept for an incident, oldest first."""
        return self.incidents.findings(incident_id)

    def set_state(self, incident_id: str, state: IncidentState | str, *, by: str = "", reason: str = "") -> Incident:
        """Move an incident to `state`. Resolving stamps resolved_at and records who and why; reopening clears it."""
        return self.incidents.set_state(incident_id, state, by=by, reason=reason)

    def set_severity(self, incident_id: str, severity: Severity | str, *, reason: str) -> Incident:
        """Set an incident's severity, recording from, to, why and when in its attrs["severity_changes"]."""
        return self.incidents.set_severity(incident_id, severity, reason=reason)

    # ---- actions (ActionRepository) -----------------------------------------------------------------

    def add_action(self, action: Action) -> Action:
        """Store `action`; if its idempotency key is already stored, return that action instead."""
        return self.actions.add(action)

    def get_action(self, action_id: str) -> Action:
        return self.actions.get(action_id)

    def update_action(self, action_id: str, state: ActionState | str, result: dict[str, Any] | None = None) -> Action:
        """Set an action's state (and its result, replacing the old one, when given)."""
        return self.actions.update(action_id, state, result)

    def transition_action(
        self, action_id: str, from_states: tuple[ActionState, ...], to_state: ActionState,
        result: dict[str, Any] | None = None,
    ) -> Action:
        """Move an action only if it is still in one of `from_states`; Conflict otherwise."""
        return self.actions.transition(action_id, from_states, to_state, result)

    def runnable_actions(self) -> list[Action]:
        """The actions approved or planned as dry runs, oldest first (the remediation runner's work)."""
        return self.actions.runnable()

    def actions_of(self, incident_ids: Collection[str], *, states: Collection[ActionState]) -> list[Action]:
        """The actions of these incidents in one of `states`, oldest first."""
        return self.actions.of_incidents(incident_ids, states)

    def list_actions(self, incident_id: str | None = None, *, updated_since: datetime | None = None,
                     or_states: Collection[ActionState] = ()) -> list[Action]:
        """Actions, oldest first; only those of `incident_id` when given; with `updated_since`, those changed since
        then or in one of `or_states`."""
        return self.actions.list(incident_id, updated_since=updated_since, or_states=or_states)

    # ---- reports (ReportRepository) -----------------------------------------------------------------

    def add_report(self, report: Report) -> Report:
        """Store `report` for its incident. An empty `report.id` gets a new "rep-" id."""
        return self.reports.add(report)

    def reports_for(self, incident_id: str) -> list[Report]:
        """An incident's reports, oldest first (the last is the latest)."""
        return self.reports.for_incident(incident_id)

    # ---- API tokens (TokenRepository) and the audit log (AuditRepository) ---------------------------

    def create_token(
        self, name: str, role: Role | str, created_by: str, expires_at: datetime | None = None, *,
        user: str | None = None,
    ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself, which is not stored and cannot be shown again; `user`: the
        person a user token speaks for (default: its name)."""
        return self.tokens.create(name, role, created_by, expires_at, user=user)

    def verify_token(self, token: str) -> TokenRecord | None:
        """The record of a token that exists, is not revoked and has not expired; None for anything else."""
        return self.tokens.verify(token)

    def revoke_token(self, name_or_id: str) -> TokenRecord:
        """Revoke a token by name or id; revoking twice keeps the first time. NotFound if there is none."""
        return self.tokens.revoke(name_or_id)

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones too, oldest first."""
        return self.tokens.list()

    def audit(
        self,
        *,
        actor: str,
        role: Role | str | None,
        method: str,
        path: str,
        status: int,
        target: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditRecord:
        """Record one call: who (token name, role), what (method, path, target), when (now), the result."""
        return self.audit_log.record(
            actor=actor, role=role, method=method, path=path, status=status, target=target, detail=detail
        )

    def list_audit(self, limit: int = 100, since: datetime | None = None) -> list[AuditRecord]:
        """Audit records, newest first; `since` keeps those at or after it."""
        return self.audit_log.list(limit, since)

    # ---- notification deliveries (DeliveryRepository) -----------------------------------------------

    def record_delivery(
        self, *, key: str, incident_id: str | None, event: str, channel: str, ok: bool, attempts: int,
        status: int | None = None, error: str | None = None, detail: dict[str, Any] | None = None,
    ) -> DeliveryRecord:
        """Append one attempt to tell `channel` about `event` of an incident (argus.notify.dispatcher)."""
        return self.deliveries.record(
            key=key, incident_id=incident_id, event=event, channel=channel, ok=ok, attempts=attempts,
            status=status, error=error, detail=detail,
        )

    def delivery_sent(self, key: str) -> bool:
        """Whether a delivery with `key` succeeded: the dispatcher's dedup, which survives a restart."""
        return self.deliveries.sent(key)

    def last_delivery_at(self, incident_id: str, channel: str) -> datetime | None:
        """When `channel` was last told about the incident (successfully), None if never: the renotify limit."""
        return self.deliveries.last_sent_at(incident_id, channel)

    def list_deliveries(self, incident_id: str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        """Delivery attempts, newest first; only those about `incident_id` when given."""
        return self.deliveries.list(incident_id, limit)
