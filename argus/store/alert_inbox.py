"""The alert inbox: Alertmanager alerts the webhook accepted, kept until the incident desk has filed them.

Accepting is one INSERT per webhook request, so Alertmanager hears 200 in milliseconds even in a storm of thousands
of alerts a minute; filing (correlation, the incident, its announcement) is the slow part and runs behind it
(argus/incidents/alert_filer.py). An alert leaves the inbox only after it was filed: an Argus killed in between files
it again when it starts (at least once: a repeat folds into the same incident, so it counts one occurrence more).

Each alert is claimed by the replica that accepted it, which files it. A replica renews its claims while it works
through its queue; the alerts of a replica whose claims went stale (it stopped) are taken over by another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, update

from argus.store.models import LEASE_HOLDER_MAX, AlertInboxRow
from argus.store.repository import transaction
from core.errors import InputError
from core.types import utcnow


@dataclass(frozen=True)
class QueuedAlert:
    id: int
    alert: dict[str, Any]  # the alert as the webhook validated it (Alertmanager's JSON)
    group_key: str
    received_at: datetime


class AlertInboxRepository:
    """The inbox. Thread-safe; the Store holds one as `store.alert_inbox`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def put(self, alerts: Sequence[dict[str, Any]], *, group_key: str, holder: str) -> tuple[list[int], int]:
        """Queue `alerts` (one request's), claimed by `holder`, in one transaction. Returns their ids, oldest first,
        and how many alerts of `holder` were waiting before them."""
        _check_holder(holder)
        if not alerts:
            return [], 0
        now = self._clock()
        rows = [{"received_at": now, "group_key": group_key[:1000], "alert": alert, "claimed_by": holder,
                 "claimed_at": now} for alert in alerts]
        with transaction(self._engine, "queueing Alertmanager alerts") as s:
            waiting = s.scalar(select(func.count()).select_from(AlertInboxRow)
                               .where(AlertInboxRow.claimed_by == holder)) or 0
            ids = list(s.scalars(insert(AlertInboxRow).returning(AlertInboxRow.id), rows))
        return sorted(ids), int(waiting)

    def claim(self, holder: str, *, limit: int = 100, stale_after_s: float = 60.0) -> list[QueuedAlert]:
        """The oldest `limit` alerts `holder` is to file. First renews all of `holder`'s claims (it is alive) and
        takes over the alerts whose claims nobody renewed for `stale_after_s` (their replica stopped)."""
        _check_holder(holder)
        if limit < 1 or stale_after_s <= 0:
            raise InputError(f"claim limit {limit} and stale_after_s {stale_after_s} must be positive",
                             hint="pass limit >= 1 and stale_after_s > 0")
        now = self._clock()
        stale = now - timedelta(seconds=stale_after_s)
        ageing = now - timedelta(seconds=stale_after_s / 3)  # renewed a third of the way, not on every claim
        row = AlertInboxRow.__table__.c
        with transaction(self._engine, "claiming queued alerts") as s:
            s.execute(update(AlertInboxRow).where(((row.claimed_by == holder) & (row.claimed_at < ageing))
                                                  | (row.claimed_at < stale))
                      .values(claimed_by=holder, claimed_at=now))
            found = s.scalars(select(AlertInboxRow).where(row.claimed_by == holder).order_by(row.id).limit(limit))
            return [QueuedAlert(r.id, dict(r.alert), r.group_key, r.received_at) for r in found]

    def done(self, ids: Sequence[int]) -> None:
        """Remove filed alerts."""
        if ids:
            with transaction(self._engine, "removing filed alerts") as s:
                s.execute(delete(AlertInboxRow).where(AlertInboxRow.id.in_(list(ids))))

    def depth(self, holder: str | None = None) -> int:
        """Alerts waiting to be filed (of `holder`, or of every replica)."""
        query = select(func.count()).select_from(AlertInboxRow)
        if holder is not None:
            query = query.where(AlertInboxRow.claimed_by == holder)
        with transaction(self._engine, "counting queued alerts", read_only=True) as s:
            return int(s.scalar(query) or 0)


def _check_holder(holder: str) -> None:
    if not holder or len(holder) > LEASE_HOLDER_MAX:
        raise InputError(f"alert inbox holder {holder[:40]!r} must be 1-{LEASE_HOLDER_MAX} characters",
                         hint="pass the replica id")
