"""What the store's repositories share: one short transaction per call, new ids, the retry after a lost
insert race, and the checks of list limits and enum inputs.

Every repository takes the store's engine and clock (see Store); each call opens its own transaction, so
one repository is shared safely by the API and the daemon threads.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar

from loguru import logger
from sqlalchemy import Engine, exc
from sqlalchemy.orm import Session

from argus.store import migrate
from core.errors import InputError, StoreError

MAX_LIST_LIMIT = 1000
# Losing an insert race (two callers opening one incident, storing one idempotency key) raises an
# IntegrityError; the retry then finds the winner's row.
RACE_ATTEMPTS = 5

T = TypeVar("T")
E = TypeVar("E", bound=Enum)


def new_id(prefix: str) -> str:
    """A short readable id: "inc-", "act-", "rep-" or "tok-" and 12 hex characters."""
    return f"{prefix}-{secrets.token_hex(6)}"


@contextmanager
def transaction(engine: Engine, doing: str, *, read_only: bool = False) -> Iterator[Session]:
    """A Session in one committed transaction; database errors leave as core.errors naming `doing`. `read_only`:
    it only reads (see migrate.connected); a write in it fails on SQLite."""
    with migrate.connected(engine, doing, read_only=read_only) as conn:
        # The Session works inside the connection's transaction, which `connected` commits and
        # whose errors it wraps; rows are re-read after writes (`saved`) so callers get what the
        # database holds: cleaned text, UTC times.
        with Session(bind=conn, expire_on_commit=False, join_transaction_mode="rollback_only") as s:
            yield s
            s.flush()


def saved(s: Session, row: T) -> T:
    """`row` as the database now holds it."""
    s.flush()
    s.refresh(row)
    return row


def retry_lost_races(call: Callable[[], T], *, retrying: str | None = None) -> T:
    """`call()`, again after an IntegrityError (up to RACE_ATTEMPTS in all); `retrying` is logged on each retry."""
    for attempt in range(1, RACE_ATTEMPTS + 1):
        try:
            return call()
        except StoreError as err:
            if not isinstance(err.__cause__, exc.IntegrityError) or attempt == RACE_ATTEMPTS:
                raise
            if retrying:
                logger.debug(retrying)
    raise AssertionError("unreachable")


def parse_enum(kind: type[E], value: Any, name: str) -> E:
    """`value` as a member of `kind`; InputError naming `name` and the allowed values if it is none."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise InputError(f"{name} {value!r} is not one of {allowed}", hint=f"use one of {allowed}") from None


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InputError(f"limit {limit} is out of range", hint=f"use 1 to {MAX_LIST_LIMIT}")
