"""The store's tables: incidents, findings, actions, reports; API tokens and the audit log; GPU nodes
and their state transitions; notification deliveries; what stateful detectors remember across restarts.

Rows mirror core.types; enums are stored as their string values so a new reader needs no Python enum
to understand the database. Each row reads itself back as the value the store hands out (`to_domain`),
and the rows built from core.types build themselves (`from_domain`), so the repositories beside this
module only query. What text, JSON and time look like on disk is columns.py's business.

One module past 400 lines on purpose: it is the schema, which Alembic's autogenerate and the migration check
read as one `Base.metadata`; each table beside its mapping is easier to keep in step with the migrations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, MetaData, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from argus.store.columns import CleanJSON, CleanString, CleanText, UTCDateTime, jsonable
from argus.store.tokens import AuditRecord, Role, TokenRecord
from core.types import (
    Action,
    ActionState,
    Category,
    Evidence,
    Finding,
    Incident,
    IncidentState,
    Report,
    Severity,
    Subject,
)

# Explicit constraint names: Alembic can only drop or alter what it can name, the same on every backend.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Longest values of the short indexed columns; longer input is refused (fingerprint) or cut (subject_id).
FINGERPRINT_MAX = 255
SUBJECT_ID_MAX = 512


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


_NOT_RESOLVED = text("state != 'resolved'")


class IncidentRow(Base):
    __tablename__ = "incidents"

    id: Mapped[str] = mapped_column(CleanString(32), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(CleanString(FINGERPRINT_MAX), index=True)
    category: Mapped[str] = mapped_column(CleanString(32), index=True)
    subject_kind: Mapped[str] = mapped_column(CleanString(16))
    # Denormalised from `subject` for filtering; cut to SUBJECT_ID_MAX, the full id lives in `subject`.
    subject_id: Mapped[str] = mapped_column(CleanString(SUBJECT_ID_MAX), index=True)
    subject: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    state: Mapped[str] = mapped_column(CleanString(16), index=True)
    severity: Mapped[str] = mapped_column(CleanString(16))
    summary: Mapped[str] = mapped_column(CleanText)
    reason: Mapped[str] = mapped_column(CleanText)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    occurrences: Mapped[int] = mapped_column(Integer)
    recommended_action: Mapped[str | None] = mapped_column(CleanText, nullable=True)
    attrs: Mapped[dict[str, Any]] = mapped_column(CleanJSON)

    __table_args__ = (
        # At most one incident per fingerprint that is not resolved: the database, not the code, keeps
        # two threads or processes from opening the same incident twice.
        Index(
            "uq_incidents_open_fingerprint",
            "fingerprint",
            unique=True,
            sqlite_where=_NOT_RESOLVED,
            postgresql_where=_NOT_RESOLVED,
        ),
        # Lists of one state, newest first (the web page's and the ops agent's "open incidents", the correlator's
        # open incidents on every finding): read in index order, LIMIT rows, instead of sorting every open one.
        Index("ix_incidents_state_detected_at", "state", "detected_at", "id"),
    )

    @classmethod
    def from_finding(cls, finding: Finding, *, id: str, detected_at: datetime) -> IncidentRow:
        """The row of an incident that `finding` opens now."""
        return cls(
            id=id,
            fingerprint=finding.fingerprint,
            category=finding.category.value,
            subject_kind=finding.subject.kind.value,
            subject_id=finding.subject.id[:SUBJECT_ID_MAX],
            subject=jsonable(finding.subject.model_dump(mode="json")),
            state=IncidentState.OPEN.value,
            severity=finding.severity.value,
            summary=finding.summary,
            reason=finding.reason,
            first_seen=finding.first_seen,
            last_seen=max(finding.first_seen, finding.detected_at),
            detected_at=detected_at,
            resolved_at=None,
            occurrences=1,
            recommended_action=finding.recommended_action,
            attrs=jsonable(finding.attrs),
        )

    def to_domain(self) -> Incident:
        return Incident(
            id=self.id,
            fingerprint=self.fingerprint,
            category=Category(self.category),
            subject=Subject.model_validate(self.subject),
            state=IncidentState(self.state),
            severity=Severity(self.severity),
            summary=self.summary,
            reason=self.reason,
            first_seen=self.first_seen,
            last_seen=self.last_seen,
            detected_at=self.detected_at,
            occurrences=self.occurrences,
            recommended_action=self.recommended_action,
            attrs=self.attrs,
            resolved_at=self.resolved_at,
        )


class FindingRow(Base):
    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    incident_id: Mapped[str] = mapped_column(
        CleanString(32), ForeignKey("incidents.id", ondelete="CASCADE"), index=True
    )
    # sha256 of the reason and the evidence: a repeated finding with the same digest adds nothing.
    digest: Mapped[str] = mapped_column(CleanString(64))
    category: Mapped[str] = mapped_column(CleanString(32))
    reason: Mapped[str] = mapped_column(CleanText)
    subject: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    summary: Mapped[str] = mapped_column(CleanText)
    severity: Mapped[str] = mapped_column(CleanString(16))
    confidence: Mapped[float] = mapped_column(Float)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(CleanJSON)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime)
    recommended_action: Mapped[str | None] = mapped_column(CleanText, nullable=True)
    fingerprint: Mapped[str] = mapped_column(CleanString(FINGERPRINT_MAX))
    attrs: Mapped[dict[str, Any]] = mapped_column(CleanJSON)

    @classmethod
    def from_domain(cls, finding: Finding, *, incident_id: str, digest: str) -> FindingRow:
        return cls(
            incident_id=incident_id,
            digest=digest,
            category=finding.category.value,
            reason=finding.reason,
            subject=jsonable(finding.subject.model_dump(mode="json")),
            summary=finding.summary,
            severity=finding.severity.value,
            confidence=finding.confidence,
            evidence=jsonable([e.model_dump(mode="json") for e in finding.evidence]),
            first_seen=finding.first_seen,
            detected_at=finding.detected_at,
            recommended_action=finding.recommended_action,
            fingerprint=finding.fingerprint,
            attrs=jsonable(finding.attrs),
        )

    def to_domain(self) -> Finding:
        return Finding(
            category=Category(self.category),
            reason=self.reason,
            subject=Subject.model_validate(self.subject),
            summary=self.summary,
            severity=Severity(self.severity),
            confidence=self.confidence,
            evidence=tuple(Evidence.model_validate(e) for e in self.evidence),
            first_seen=self.first_seen,
            detected_at=self.detected_at,
            recommended_action=self.recommended_action,
            fingerprint=self.fingerprint,
            attrs=self.attrs,
        )


class ActionRow(Base):
    __tablename__ = "actions"

    id: Mapped[str] = mapped_column(CleanString(32), primary_key=True)
    incident_id: Mapped[str | None] = mapped_column(
        CleanString(32), ForeignKey("incidents.id", ondelete="SET NULL"), nullable=True, index=True
    )
    kind: Mapped[str] = mapped_column(CleanString(64))
    target: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    state: Mapped[str] = mapped_column(CleanString(16), index=True)
    idempotency_key: Mapped[str] = mapped_column(CleanString(255), unique=True)
    requested_by: Mapped[str] = mapped_column(CleanText)
    reason: Mapped[str] = mapped_column(CleanText)
    dry_run: Mapped[bool] = mapped_column()
    result: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @classmethod
    def from_domain(cls, action: Action, *, id: str) -> ActionRow:
        return cls(
            id=id,
            incident_id=action.incident_id,
            kind=action.kind,
            target=jsonable(action.target.model_dump(mode="json")),
            state=action.state.value,
            idempotency_key=action.idempotency_key,
            requested_by=action.requested_by,
            reason=action.reason,
            dry_run=action.dry_run,
            result=jsonable(action.result),
            created_at=action.created_at,
            updated_at=action.updated_at,
        )

    def to_domain(self) -> Action:
        return Action(
            id=self.id,
            incident_id=self.incident_id,
            kind=self.kind,
            target=Subject.model_validate(self.target),
            state=ActionState(self.state),
            idempotency_key=self.idempotency_key,
            requested_by=self.requested_by,
            reason=self.reason,
            dry_run=self.dry_run,
            result=self.result,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class ReportRow(Base):
    __tablename__ = "reports"

    id: Mapped[str] = mapped_column(CleanString(32), primary_key=True)
    incident_id: Mapped[str] = mapped_column(
        CleanString(32), ForeignKey("incidents.id", ondelete="CASCADE"), index=True
    )
    category: Mapped[str] = mapped_column(CleanString(32))
    confidence: Mapped[float] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(CleanText)
    markdown: Mapped[str] = mapped_column(CleanText)
    generator: Mapped[str] = mapped_column(CleanText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    data: Mapped[dict[str, Any]] = mapped_column(CleanJSON)

    @classmethod
    def from_domain(cls, report: Report, *, id: str) -> ReportRow:
        return cls(
            id=id,
            incident_id=report.incident_id,
            category=report.category.value,
            confidence=report.confidence,
            summary=report.summary,
            markdown=report.markdown,
            generator=report.generator,
            created_at=report.created_at,
            data=jsonable(report.data),
        )

    def to_domain(self) -> Report:
        return Report(
            id=self.id,
            incident_id=self.incident_id,
            category=Category(self.category),
            confidence=self.confidence,
            summary=self.summary,
            markdown=self.markdown,
            generator=self.generator,
            created_at=self.created_at,
            data=self.data,
        )


class ApiTokenRow(Base):
    """An API token. Only the sha256 of the token is kept; `prefix` (its first, public part) finds the row."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(CleanString(32), primary_key=True)
    name: Mapped[str] = mapped_column(CleanString(64), unique=True)
    role: Mapped[str] = mapped_column(CleanString(16))
    prefix: Mapped[str] = mapped_column(CleanString(32), unique=True)
    user: Mapped[str | None] = mapped_column(CleanString(32), nullable=True)  # the person it speaks for; None: no one
    token_hash: Mapped[str] = mapped_column(CleanString(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(CleanText)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    def to_domain(self) -> TokenRecord:
        return TokenRecord(
            id=self.id, name=self.name, role=Role(self.role), prefix=self.prefix, created_at=self.created_at,
            created_by=self.created_by, expires_at=self.expires_at, revoked_at=self.revoked_at,
            last_used_at=self.last_used_at, user=self.user,
        )


class AuditRow(Base):
    """One mutating API call: who (token name and role), what (method, path, target), when, and the result."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    actor: Mapped[str] = mapped_column(CleanText)
    role: Mapped[str | None] = mapped_column(CleanString(16), nullable=True)
    method: Mapped[str] = mapped_column(CleanString(16))
    path: Mapped[str] = mapped_column(CleanText)
    target: Mapped[str | None] = mapped_column(CleanText, nullable=True)
    status: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(CleanString(16))
    detail: Mapped[dict[str, Any]] = mapped_column(CleanJSON)

    def to_domain(self) -> AuditRecord:
        return AuditRecord(
            id=self.id, at=self.at, actor=self.actor, role=self.role, method=self.method, path=self.path,
            target=self.target, status=self.status, outcome=self.outcome, detail=self.detail,
        )


# Ray node ids are 56 hex characters; the slack is for whatever a later Ray calls them.
RAY_NODE_ID_MAX = 128


class NodeRow(Base):
    """A GPU node Argus manages: its spec (control.nodes.NodeSpec as JSON) and its lifecycle state."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(CleanString(63), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    state: Mapped[str] = mapped_column(CleanString(16), index=True)
    ray_node_id: Mapped[str | None] = mapped_column(CleanString(RAY_NODE_ID_MAX), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class NodeTransitionRow(Base):
    """One move of a node between states: who made it, why and when. from_state is null for registration."""

    __tablename__ = "node_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(CleanString(63), ForeignKey("nodes.name", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(CleanString(16), nullable=True)
    to_state: Mapped[str] = mapped_column(CleanString(16))
    actor: Mapped[str] = mapped_column(CleanText)
    reason: Mapped[str] = mapped_column(CleanText)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    ray_node_id: Mapped[str | None] = mapped_column(CleanString(RAY_NODE_ID_MAX), nullable=True)


class DeliveryRow(Base):
    """One attempt to tell a channel about an incident event: appended, never updated.

    `key` is the dispatcher's idempotency key (incident, event, channel); a key with an ok row was delivered and
    is not sent again. A digest writes one row per incident event it carried, all with its outcome.
    """

    __tablename__ = "notification_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(CleanString(255), index=True)
    incident_id: Mapped[str | None] = mapped_column(CleanString(64), nullable=True, index=True)
    event: Mapped[str] = mapped_column(CleanString(32))
    channel: Mapped[str] = mapped_column(CleanString(64))
    ok: Mapped[bool] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer)
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(CleanText, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    detail: Mapped[dict[str, Any]] = mapped_column(CleanJSON)

    def to_domain(self) -> DeliveryRecord:
        return DeliveryRecord(
            id=self.id, key=self.key, incident_id=self.incident_id, event=self.event, channel=self.channel,
            ok=self.ok, attempts=self.attempts, status=self.status, error=self.error, at=self.at, detail=self.detail,
        )


# A detector's name (StallDetector.name) and one of its keys (a job's submission id, at most SUBJECT_ID_MAX).
DETECTOR_NAME_MAX = 64


class DetectorStateRow(Base):
    """One thing a stateful detector remembers about one key (a job), replaced as a whole on every save.

    `value` is JSON kept as text, parsed by the repository row by row: a row another version wrote, or one
    edited by hand, is skipped with a warning instead of failing the whole load (a JSON column would).
    """

    __tablename__ = "detector_state"

    detector: Mapped[str] = mapped_column(CleanString(DETECTOR_NAME_MAX), primary_key=True)
    key: Mapped[str] = mapped_column(CleanString(SUBJECT_ID_MAX), primary_key=True)
    value: Mapped[str] = mapped_column(CleanText)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_detector_state_detector_updated_at", "detector", "updated_at"),)


@dataclass(frozen=True)
class DeliveryRecord:
    """One notification delivery attempt as stored (core.types has no type for it: only notify reads them)."""

    id: int
    key: str
    incident_id: str | None
    event: str
    channel: str
    ok: bool
    attempts: int
    status: int | None
    error: str | None
    at: datetime
    detail: dict[str, Any]


LEASE_NAME_MAX = 64
LEASE_HOLDER_MAX = 128


class LeaseRow(Base):
    """Who holds a named lease (the replica that runs Argus's loop) and until when; argus/store/leases.py.

    `term` counts the holders: it goes up by one each time another replica takes the lease, so a replica can tell
    its own earlier tenure from a new one (the term is in the log lines and /v1/health).
    """

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(CleanString(LEASE_NAME_MAX), primary_key=True)
    holder: Mapped[str] = mapped_column(CleanString(LEASE_HOLDER_MAX))
    term: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)
    renewed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AlertInboxRow(Base):
    """An Alertmanager alert accepted by the webhook and not yet filed (argus/store/alert_inbox.py): kept until the
    incident desk has filed it, so an Argus killed between accepting and filing loses nothing.

    `claimed_by` is the replica that files it (the one that accepted it); `claimed_at` is renewed while that replica
    works through its queue, so another replica takes over only the alerts of a replica that stopped.
    """

    __tablename__ = "alert_inbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    group_key: Mapped[str] = mapped_column(CleanText)
    alert: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    claimed_by: Mapped[str] = mapped_column(CleanString(LEASE_HOLDER_MAX), index=True)
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime)


class QueuedJobRow(Base):
    """A job in the FIFO queue (argus/store/job_queue.py): its spec and what the resubmission it may be carries, its
    gang, and its place: queued, then started (handed to Ray) and finished, or expired, cancelled, failed.

    `id` orders the queue (first in, first looked at); `submission_id` is the job's Ray id, decided when queued.
    """

    __tablename__ = "job_queue"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    submission_id: Mapped[str] = mapped_column(CleanString(64), unique=True)
    owner: Mapped[str] = mapped_column(CleanString(32), index=True)
    pool: Mapped[str | None] = mapped_column(CleanString(63), nullable=True)
    nnodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    request: Mapped[dict[str, Any]] = mapped_column(CleanJSON)
    state: Mapped[str] = mapped_column(CleanString(16), index=True)
    reason: Mapped[str] = mapped_column(CleanText)
    timeout_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ray_status: Mapped[str | None] = mapped_column(CleanString(16), nullable=True)
