"""Named leases in the store: of several Argus replicas sharing one database, the one holding the lease leads.

`acquire(name, holder, ttl_s)` is one compare-and-set: the row is taken (or renewed) only where it is free, expired
or already the caller's, in a single UPDATE, so of two replicas trying at once exactly one holds it; PostgreSQL
re-checks the WHERE against the winner's committed row, SQLite runs writers one at a time. The first acquire of a
name inserts its row (a lost insert race retries as an update). `term` goes up by one each time the lease changes
hands.

Times are the replicas' own clocks (the store's clock): a lease's TTL must be well above the replicas' clock skew
(`argus doctor` checks it against the database's clock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import CursorResult, Engine, case, exc, select, update

from argus.store.models import LEASE_HOLDER_MAX, LEASE_NAME_MAX, LeaseRow
from argus.store.repository import transaction
from core.errors import InputError, StoreError
from core.types import utcnow


@dataclass(frozen=True)
class Lease:
    """A lease as the store holds it after an acquire, and whether the caller holds it."""

    name: str
    holder: str
    term: int
    acquired_at: datetime
    expires_at: datetime
    held: bool  # by the caller of acquire()


class LeaseRepository:
    """Leases. Thread-safe; the Store holds one as `store.leases`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def acquire(self, name: str, holder: str, ttl_s: float) -> Lease:
        """Take or renew `name` for `holder` until now + ttl_s where it is free, expired or the holder's own; the
        lease as it stands either way (`held` says whether `holder` has it)."""
        _check(name, holder, ttl_s)
        now = self._clock()
        until = now + timedelta(seconds=ttl_s)
        row = LeaseRow.__table__.c
        mine = row.holder == holder
        taking = (
            update(LeaseRow)
            .where(row.name == name, mine | (row.expires_at < now))
            .values(holder=holder, term=case((mine, row.term), else_=row.term + 1),
                    acquired_at=case((mine, row.acquired_at), else_=now), renewed_at=now, expires_at=until)
        )
        with transaction(self._engine, f"taking lease {name}") as s:
            s.execute(taking)
        lease = self.get(name)
        if lease is None:  # nobody took this lease yet
            try:
                with transaction(self._engine, f"creating lease {name}") as s:
                    s.add(LeaseRow(name=name, holder=holder, term=1, acquired_at=now, renewed_at=now,
                                   expires_at=until))
            except StoreError as err:
                if not isinstance(err.__cause__, exc.IntegrityError):
                    raise
                # another replica created it first: it holds it
            lease = self.get(name)
            assert lease is not None  # created just now, and leases are never deleted
        return Lease(lease.name, lease.holder, lease.term, lease.acquired_at, lease.expires_at,
                     held=lease.holder == holder and lease.expires_at >= now)

    def release(self, name: str, holder: str) -> bool:
        """Give the lease up now if `holder` has it (a replica stopping cleanly): another takes it at once."""
        _check(name, holder, 1.0)
        now = self._clock()
        row = LeaseRow.__table__.c
        with transaction(self._engine, f"releasing lease {name}") as s:
            result: CursorResult[Any] = s.execute(  # type: ignore[assignment]
                update(LeaseRow).where(row.name == name, row.holder == holder)
                .values(expires_at=now - timedelta(seconds=1), renewed_at=now))
            return result.rowcount == 1

    def get(self, name: str) -> Lease | None:
        """The lease's row as stored (`held`: not expired, by anyone), or None before anyone took it."""
        with transaction(self._engine, f"reading lease {name}", read_only=True) as s:
            row = s.execute(select(LeaseRow).where(LeaseRow.name == name)).scalar_one_or_none()
        if row is None:
            return None
        return Lease(row.name, row.holder, row.term, row.acquired_at, row.expires_at,
                     held=row.expires_at >= self._clock())


def _check(name: str, holder: str, ttl_s: float) -> None:
    if not name or len(name) > LEASE_NAME_MAX:
        raise InputError(f"lease name {name[:80]!r} must be 1 to {LEASE_NAME_MAX} characters", hint="e.g. argus-leader")
    if not holder or len(holder) > LEASE_HOLDER_MAX:
        raise InputError(f"lease holder {holder[:80]!r} must be 1 to {LEASE_HOLDER_MAX} characters",
                         hint="set replica_id to a short name, e.g. the host's")
    if not 0 < ttl_s <= 3600:
        raise InputError(f"lease TTL {ttl_s} s must be in (0, 3600]", hint="e.g. 10")
