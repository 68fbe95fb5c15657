"""Notification deliveries: one row per attempt to tell a channel about an incident event, appended, never
changed. A key with a successful row was delivered: the dispatcher's dedup, which survives a restart.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from argus.store.columns import jsonable
from argus.store.models import DeliveryRecord, DeliveryRow
from argus.store.repository import check_limit, saved, transaction
from core.errors import InputError
from core.types import utcnow


class DeliveryRepository:
    """Notification delivery attempts. Thread-safe; the Store holds one as `store.deliveries`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def record(
        self, *, key: str, incident_id: str | None, event: str, channel: str, ok: bool, attempts: int,
        status: int | None = None, error: str | None = None, detail: dict[str, Any] | None = None,
    ) -> DeliveryRecord:
        """Append one attempt to tell `channel` about `event` of an incident (argus.notify.dispatcher)."""
        if not key or len(key) > 255:
            raise InputError(f"delivery key of {len(key)} characters", hint="keys are 1 to 255 characters")
        row = DeliveryRow(
            key=key, incident_id=incident_id, event=event[:32], channel=channel[:64], ok=ok, attempts=attempts,
            status=status, error=error[:2000] if error else None, at=self._clock(), detail=jsonable(detail or {}),
        )
        with transaction(self._engine, "recording a notification delivery") as s:
            s.add(row)
            return saved(s, row).to_domain()

    def sent(self, key: str) -> bool:
        """Whether a delivery with `key` succeeded."""
        with transaction(self._engine, "checking a notification delivery", read_only=True) as s:
            query = select(DeliveryRow.id).where(DeliveryRow.key == key).where(DeliveryRow.ok.is_(True)).limit(1)
            return s.scalars(query).first() is not None

    def last_sent_at(self, incident_id: str, channel: str) -> datetime | None:
        """When `channel` was last told anything about the incident (a successful delivery), None if never: the
        dispatcher's renotify limit for flapping incidents, which survives a restart."""
        with transaction(self._engine, "reading the last notification delivery", read_only=True) as s:
            query = (select(DeliveryRow.at).where(DeliveryRow.incident_id == incident_id)
                     .where(DeliveryRow.channel == channel[:64]).where(DeliveryRow.ok.is_(True))
                     .order_by(DeliveryRow.at.desc()).limit(1))
            return s.scalars(query).first()

    def list(self, incident_id: str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        """Delivery attempts, newest first; only those about `incident_id` when given."""
        check_limit(limit)
        query = select(DeliveryRow)
        if incident_id is not None:
            query = query.where(DeliveryRow.incident_id == incident_id)
        query = query.order_by(DeliveryRow.at.desc(), DeliveryRow.id.desc()).limit(limit)
        with transaction(self._engine, "listing notification deliveries", read_only=True) as s:
            return [row.to_domain() for row in s.scalars(query)]
