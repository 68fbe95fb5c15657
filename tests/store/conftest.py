"""Every store test runs twice: on a SQLite file in tmp_path and on a fresh PostgreSQL database.

The PostgreSQL server is the one on 127.0.0.1:5432 (user postgres, trust auth). Each test gets its own
database with a random name, dropped with FORCE afterwards, so test runs can share the server.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, exc, text

from argus.store.store import Store

PG_SERVER = "postgresql+psycopg2://postgres@127.0.0.1:5432"


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[object]:
    engine = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except exc.OperationalError as err:
        engine.dispose()
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {str(err.orig).strip()}")
    yield engine
    engine.dispose()


def _postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    admin = request.getfixturevalue("pg_admin")
    name = f"argus_test_{secrets.token_hex(6)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        # A folder that does not exist yet: the store must create it.
        yield f"sqlite:///{tmp_path / 'state' / 'argus.db'}"
    else:
        yield from _postgres_url(request)


class Clock:
    """A clock the test moves by hand, so ordering by time is deterministic without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db_url: str, clock: Clock) -> Iterator[Store]:
    s = Store(db_url, clock=clock)
    yield s
    s.close()
