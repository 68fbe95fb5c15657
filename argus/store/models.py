"""The store's tables: incidents, findings, actions, reports; API tokens and the audit log; GPU nodes
and their state transitions.

Rows mirror core.types; enums are stored as their string values so a new reader needs no Python enum
to understand the database. The column types below also decide what text and time look like on disk,
so SQLite and PostgreSQL return the same values:

- every datetime is stored in UTC and read back timezone-aware, also on SQLite (which has no time
  zones: it gets naive UTC text, which also keeps its string comparisons in time order);
- text never reaches the database with a NUL or an unpaired surrogate: PostgreSQL rejects NUL in text
  and JSON, and no UTF-8 driver can encode a lone surrogate. Both become U+FFFD, on every backend,
  so a hostile log line is stored (changed by one visible character) instead of failing the pipeline;
- JSON never holds NaN or infinity (not JSON; PostgreSQL rejects them): they become null.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

REPLACEMENT = "\ufffd"

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


def clean_text(value: str) -> str:
    """`value` with NUL and unpaired surrogates replaced by U+FFFD; unchanged (same object) when clean."""
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Round-trip through UTF-16 so valid surrogate pairs join into one character and only
        # unpaired halves are replaced.
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def clean_json(value: Any) -> Any:
    """A JSON-ready value with every string (keys too) cleaned and non-finite floats turned into None."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    raise TypeError(f"cannot store {type(value).__name__} as JSON; convert it to str, number, list or dict")


class CleanText(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else clean_text(value)


class CleanString(TypeDecorator[str]):
    """A bounded VARCHAR with the same cleaning as CleanText (ids, fingerprints, enum values)."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else clean_text(value)


class CleanJSON(TypeDecorator[Any]):
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return clean_json(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out. A naive datetime is taken to be UTC already."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


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


class ApiTokenRow(Base):
    """An API token. Only the sha256 of the token is kept; `prefix` (its first, public part) finds the row."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(CleanString(32), primary_key=True)
    name: Mapped[str] = mapped_column(CleanString(64), unique=True)
    role: Mapped[str] = mapped_column(CleanString(16))
    prefix: Mapped[str] = mapped_column(CleanString(32), unique=True)
    token_hash: Mapped[str] = mapped_column(CleanString(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(CleanText)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


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
