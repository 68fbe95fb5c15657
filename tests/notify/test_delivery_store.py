"""The delivery log in the store, on SQLite and on PostgreSQL (the store tests' `db_url`), and its migration."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from argus.store import migrate
from argus.store.models import Base
from argus.store.store import Store
from core.errors import InputError


def test_record_sent_and_list(db_url: str, clock):
    store = Store(db_url, clock=clock)
    try:
        failed = store.record_delivery(key="inc-1:opened:feishu:-", incident_id="inc-1", event="opened",
                                       channel="feishu", ok=False, attempts=3, status=None,
                                       error="ConnectError: [Errno 111] Connection refused\x00",
                                       detail={"kind": "message"})
        assert not store.delivery_sent("inc-1:opened:feishu:-")  # a failure is not a delivery
        clock.tick(5)
        ok = store.record_delivery(key="inc-1:opened:feishu:-", incident_id="inc-1", event="opened", channel="feishu",
                                   ok=True, attempts=1, status=200, detail={"kind": "digest", "grouped": "3 grouped"})
        store.record_delivery(key="inc-2:opened:slack:-", incident_id="inc-2", event="opened", channel="slack",
                              ok=True, attempts=1, status=200)
        assert store.delivery_sent("inc-1:opened:feishu:-") and store.delivery_sent("inc-2:opened:slack:-")
        assert not store.delivery_sent("inc-1:opened:slack:-")
        assert failed.error == "ConnectError: [Errno 111] Connection refused\ufffd"  # NUL cleaned, as everywhere
        assert [r.id for r in store.list_deliveries(incident_id="inc-1")] == [ok.id, failed.id]  # newest first
        assert len(store.list_deliveries()) == 3 and len(store.list_deliveries(limit=1)) == 1
        assert ok.at > failed.at and ok.detail == {"kind": "digest", "grouped": "3 grouped"}
        with pytest.raises(InputError, match="out of range"):
            store.list_deliveries(limit=0)
        with pytest.raises(InputError, match="delivery key"):
            store.record_delivery(key="k" * 256, incident_id=None, event="opened", channel="x", ok=True, attempts=1)
    finally:
        store.close()


def test_migration_0004_adds_and_drops_the_table(db_url: str):
    migrate.upgrade(db_url)
    engine = migrate.open_engine(db_url)
    try:
        assert "notification_deliveries" in inspect(engine).get_table_names()
        with engine.connect() as conn:  # the migration builds exactly what models.py declares
            assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
        migrate.downgrade_engine(engine, "0003")
        assert "notification_deliveries" not in inspect(engine).get_table_names()
        assert "nodes" in inspect(engine).get_table_names()  # 0003's tables stay
        migrate.upgrade_engine(engine)
        assert migrate.revision_of(engine) == migrate.head_revision()
    finally:
        engine.dispose()
