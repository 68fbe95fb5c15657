"""The leader lease (argus/store/leases.py) and the elector on it (argus/leader.py), on SQLite and PostgreSQL: one
holder at a time, also when replicas race for it; a lapsed lease changes hands with a new term; a leader that cannot
renew steps down before another may take over."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from argus.leader import LeaderElector
from argus.store.leases import Lease
from argus.store.store import Store
from core.errors import InputError, StoreError
from tests.store.conftest import Clock
from tests.store.test_store import run_together

NAME = "argus-leader"


def test_one_holder_renewals_keep_the_term_and_a_lapsed_lease_changes_hands(store: Store, clock: Clock) -> None:
    leases = store.leases
    assert leases.get(NAME) is None
    first = leases.acquire(NAME, "a", 10)
    assert first.held and first.holder == "a" and first.term == 1
    assert not leases.acquire(NAME, "b", 10).held  # a holds it
    clock.tick(6)
    renewed = leases.acquire(NAME, "a", 10)
    assert renewed.held and renewed.term == 1 and renewed.acquired_at == first.acquired_at
    clock.tick(9)  # 9 s after the renewal: still a's
    assert not leases.acquire(NAME, "b", 10).held
    clock.tick(2)  # 11 s after it: lapsed
    taken = leases.acquire(NAME, "b", 10)
    assert taken.held and taken.holder == "b" and taken.term == 2 and taken.acquired_at == clock.now
    late = leases.acquire(NAME, "a", 10)  # the old holder comes back: b's now
    assert not late.held and late.holder == "b" and late.term == 2


def test_a_released_lease_is_taken_at_once_and_only_its_holder_may_release_it(store: Store) -> None:
    leases = store.leases
    leases.acquire(NAME, "a", 10)
    assert not leases.release(NAME, "b")
    assert not leases.acquire(NAME, "b", 10).held
    assert leases.release(NAME, "a")
    taken = leases.acquire(NAME, "b", 10)
    assert taken.held and taken.term == 2


@pytest.mark.parametrize("free", [True, False], ids=["new", "lapsed"])
def test_replicas_racing_for_the_lease_leave_exactly_one_holder(db_url: str, clock: Clock, free: bool) -> None:
    stores = [Store(db_url, clock=clock) for _ in range(6)]
    try:
        if not free:
            stores[0].leases.acquire(NAME, "old", 5)
            clock.tick(10)
        turns = itertools.count()  # next() is atomic: each thread gets its own store and name

        def take() -> Lease:
            i = next(turns)
            return stores[i].leases.acquire(NAME, f"r{i}", 10)

        results = run_together(6, take)
        holders = {lease.holder for lease in results if lease.held}
        assert len(holders) == 1
        assert stores[0].leases.get(NAME).holder in holders
        assert stores[0].leases.get(NAME).term == (1 if free else 2)
    finally:
        for s in stores:
            s.close()


def test_bad_names_holders_and_ttls_are_input_errors(store: Store) -> None:
    for name, holder, ttl in (("", "a", 10), ("x" * 65, "a", 10), (NAME, "", 10), (NAME, "h" * 129, 10),
                              (NAME, "a", 0), (NAME, "a", 1e9)):
        with pytest.raises(InputError):
            store.leases.acquire(name, holder, ttl)
    assert store.leases.get(NAME) is None


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def elected(self, term: int) -> None:
        self.events.append(f"elected {term}")

    def deposed(self, why: str) -> None:
        self.events.append(f"deposed: {why}")


def elector(store: Store, replica: str, seconds: list[float], recorder: Recorder) -> LeaderElector:
    return LeaderElector(store.leases, replica=replica, on_elected=recorder.elected, on_deposed=recorder.deposed,
                         ttl_s=10, renew_s=2, clock=lambda: seconds[0])


def test_the_follower_takes_over_when_the_leader_stops_renewing_and_the_old_leader_steps_down(
        store: Store, clock: Clock) -> None:
    seconds = [0.0]
    a_saw, b_saw = Recorder(), Recorder()
    a, b = elector(store, "a", seconds, a_saw), elector(store, "b", seconds, b_saw)
    a.step()
    b.step()
    assert a.leader and not b.leader and a_saw.events == ["elected 1"] and b_saw.events == []
    assert b.view().holder == "a" and b.view().term == 1
    for _ in range(4):  # a renews every 2 s; b keeps trying
        clock.tick(2)
        a.step()
        b.step()
    assert not b.leader
    # a stops renewing (SIGKILLed, or stalled); b tries every 2 s and leads once the lease lapses
    took = None
    for step in range(1, 10):
        clock.tick(2)
        b.step()
        if b.leader:
            took = step * 2
            break
    assert took is not None and 10 < took <= 12 and b_saw.events == ["elected 2"]
    a.step()  # a wakes up: b holds the lease, a steps down
    assert not a.leader and a_saw.events[-1] == "deposed: replica b holds the lease (term 2)"


def test_a_leader_that_cannot_reach_the_store_steps_down_before_its_lease_can_lapse(store: Store, clock: Clock) -> None:
    seconds = [0.0]
    saw = Recorder()
    leader = elector(store, "a", seconds, saw)
    leader.step()
    broken = store.leases

    class Unreachable:
        def acquire(self, *args: object) -> None:
            raise StoreError("cannot reach the database", hint="start it")

    leader.leases = Unreachable()  # type: ignore[assignment]
    for second in (2.0, 4.0, 6.0):
        seconds[0] = second
        leader.step()
        assert leader.leader, second  # a few missed renewals are not a lost lease
    seconds[0] = 8.0  # ttl 10 - renew 2: the lease may lapse before the next try
    leader.step()
    assert not leader.leader and saw.events[-1].startswith("deposed: the lease could not be renewed for 8.0 s")
    assert leader.view().last_error == "cannot reach the database"
    clock.tick(8)
    leader.leases = broken
    assert broken.get(NAME).held  # the row still says a: no replica could take it while the store was away
    clock.tick(timedelta(seconds=3).total_seconds())
    assert not broken.get(NAME).held


def test_a_replica_that_fails_to_start_leading_gives_the_lease_back(store: Store) -> None:
    seconds = [0.0]
    saw = Recorder()
    calls = []

    def broken_start(term: int) -> None:
        calls.append(term)
        if len(calls) == 1:
            raise RuntimeError("the store failed while recovering steps")

    replica = LeaderElector(store.leases, replica="a", on_elected=broken_start, on_deposed=saw.deposed, ttl_s=10,
                            renew_s=2, clock=lambda: seconds[0])
    with pytest.raises(RuntimeError):
        replica.step()
    assert not replica.leader and not store.leases.get(NAME).held  # given back, not held while running nothing
    replica.step()  # the next try leads
    assert replica.leader and calls == [1, 1]  # its own lease again: the same term
