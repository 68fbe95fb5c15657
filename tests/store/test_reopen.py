"""Flapping is one incident: a fault back soon after its incident was resolved reopens that incident, counted,
on a real SQLite file and a fresh PostgreSQL database (conftest), also when several filers race."""

from __future__ import annotations

import pytest

from argus.store.store import Store
from core.errors import InputError
from core.types import REOPENED, REOPENED_AT, RESOLVED_BEFORE, Category, IncidentState
from tests.store.test_store import make_finding, run_together

WINDOW_S = 1800.0


def resolved_incident(store: Store, clock, subject_id: str = "raysubmit_abc"):  # make_finding's job
    incident, recorded = store.file_finding(make_finding(subject_id), reopen_within_s=WINDOW_S)
    assert recorded == "opened"
    clock.tick(60)
    return store.set_state(incident.id, IncidentState.RESOLVED)


def test_a_fault_back_within_the_window_reopens_its_incident_with_a_count(store: Store, clock) -> None:
    first = resolved_incident(store, clock)
    resolved_at = clock.now
    clock.tick(WINDOW_S - 1)

    again, recorded = store.file_finding(make_finding(reason="CudaOomInBackward"), reopen_within_s=WINDOW_S)

    assert recorded == "reopened" and again.id == first.id
    assert again.state is IncidentState.OPEN and again.resolved_at is None
    assert again.reopened == 1 and again.occurrences == 2
    assert again.attrs[REOPENED] == 1
    assert again.attrs[REOPENED_AT] == clock.now.isoformat()
    assert again.attrs[RESOLVED_BEFORE] == resolved_at.isoformat()
    assert store.find_open(first.fingerprint) == again
    assert [f.reason for f in store.findings_for(first.id)] == ["CudaOutOfMemory", "CudaOomInBackward"]
    assert len(store.list_incidents()) == 1

    # while it is open, the fault seen again folds as always; resolved and back again, the count goes on
    folded, recorded = store.file_finding(make_finding(), reopen_within_s=WINDOW_S)
    assert recorded == "folded" and folded.reopened == 1 and folded.occurrences == 3
    clock.tick(30)
    store.set_state(first.id, IncidentState.RESOLVED)  # a person's resolve counts the same as a recovery
    clock.tick(30)
    third, recorded = store.file_finding(make_finding(), reopen_within_s=WINDOW_S)
    assert (recorded, third.id, third.reopened, third.occurrences) == ("reopened", first.id, 2, 4)


def test_a_fault_back_after_the_window_opens_a_new_incident_and_leaves_the_old_alone(store: Store, clock) -> None:
    old = resolved_incident(store, clock)
    clock.tick(WINDOW_S + 1)

    new, recorded = store.file_finding(make_finding(), reopen_within_s=WINDOW_S)

    assert recorded == "opened" and new.id != old.id and new.reopened == 0
    assert store.get_incident(old.id) == old  # still resolved, uncounted
    assert store.find_open(old.fingerprint) == new


def test_a_window_of_zero_never_reopens_and_record_finding_never_does(store: Store, clock) -> None:
    old = resolved_incident(store, clock)
    clock.tick(1)
    new, recorded = store.file_finding(make_finding(), reopen_within_s=0)
    assert recorded == "opened" and new.id != old.id
    store.set_state(new.id, IncidentState.RESOLVED)
    clock.tick(1)
    newer, opened = store.record_finding(make_finding())
    assert opened and newer.id not in (old.id, new.id)
    with pytest.raises(InputError, match="negative"):
        store.file_finding(make_finding(), reopen_within_s=-1)


def test_only_the_latest_resolved_incident_of_a_fingerprint_is_reopened(store: Store, clock) -> None:
    oldest = resolved_incident(store, clock)
    clock.tick(WINDOW_S + 1)
    latest = resolved_incident(store, clock)
    clock.tick(10)
    again, recorded = store.file_finding(make_finding(), reopen_within_s=WINDOW_S)
    assert recorded == "reopened" and again.id == latest.id
    assert store.get_incident(oldest.id).state is IncidentState.RESOLVED


def test_an_incident_merged_into_its_root_cause_is_not_reopened(store: Store, clock) -> None:
    echo, _ = store.file_finding(make_finding(category=Category.NCCL_ERROR, reason="NcclError"))
    root, _ = store.file_finding(make_finding())
    store.merge_into(echo.id, root.id)  # resolves the echo as merged
    clock.tick(10)
    new, recorded = store.file_finding(make_finding(category=Category.NCCL_ERROR, reason="NcclError"),
                                       reopen_within_s=WINDOW_S)
    assert recorded == "opened" and new.id != echo.id
    assert store.get_incident(echo.id).attrs["merged_into"] == root.id


def test_concurrent_filers_of_a_fault_that_came_back_reopen_it_once(store: Store, clock) -> None:
    threads_n = 8
    first = resolved_incident(store, clock, "raysubmit_race")
    clock.tick(5)
    finding = make_finding("raysubmit_race")

    results = run_together(threads_n, lambda: store.file_finding(finding, reopen_within_s=WINDOW_S))

    assert sorted(recorded for _, recorded in results) == ["folded"] * (threads_n - 1) + ["reopened"]
    assert {incident.id for incident, _ in results} == {first.id}
    stored = store.get_incident(first.id)
    assert (stored.state, stored.reopened, stored.occurrences) == (IncidentState.OPEN, 1, 1 + threads_n)
    assert len(store.list_incidents()) == 1
