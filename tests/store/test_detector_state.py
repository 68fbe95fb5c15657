"""Detector state in the store (core.ports.DetectorMemory), on a SQLite file and a fresh PostgreSQL database
(tests/store/conftest.py): what is saved is loaded back, None forgets, a detector's keys are capped, bad input is
refused whole, and a corrupted row costs only its own key."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from argus.store import migrate
from argus.store.detector_state import MAX_VALUE_CHARS, DetectorStateRepository
from argus.store.models import Base
from argus.store.store import Store
from core.errors import InputError
from core.ports import DetectorMemory


def test_saved_state_loads_back_after_a_restart_and_none_forgets(db_url: str, clock) -> None:
    first = Store(db_url, clock=clock)
    try:
        assert isinstance(first.detector_state, DetectorMemory)
        assert first.detector_state.load_all("stall") == {}
        first.detector_state.save("stall", {"job-a": {"v": 1, "gaps": [1.5, 2.0], "line": "step 12 \x00"},
                                            "job-b": {"v": 1, "nested": {"x": None}}})
        first.detector_state.save("idle_gpu", {"job-a": {"v": 1, "idle_since": "2026-05-01T12:00:00+00:00"}})
        clock.tick(5)
        first.detector_state.save("stall", {"job-b": {"v": 1, "nested": {"x": 2}}, "job-a": None,
                                            "never-saved": None})
    finally:
        first.close()
    second = Store(db_url, clock=clock)  # a restart: a new store on the same database
    try:
        assert second.detector_state.load_all("stall") == {"job-b": {"v": 1, "nested": {"x": 2}}}
        # per detector: the stall detector forgetting job-a leaves the idle detector's job-a alone
        assert second.detector_state.load_all("idle_gpu") == {
            "job-a": {"v": 1, "idle_since": "2026-05-01T12:00:00+00:00"}}
        second.detector_state.save("stall", {"job-a": {"line": "step 12 \x00"}})
        assert second.detector_state.load_all("stall")["job-a"] == {"line": "step 12 \ufffd"}  # NUL cleaned
    finally:
        second.close()


def test_a_detector_keeps_at_most_its_cap_dropping_the_least_recently_saved(db_url: str, clock) -> None:
    store = Store(db_url, clock=clock)
    try:
        capped = DetectorStateRepository(store._engine, clock=clock, max_keys=3)
        for n in range(4):
            capped.save("stall", {f"job-{n}": {"n": n}})
            clock.tick(1)
        capped.save("stall", {"job-0": {"n": 0}})  # saved again: now the most recent
        capped.save("idle_gpu", {"job-9": {"n": 9}})  # another detector's keys count apart
        clock.tick(1)
        capped.save("stall", {"job-4": {"n": 4}})
        assert sorted(capped.load_all("stall")) == ["job-0", "job-3", "job-4"]
        assert list(capped.load_all("idle_gpu")) == ["job-9"]
    finally:
        store.close()


def test_bad_input_is_refused_whole_with_the_key_named(db_url: str, clock) -> None:
    store = Store(db_url, clock=clock)
    memory = store.detector_state
    try:
        memory.save("stall", {"job-a": {"n": 1}})
        with pytest.raises(InputError, match="state of 'job-b' is not JSON"):
            memory.save("stall", {"job-a": {"n": 2}, "job-b": {"when": object()}})
        with pytest.raises(InputError, match=f"over the {MAX_VALUE_CHARS}"):
            memory.save("stall", {"job-a": {"n": 3}, "job-c": {"text": "x" * MAX_VALUE_CHARS}})
        with pytest.raises(InputError, match="not a dict"):
            memory.save("stall", {"job-a": [1, 2]})  # type: ignore[dict-item]
        with pytest.raises(InputError, match="state key"):
            memory.save("stall", {"": {"n": 1}})
        with pytest.raises(InputError, match="detector name"):
            memory.load_all("d" * 65)
        assert memory.load_all("stall") == {"job-a": {"n": 1}}  # nothing of a refused call was saved
    finally:
        store.close()


def test_a_corrupted_row_costs_only_its_own_key(db_url: str, clock) -> None:
    store = Store(db_url, clock=clock)
    try:
        store.detector_state.save("stall", {"good": {"n": 1}, "bad": {"n": 2}, "list": {"n": 3}})
        with store._engine.begin() as conn:  # as a person editing the table, or a write cut short, would
            conn.execute(text("UPDATE detector_state SET value = '{\"n\": 2, ' WHERE key = 'bad'"))
            conn.execute(text("UPDATE detector_state SET value = '[3]' WHERE key = 'list'"))
        assert store.detector_state.load_all("stall") == {"good": {"n": 1}}
        store.detector_state.save("stall", {"bad": {"n": 4}})  # a fresh save replaces the broken row
        assert store.detector_state.load_all("stall") == {"good": {"n": 1}, "bad": {"n": 4}}
    finally:
        store.close()


def test_migration_0005_adds_and_drops_the_table(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = migrate.open_engine(db_url)
    try:
        assert "detector_state" in inspect(engine).get_table_names()
        with engine.connect() as conn:  # the migration builds exactly what models.py declares
            assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
        migrate.downgrade_engine(engine, "0004")
        assert "detector_state" not in inspect(engine).get_table_names()
        assert "notification_deliveries" in inspect(engine).get_table_names()  # 0004's table stays
        migrate.upgrade_engine(engine)
        assert migrate.revision_of(engine) == migrate.head_revision()
    finally:
        engine.dispose()
