"""The audit log: one row per mutating API call, appended, never changed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from argus.store.columns import jsonable
from argus.store.models import AuditRow
from argus.store.repository import check_limit, saved, transaction
from argus.store.tokens import AuditRecord, Role, outcome_of
from core.types import utcnow


class AuditRepository:
    """The audit log. Thread-safe; the Store holds one as `store.audit_log`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def record(
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
        row = AuditRow(
            at=self._clock(), actor=actor, role=None if role is None else Role(role).value,
            method=method.upper()[:16], path=path, target=target, status=status, outcome=outcome_of(status),
            detail=jsonable(detail or {}),
        )
        with transaction(self._engine, "writing the audit log") as s:
            s.add(row)
            return saved(s, row).to_domain()

    def list(self, limit: int = 100, since: datetime | None = None) -> list[AuditRecord]:
        """Audit records, newest first; `since` keeps those at or after it."""
        check_limit(limit)
        query = select(AuditRow)
        if since is not None:
            query = query.where(AuditRow.at >= since)
        query = query.order_by(AuditRow.at.desc(), AuditRow.id.desc()).limit(limit)
        with transaction(self._engine, "reading the audit log", read_only=True) as s:
            return [row.to_domain() for row in s.scalars(query)]
