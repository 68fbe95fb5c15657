"""A flapping incident in IM: told at most once per renotify interval per channel, the changes held back folded into
the next message, the final state always told. The five platforms are real local receivers, the Store is the real
SQLite one (its delivery log keeps the interval across a restart), and the clock is moved by hand."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from argus.store.store import Store
from core.types import Category, Finding, Incident, IncidentState, Severity, Subject, SubjectKind
from tests.notify.conftest import KINDS, configs, open_incident
from tests.notify.platforms import digest_text

# Short, so the hand-moved clock stays within the 5 minutes the signed webhook receiver allows its timestamps.
INTERVAL_S = 120.0
WINDOW_S = 1800.0


def comes_back(store: Store, n: int = 0) -> Incident:
    """The fault of `open_incident(store, n)` seen again (the same category and job): reopens it when resolved."""
    finding = Finding(category=Category.GPU_OOM, reason="CudaOutOfMemory", severity=Severity.CRITICAL,
                      subject=Subject(kind=SubjectKind.JOB, id=f"raysubmit_{n:04d}"), summary="CUDA OOM again")
    incident, recorded = store.file_finding(finding, reopen_within_s=WINDOW_S)
    assert recorded == "reopened"
    return incident


def counts(platforms) -> set[int]:
    return {len(p.received) for p in platforms.values()}


def test_a_flapping_incident_is_told_once_per_interval_with_what_was_held_back(platforms, store, make_dispatcher,
                                                                               clock):
    dispatcher = make_dispatcher(configs(platforms), renotify_interval_s=INTERVAL_S)
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened")
    clock.tick(10)
    assert dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED), "resolved")
    told_at = clock.now
    assert counts(platforms) == {2}  # the opening and the first resolve go at once: nothing flapped yet

    for n in (1, 2):  # back, resolved, back, resolved: within minutes
        clock.tick(10)
        reopened = comes_back(store)
        assert reopened.reopened == n
        assert dispatcher.notify(reopened, "updated")
        clock.tick(10)
        assert dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED), "resolved")
    assert counts(platforms) == {2} and set(dispatcher.pending().values()) == {1}

    clock.now = told_at + timedelta(seconds=INTERVAL_S - 1)
    assert dispatcher.flush() and counts(platforms) == {2}
    clock.tick(2)
    assert dispatcher.flush() and counts(platforms) == {3}
    assert set(dispatcher.pending().values()) == {0}

    for kind, p in platforms.items():
        assert p.problems == [], (kind, p.problems)
        last = p.bodies()[-1]
        if kind == "webhook":  # the machine-readable body: the incident as the API shows it
            assert last["event"] == "incident.resolved" and last["incident"]["reopened"] == 2
            continue
        text = digest_text(kind, last)
        assert "Incident resolved" in text and "reopened 2 times" in text, kind
        assert "4 changes since the last message" in text, kind
    assert platforms["feishu"].bodies()[-1]["card"]["header"]["template"] == "green"

    rows = store.list_deliveries(incident_id=incident.id, limit=1000)
    slack = sorted((r for r in rows if r.channel == "slack"), key=lambda r: r.id)
    assert [(r.event, r.ok) for r in slack] == [("opened", True), ("resolved", True), ("updated", True),
                                               ("resolved", True), ("updated", True), ("resolved", True)]
    told = slack[-1]  # the held changes are recorded in the order they were offered, the one told last
    assert told.detail["folded"] == 4
    assert all(r.detail["folded_into"] == told.key for r in slack[2:5])
    assert len(rows) == 6 * len(KINDS)

    # the changes told are delivered: offering them again sends nothing
    assert dispatcher.notify(store.get_incident(incident.id), "resolved") and dispatcher.flush(force=True)
    assert counts(platforms) == {3}


def test_a_change_after_a_quiet_interval_goes_at_once(platforms, store, make_dispatcher, clock):
    dispatcher = make_dispatcher(configs(platforms), renotify_interval_s=INTERVAL_S)
    incident = open_incident(store)
    dispatcher.notify(incident, "opened")
    clock.tick(10)
    dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED), "resolved")
    clock.tick(INTERVAL_S + 1)  # longer than the interval, within the reopen window
    reopened = comes_back(store)
    assert dispatcher.notify(reopened, "updated") and counts(platforms) == {3}
    assert set(dispatcher.pending().values()) == {0}
    for kind, p in platforms.items():
        if kind != "webhook":
            text = digest_text(kind, p.bodies()[-1])
            assert "Incident reopened" in text and "reopened 1 time" in text, kind
            assert "changes since" not in text, kind


def test_the_interval_holds_across_a_restart_and_close_tells_what_waits(platforms, store, make_dispatcher, clock,
                                                                       tmp_path: Path):
    incident = open_incident(store)
    first = make_dispatcher(configs(platforms), renotify_interval_s=INTERVAL_S)
    first.notify(incident, "opened")
    clock.tick(10)
    first.notify(store.set_state(incident.id, IncidentState.RESOLVED), "resolved")
    first.close()
    assert counts(platforms) == {2}

    # A new process: a new Store on the same database file and a new Dispatcher, which knows nothing in memory.
    again = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    try:
        second = make_dispatcher(configs(platforms), log=again, renotify_interval_s=INTERVAL_S)
        clock.tick(10)
        assert second.notify(comes_back(store), "updated")
        assert counts(platforms) == {2} and set(second.pending().values()) == {1}  # told 10 s ago: it waits
        second.close()  # shutting down tells the last state rather than lose it
    finally:
        again.close()
    assert counts(platforms) == {3}
    for kind, p in platforms.items():
        if kind != "webhook":
            assert "Incident reopened" in digest_text(kind, p.bodies()[-1]), kind


def test_an_interval_of_zero_tells_every_change(platforms, store, make_dispatcher, clock):
    dispatcher = make_dispatcher(configs(platforms), renotify_interval_s=0)
    incident = open_incident(store)
    dispatcher.notify(incident, "opened")
    for _ in range(2):
        clock.tick(10)
        dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED), "resolved")
        clock.tick(10)
        dispatcher.notify(comes_back(store), "updated")
    assert counts(platforms) == {5}
