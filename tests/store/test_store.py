"""The incident store against real databases: a SQLite file and a fresh PostgreSQL database (conftest).

One file past 400 lines on purpose: every test runs against both databases through one fixture."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from argus.store import migrate
from argus.store.columns import clean_text
from argus.store.models import Base
from argus.store.store import Store
from core.errors import ConfigError, InputError, NotFound, SourceUnavailable, StoreError
from core.types import (
    Action,
    ActionState,
    Category,
    Evidence,
    Finding,
    IncidentState,
    Report,
    Severity,
    Subject,
    SubjectKind,
)

TABLES = {"incidents", "findings", "actions", "reports", "api_tokens", "audit_log", "nodes", "node_transitions",
          "detector_state", "leases"}


def make_finding(
    subject_id: str = "raysubmit_abc",
    *,
    category: Category = Category.GPU_OOM,
    reason: str = "CudaOutOfMemory",
    summary: str = "CUDA out of memory in rank 3",
    severity: Severity = Severity.WARNING,
    evidence: tuple[Evidence, ...] = (),
    **kwargs,
) -> Finding:
    return Finding(
        category=category,
        reason=reason,
        subject=Subject(kind=SubjectKind.JOB, id=subject_id),
        summary=summary,
        severity=severity,
        evidence=evidence,
        **kwargs,
    )


def make_action(key: str, incident_id: str | None, **kwargs) -> Action:
    fields = dict(
        id="",
        incident_id=incident_id,
        kind="drain_node",
        target=Subject(kind=SubjectKind.NODE, id="node-1", name="10.0.0.7"),
        state=ActionState.PLANNED,
        idempotency_key=key,
        requested_by="policy",
        reason="Xid 79 on GPU 3",
    )
    fields.update(kwargs)
    return Action(**fields)


def run_together(n: int, call: Callable[[], Any]) -> list[Any]:
    """Start `call` in n threads at once; return the n results, failing on any thread's exception."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait(timeout=60)
        try:
            results.append(call())
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(results) == n
    return results


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- migrations ---------------------------------------------------------------------------------------


def test_migrations_up_down_and_match_models(db_url: str) -> None:
    assert migrate.current_revision(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.current_revision(db_url) == migrate.head_revision() == "0009"

    engine = migrate.open_engine(db_url)
    try:
        with engine.connect() as conn:
            assert TABLES <= set(inspect(conn).get_table_names())
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
            indexes = {ix["name"]: ix for ix in inspect(conn).get_indexes("incidents")}
            assert indexes["uq_incidents_open_fingerprint"]["unique"]
    finally:
        engine.dispose()

    migrate.downgrade(db_url, "base")
    assert migrate.current_revision(db_url) is None
    engine = migrate.open_engine(db_url)
    try:
        with engine.connect() as conn:
            assert not TABLES & set(inspect(conn).get_table_names())
    finally:
        engine.dispose()

    migrate.upgrade(db_url)
    assert migrate.current_revision(db_url) == "0009"


def test_store_keeps_data_across_restarts(db_url: str) -> None:
    first = Store(db_url)
    incident, _ = first.record_finding(make_finding())
    first.close()
    second = Store(db_url)  # auto-migrate on an up-to-date schema is a no-op
    try:
        assert second.get_incident(incident.id) == incident
    finally:
        second.close()


def test_stores_starting_together_migrate_once(db_url: str) -> None:
    # The API and the daemon may start at the same moment against a new database.
    stores = run_together(4, lambda: Store(db_url))
    try:
        assert migrate.current_revision(db_url) == "0009"
        incident, _ = stores[0].record_finding(make_finding())
        assert stores[3].get_incident(incident.id) == incident
    finally:
        for s in stores:
            s.close()


def test_without_auto_migrate_an_old_schema_is_refused(db_url: str) -> None:
    with pytest.raises(StoreError) as info:
        Store(db_url, auto_migrate=False)
    assert "argus db upgrade" in (info.value.hint or "")
    migrate.upgrade(db_url)
    Store(db_url, auto_migrate=False).close()


def test_unknown_revision_is_a_store_error(db_url: str) -> None:
    with pytest.raises(StoreError, match="no-such-rev"):
        migrate.upgrade(db_url, "no-such-rev")


# ---- dedup --------------------------------------------------------------------------------------------


def test_same_fingerprint_is_one_incident(store: Store, clock) -> None:
    first, opened = store.record_finding(make_finding(first_seen=clock.now, detected_at=clock.now))
    assert opened
    assert first.id.startswith("inc-") and len(first.id) == 16
    assert first.state is IncidentState.OPEN and first.occurrences == 1
    assert first.detected_at == clock.now

    later = clock.now + timedelta(minutes=5)
    again, opened = store.record_finding(
        make_finding(severity=Severity.CRITICAL, detected_at=later, recommended_action="smaller batch")
    )
    assert not opened
    assert again.id == first.id
    assert again.occurrences == 2
    assert again.last_seen == later
    assert again.severity is Severity.CRITICAL
    assert again.recommended_action == "smaller batch"

    # A milder repeat never lowers the severity.
    third, _ = store.record_finding(make_finding(severity=Severity.INFO))
    assert third.severity is Severity.CRITICAL and third.occurrences == 3
    assert store.list_incidents() == [third]
    assert store.find_open(first.fingerprint) == third


def test_after_resolve_a_new_incident_opens(store: Store, clock) -> None:
    old, _ = store.record_finding(make_finding())
    clock.tick(60)
    resolved = store.set_state(old.id, IncidentState.RESOLVED)
    assert resolved.state is IncidentState.RESOLVED and resolved.resolved_at == clock.now
    assert store.find_open(old.fingerprint) is None

    clock.tick(60)
    new, opened = store.record_finding(make_finding())
    assert opened and new.id != old.id and new.occurrences == 1
    assert store.find_open(old.fingerprint) == new
    assert [i.id for i in store.list_incidents(state=IncidentState.RESOLVED)] == [old.id]

    # Reopening the old one would make two open incidents for one fingerprint.
    with pytest.raises(InputError, match=new.id):
        store.set_state(old.id, IncidentState.OPEN)
    store.set_state(new.id, "resolved")
    reopened = store.set_state(old.id, IncidentState.MITIGATING)
    assert reopened.state is IncidentState.MITIGATING and reopened.resolved_at is None


def test_concurrent_records_of_one_fingerprint_open_one_incident(store: Store) -> None:
    threads_n, rounds = 8, 3
    for round_ in range(rounds):
        finding = make_finding(f"raysubmit_race_{round_}")
        results = run_together(threads_n, lambda finding=finding: store.record_finding(finding))
        assert sum(opened for _, opened in results) == 1
        assert len({incident.id for incident, _ in results}) == 1
        assert store.get_incident(results[0][0].id).occurrences == threads_n
        assert len(store.findings_for(results[0][0].id)) == 1
    assert len(store.list_incidents()) == rounds


def test_repeats_add_finding_rows_only_when_new_and_up_to_the_cap(store: Store) -> None:
    incident, _ = store.record_finding(make_finding())
    for _ in range(10):
        store.record_finding(make_finding())
    assert len(store.findings_for(incident.id)) == 1

    store.record_finding(make_finding(reason="CudaOomInBackward"))
    assert [f.reason for f in store.findings_for(incident.id)] == ["CudaOutOfMemory", "CudaOomInBackward"]

    for n in range(80):
        evidence = (Evidence(source="/tmp/ray/logs/job.log", text=f"OOM at step {n}", line=n),)
        store.record_finding(make_finding(evidence=evidence))
    findings = store.findings_for(incident.id)
    assert len(findings) == 50
    assert findings[2].evidence[0].text == "OOM at step 0"
    assert store.get_incident(incident.id).occurrences == 1 + 10 + 1 + 80


def test_findings_round_trip(store: Store) -> None:
    at = datetime(2025, 3, 1, 20, 0, tzinfo=timezone(timedelta(hours=8)))
    finding = make_finding(
        evidence=(Evidence(source="job.log", text="CUDA out of memory", line=12, at=at, value=3.5),),
        first_seen=at,
        confidence=0.8,
        attrs={"rank": 3, "hosts": ["a", "b"]},
    )
    incident, _ = store.record_finding(finding)
    (stored,) = store.findings_for(incident.id)
    assert stored == finding
    assert stored.first_seen.tzinfo is not None and stored.first_seen.utcoffset() == timedelta(0)
    assert incident.first_seen == at


# ---- queries ------------------------------------------------------------------------------------------


def test_filters_and_pagination(store: Store, clock) -> None:
    opened = []
    for n in range(7):
        clock.tick(10)
        category = Category.NODE_LOST if n % 2 else Category.GPU_OOM
        incident, _ = store.record_finding(make_finding(f"raysubmit_{n}", category=category, detected_at=clock.now))
        opened.append(incident)
    store.set_state(opened[0].id, IncidentState.RESOLVED)
    store.set_state(opened[1].id, IncidentState.MITIGATING)

    newest_first = [i.id for i in reversed(opened)]
    assert [i.id for i in store.list_incidents()] == newest_first
    pages = [store.list_incidents(limit=3, offset=o) for o in (0, 3, 6, 9)]
    assert [len(p) for p in pages] == [3, 3, 1, 0]
    assert [i.id for page in pages for i in page] == newest_first

    assert [i.id for i in store.list_incidents(state=IncidentState.RESOLVED)] == [opened[0].id]
    assert [i.id for i in store.list_incidents(state="mitigating")] == [opened[1].id]
    assert len(store.list_incidents(state=IncidentState.OPEN)) == 5
    assert {i.category for i in store.list_incidents(category=Category.NODE_LOST)} == {Category.NODE_LOST}
    assert len(store.list_incidents(category="node_lost")) == 3
    assert [i.id for i in store.list_incidents(subject_id="raysubmit_4")] == [opened[4].id]
    assert store.list_incidents(subject_id="raysubmit_none") == []
    assert [i.id for i in store.list_incidents(since=opened[5].last_seen)] == newest_first[:2]
    assert len(store.list_incidents(category=Category.GPU_OOM, state=IncidentState.OPEN, limit=2)) == 2

    with pytest.raises(InputError):
        store.list_incidents(limit=0)
    with pytest.raises(InputError):
        store.list_incidents(offset=-1)
    with pytest.raises(InputError, match="open, mitigating, resolved"):
        store.list_incidents(state="closed")
    with pytest.raises(InputError):
        store.list_incidents(category="meltdown")


def test_unknown_ids_are_not_found(store: Store) -> None:
    missing = "inc-000000000000"
    for call in (
        lambda: store.get_incident(missing),
        lambda: store.findings_for(missing),
        lambda: store.set_state(missing, IncidentState.RESOLVED),
        lambda: store.reports_for(missing),
        lambda: store.list_actions(incident_id=missing),
        lambda: store.add_action(make_action("k1", missing)),
        lambda: store.update_action("act-000000000000", ActionState.RUNNING),
        lambda: store.get_action("act-000000000000"),
        lambda: store.get_incident("inc-\x00'; DROP TABLE incidents; --"),
    ):
        with pytest.raises(NotFound) as info:
            call()
        assert info.value.hint
    assert store.find_open("no-such-fingerprint") is None
    assert store.list_incidents() == []


# ---- actions and reports ------------------------------------------------------------------------------


def test_actions_are_idempotent_by_key(store: Store, clock) -> None:
    incident, _ = store.record_finding(make_finding())
    first = store.add_action(make_action("drain:node-1:inc", incident.id))
    assert first.id.startswith("act-") and first.state is ActionState.PLANNED
    # Same key, different everything else: the first action comes back, no second one is stored.
    again = store.add_action(make_action("drain:node-1:inc", incident.id, kind="stop_job", id="act-other"))
    assert again == first
    assert store.list_actions() == [first]

    clock.tick(30)
    done = store.update_action(first.id, ActionState.SUCCEEDED, {"drained": True, "at": clock.now})
    assert done.state is ActionState.SUCCEEDED
    assert done.result["drained"] is True
    assert datetime.fromisoformat(done.result["at"]) == clock.now  # datetimes in JSON become ISO text
    assert done.updated_at == clock.now and done.created_at == first.created_at
    assert store.update_action(first.id, "running").result == done.result
    assert store.get_action(first.id).state is ActionState.RUNNING

    other = store.add_action(make_action("keep_scene:job", None, id="act-given00000"))
    assert other.id == "act-given00000" and other.incident_id is None
    assert [a.id for a in store.list_actions(incident_id=incident.id)] == [first.id]
    assert len(store.list_actions()) == 2
    with pytest.raises(InputError, match="act-given00000"):
        store.add_action(make_action("another-key", None, id="act-given00000"))
    with pytest.raises(InputError):
        store.update_action(first.id, "exploded")


def test_concurrent_adds_of_one_key_store_one_action(store: Store) -> None:
    incident, _ = store.record_finding(make_finding())
    results = run_together(6, lambda: store.add_action(make_action("resubmit:raysubmit_abc", incident.id)))
    assert len({a.id for a in results}) == 1
    assert len(store.list_actions()) == 1


def test_reports(store: Store, clock) -> None:
    incident, _ = store.record_finding(make_finding())
    first = store.add_report(
        Report(
            id="",
            incident_id=incident.id,
            category=Category.GPU_OOM,
            confidence=0.9,
            summary="rank 3 ran out of GPU memory",
            markdown="# GPU OOM\n\n| rank | GiB |\n|---|---|\n| 3 | 79.6 |\n",
            generator="deterministic",
            created_at=clock.now,
            data={"ranks": [3], "peak_gib": 79.6},
        )
    )
    assert first.id.startswith("rep-")
    second = store.add_report(first.model_copy(update={"id": "", "generator": "gpt-x", "created_at": clock.tick()}))
    assert store.reports_for(incident.id) == [first, second]
    assert first.data == {"ranks": [3], "peak_gib": 79.6}
    with pytest.raises(NotFound):
        store.add_report(first.model_copy(update={"id": "", "incident_id": "inc-000000000000"}))


# ---- hostile input ------------------------------------------------------------------------------------


def test_clean_text_replaces_nul_and_lone_surrogates_only() -> None:
    assert clean_text("a\x00b") == "a\ufffdb"
    assert clean_text("x\ud800y") == "x\ufffdy"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a valid pair joins into one character
    plain = "日本語 ✓ \U0001f600"
    assert clean_text(plain) is plain


def test_hostile_text_is_stored_and_read_back(store: Store) -> None:
    huge = "Ω≈ç√ 日本語 العربية \U0001f525 " + "x" * 100_000
    summary = f'{huge}\x00tail \ud800 \'; DROP TABLE incidents; -- "quoted" \\ back'
    evidence = (
        Evidence(source="/tmp/ray/logs/worker\x00.log", text=huge + "\x00" * 3, value=float("inf")),
        Evidence(source="dmesg", text="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\r\n\t"),
    )
    finding = make_finding(
        summary=summary,
        evidence=evidence,
        recommended_action="\x00drain",
        attrs={"k\x00ey": ["v\x00", float("nan"), {"nested": "\ud800"}], "when": datetime(2025, 1, 1)},
    )
    incident, _ = store.record_finding(finding)
    expected_summary = summary.replace("\x00", "\ufffd").replace("\ud800", "\ufffd")
    assert incident.summary == expected_summary
    assert incident.recommended_action == "\ufffddrain"
    assert incident.attrs == {"k\ufffdey": ["v\ufffd", None, {"nested": "\ufffd"}], "when": "2025-01-01T00:00:00"}

    reread = store.get_incident(incident.id)
    assert reread == incident
    (stored,) = store.findings_for(incident.id)
    assert stored.summary == expected_summary
    assert stored.evidence[0].source == "/tmp/ray/logs/worker\ufffd.log"
    assert stored.evidence[0].text == huge + "\ufffd" * 3
    assert stored.evidence[0].value is None  # infinity is not JSON
    assert stored.evidence[1] == evidence[1]

    # The same hostile text works as a filter value.
    assert store.list_incidents(subject_id="job\x00\ud800") == []
    assert store.find_open("fp\x00") is None


def test_long_fingerprint_is_refused(store: Store) -> None:
    with pytest.raises(InputError, match="fingerprint"):
        store.record_finding(make_finding(fingerprint="f" * 300))


# ---- connecting ---------------------------------------------------------------------------------------


def test_unreachable_postgres_is_source_unavailable_with_password_masked() -> None:
    url = f"postgresql+psycopg2://argus:hunter2-secret@127.0.0.1:{closed_port()}/argus"
    for attempt in (lambda: Store(url), lambda: migrate.upgrade(url), lambda: migrate.current_revision(url)):
        with pytest.raises(SourceUnavailable) as info:
            attempt()
        err = info.value
        assert err.thing == "database"
        assert "hunter2-secret" not in str(err) and "hunter2-secret" not in repr(err)
        assert "hunter2-secret" not in err.address and "***" in err.address
        assert "127.0.0.1" in str(err) and "PostgreSQL is running" in (err.hint or "")


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "postgresql://argus:hunter2-secret@db:notaport/argus",
        "mysql://argus:hunter2-secret@db/argus",
        "postgresql+nosuchdriver://argus:hunter2-secret@db/argus",
        "sqlite://",
        "sqlite:///:memory:",
    ],
)
def test_bad_url_is_config_error_naming_the_setting(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Store(url)
    assert "ARGUS_DATABASE_URL" in str(info.value)
    assert "hunter2-secret" not in str(info.value)


def test_sqlite_uses_wal_and_creates_its_folder(tmp_path) -> None:
    path = tmp_path / "deep" / "er" / "argus.db"
    store = Store(f"sqlite:///{path}")
    try:
        assert path.exists()
        engine = migrate.open_engine(f"sqlite:///{path}")
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        engine.dispose()
    finally:
        store.close()


def _node_lost(reason: str, node: str = "a" * 56, **attrs: Any) -> Finding:
    return Finding(category=Category.NODE_LOST, reason=reason, severity=Severity.CRITICAL,
                   subject=Subject(kind=SubjectKind.NODE, id=node, name="10.0.0.4"), summary=f"node died ({reason})",
                   attrs={"node_ip": "10.0.0.4", **attrs})


def test_a_lost_node_incident_opened_without_its_jobs_learns_them_from_a_later_finding(store: Store) -> None:
    jobs = [{"submission_id": "grpo-1", "status": "RUNNING"}]
    incident, _ = store.record_finding(_node_lost("NodeMarkedDead"))  # a log line: no jobs known
    assert "jobs" not in incident.attrs
    other = store.attach_finding(incident.id, _node_lost("RayNodeDead", node="b" * 56, jobs=[{"submission_id": "x"}]))
    assert "jobs" not in other.attrs  # another node's jobs are not this incident's
    learned = store.attach_finding(incident.id, _node_lost("RayNodeDead", jobs=jobs))
    assert learned.attrs["jobs"] == jobs and store.get_incident(incident.id).attrs["jobs"] == jobs
    kept = store.attach_finding(incident.id, _node_lost("RayNodeDead2", jobs=[{"submission_id": "later"}]))
    assert kept.attrs["jobs"] == jobs  # what the incident knew stays
