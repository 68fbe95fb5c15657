"""control.queue.QueueStore kept in the store's database: the job queue survives restarts, and replicas share it.

A move is a compare-and-set (UPDATE ... WHERE state = the state it was seen in): of two replicas admitting one job,
exactly one moves it from queued to started and submits it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, exc, select, update

from argus.store.models import QueuedJobRow
from argus.store.repository import check_limit, transaction
from control.admission import Gang
from control.queue import QueueEntry, QueueState
from core.errors import Conflict, NotFound, StoreError
from core.types import utcnow


def _entry(row: QueuedJobRow) -> QueueEntry:
    return QueueEntry(
        position=row.id, submission_id=row.submission_id, owner=row.owner,
        gang=Gang(nnodes=row.nnodes, gpus_per_node=row.gpus_per_node, pool=row.pool), request=dict(row.request),
        state=QueueState(row.state), reason=row.reason, enqueued_at=row.enqueued_at, timeout_s=row.timeout_s,
        started_at=row.started_at, ended_at=row.ended_at, ray_status=row.ray_status)


class JobQueueRepository:
    """The queue's rows. Thread-safe; the Store holds one as `store.job_queue`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def add(self, entry: QueueEntry) -> QueueEntry:
        row = QueuedJobRow(
            submission_id=entry.submission_id, owner=entry.owner, pool=entry.gang.pool, nnodes=entry.gang.nnodes,
            gpus_per_node=entry.gang.gpus_per_node, request=entry.request, state=entry.state.value,
            reason=entry.reason, timeout_s=entry.timeout_s, enqueued_at=entry.enqueued_at)
        try:
            with transaction(self._engine, "queueing a job") as s:
                s.add(row)
                s.flush()
                s.refresh(row)
                return _entry(row)
        except StoreError as err:
            if isinstance(err.__cause__, exc.IntegrityError):
                raise Conflict(f"job {entry.submission_id} is already in the queue",
                               hint="choose another submission_id, or leave it out to get a generated one") from None
            raise

    def get(self, submission_id: str) -> QueueEntry:
        with transaction(self._engine, "reading a queued job", read_only=True) as s:
            row = s.scalar(select(QueuedJobRow).where(QueuedJobRow.submission_id == submission_id))
            if row is None:
                raise NotFound(f"job {submission_id} was never queued",
                               hint="GET /v1/jobs/queue lists the queue; jobs started outside Argus are not in it")
            return _entry(row)

    def list(self, *, states: Sequence[QueueState] | None = None, owner: str | None = None,
             limit: int = 1000) -> builtins.list[QueueEntry]:
        """Oldest first; `states` and `owner` narrow it."""
        check_limit(limit)
        query = select(QueuedJobRow)
        if states is not None:
            query = query.where(QueuedJobRow.state.in_([s.value for s in states]))
        if owner is not None:
            query = query.where(QueuedJobRow.owner == owner)
        with transaction(self._engine, "listing the job queue", read_only=True) as s:
            return [_entry(r) for r in s.scalars(query.order_by(QueuedJobRow.id.desc()).limit(limit))][::-1]

    def move(self, submission_id: str, from_state: QueueState, to_state: QueueState, *, reason: str,
             at: datetime | None = None, ray_status: str | None = None) -> QueueEntry | None:
        at = at or self._clock()
        values: dict[str, Any] = {"state": to_state.value, "reason": reason[:4000]}
        if to_state is QueueState.STARTED:
            values["started_at"] = at
        else:
            values["ended_at"] = at
        if ray_status is not None:
            values["ray_status"] = ray_status
        with transaction(self._engine, "moving a queued job") as s:
            done = s.execute(update(QueuedJobRow).where(QueuedJobRow.submission_id == submission_id,
                                                        QueuedJobRow.state == from_state.value).values(**values))
            if not getattr(done, "rowcount", 0):  # a CursorResult: the rows the compare-and-set moved
                return None
            row = s.scalar(select(QueuedJobRow).where(QueuedJobRow.submission_id == submission_id))
            return _entry(row) if row is not None else None

    def note(self, submission_id: str, *, reason: str | None = None, ray_status: str | None = None) -> None:
        values: dict[str, Any] = {}
        if reason is not None:
            values["reason"] = reason[:4000]
        if ray_status is not None:
            values["ray_status"] = ray_status[:16]
        if values:
            with transaction(self._engine, "noting a queued job's reason") as s:
                s.execute(update(QueuedJobRow).where(QueuedJobRow.submission_id == submission_id).values(**values))
