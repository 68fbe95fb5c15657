"""The stall and idle-GPU detectors across an Argus restart: their state saved in a real SQLite store (the
`store` fixture) and loaded by a new detector on a new Store over the same file, with a hand-moved clock.

Each restart test also runs a detector without memory on the same signals: it must miss what the remembering
one finds, so the tests fail if the state is not really carried over.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest

from argus.store.store import Store
from core.types import Category
from detectors.idle_gpu import IdleGpuDetector
from detectors.stall import StallDetector
from tests.detectors.test_idle_gpu import W1, W2, idle_polls, job, node_util, poll, snapshot
from tests.detectors.test_stall import JOB, T0, Log, job_state, run_steps
from tests.support import Clock


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'argus.db'}"


@pytest.fixture
def stores(db: str) -> Iterator[list[Store]]:
    """Stores opened by a test on the one database file, closed at its end: each one is Argus (re)started."""
    opened: list[Store] = []
    yield opened
    for s in opened:
        s.close()


def restart(db: str, stores: list[Store]) -> Store:
    stores.append(Store(db))
    return stores[-1]


class CountingMemory:
    """The store's detector state, counting the saves that reach it (to check the write rate)."""

    def __init__(self, store: Store) -> None:
        self.inner, self.saves = store.detector_state, []

    def load_all(self, detector: str) -> dict[str, dict[str, Any]]:
        return self.inner.load_all(detector)

    def save(self, detector: str, changed: Mapping[str, dict[str, Any] | None]) -> None:
        self.saves.append(dict(changed))
        self.inner.save(detector, changed)


def stall(clock: Clock, store: Store | None) -> StallDetector:
    return StallDetector(min_stall_s=60, factor=3, clock=clock, memory=None if store is None else store.detector_state)


# -- stall ------------------------------------------------------------------------------------------------------


def test_a_job_hung_before_a_restart_is_found_within_its_threshold_of_its_last_step(db, stores) -> None:
    clock, log = Clock(T0), Log()
    before = stall(clock, restart(db, stores))
    assert run_steps(before, clock, log, [10.0 * i for i in range(1, 11)]) == [[]] * 10  # last step at t=100
    clock.at(130)
    assert before.detect([job_state()]) == []  # hung for 30 s when Argus goes down

    after = stall(clock, restart(db, stores))
    forgetful = stall(clock, None)
    clock.at(140)
    assert after.detect([]) == []  # Ray has not said the job is still RUNNING: not judged yet
    clock.at(150)
    assert after.detect([job_state()]) == [] and forgetful.detect([job_state()]) == []
    clock.at(161)  # threshold max(60 s, 3 x 10 s) from the last step at t=100, not from the restart
    [finding] = after.detect([job_state()])
    assert forgetful.detect([job_state()]) == []  # without memory the hang would go unseen
    assert finding.category is Category.NCCL_HANG and finding.subject.id == JOB
    assert finding.first_seen == T0 + timedelta(seconds=100)
    assert finding.attrs["step_interval_s"] == 10.0 and finding.attrs["threshold_s"] == 60.0
    assert finding.attrs["last_progress_line"] == "step 10 loss=0.5" and finding.attrs["last_progress_line_no"] == 10
    assert finding.evidence[0].source == log.source and finding.evidence[0].line == 10
    # the same fingerprint the detector that saw the steps gives: the same incident
    [unbroken] = before.detect([job_state()])
    assert finding.fingerprint == unbroken.fingerprint
    assert after.progress()[JOB].step == 10


def test_a_stall_reported_before_the_restart_stays_one_incident_and_its_recovery_closes_it(db, stores) -> None:
    clock, log = Clock(T0), Log()
    before = stall(clock, restart(db, stores))
    run_steps(before, clock, log, [10.0 * i for i in range(1, 11)])
    clock.at(161)
    [reported] = before.detect([job_state()])

    after = stall(clock, restart(db, stores))
    clock.at(200)
    [again] = after.detect([job_state()])
    assert again.fingerprint == reported.fingerprint and again.first_seen == reported.first_seen
    assert after.recoveries() == []
    clock.at(205)
    assert after.detect([job_state(), log.line("step 11 loss=0.4", clock.now)]) == []
    [recovery] = after.recoveries()  # the episode the earlier process reported ends here
    assert recovery.fingerprint == reported.fingerprint and "step 11" in recovery.reason


def test_a_job_no_longer_running_after_the_restart_is_dropped_and_forgotten(db, stores) -> None:
    clock, log = Clock(T0), Log()
    first = restart(db, stores)
    before = stall(clock, first)
    run_steps(before, clock, log, [10.0 * i for i in range(1, 11)])
    clock.at(161)
    before.detect([job_state()])
    assert list(first.detector_state.load_all("stall")) == [JOB]

    second = restart(db, stores)
    after = stall(clock, second)
    clock.at(300)
    assert after.detect([job_state("FAILED")]) == [] and after.recoveries() == []  # ended hung: no recovery
    assert after.progress() == {} and second.detector_state.load_all("stall") == {}
    clock.at(400)
    assert after.detect([job_state()]) == []  # resubmitted under the same id: a fresh start, no old rhythm


def test_state_is_saved_at_most_once_per_tick_and_only_when_it_changed(db, stores) -> None:
    clock, log = Clock(T0), Log()
    memory = CountingMemory(restart(db, stores))
    det = StallDetector(min_stall_s=60, factor=3, clock=clock, memory=memory)
    for t in (10.0, 20.0, 30.0):
        clock.at(t)
        det.detect([job_state(), *(log.line(f"step {n} loss=0.5", clock.now) for n in range(int(t), int(t) + 3))])
    assert len(memory.saves) == 3 and all(list(s) == [JOB] for s in memory.saves)  # 3 lines a tick, one save
    clock.at(40)
    det.detect([job_state()])  # nothing new: no write
    assert len(memory.saves) == 3
    clock.at(200)
    det.detect([job_state()])  # the stall is reported: its episode is remembered
    clock.at(210)
    det.detect([job_state()])
    assert len(memory.saves) == 4 and memory.saves[-1][JOB]["episode"]


def test_unreadable_state_starts_that_job_fresh_and_is_forgotten(db, stores) -> None:
    clock, log = Clock(T0), Log()
    first = restart(db, stores)
    run_steps(stall(clock, first), clock, log, [10.0 * i for i in range(1, 11)])
    good = first.detector_state.load_all("stall")[JOB]
    broken = {**good, "subject": {**good["subject"], "id": "job-b"}, "log": {**good["log"], "gaps": "10, 10"}}
    first.detector_state.save("stall", {"job-newer": {**good, "v": 2}, "job-b": broken,
                                        "job-c": {**good, "subject": {"kind": "job"}}})

    second = restart(db, stores)
    after = stall(clock, second)  # refuses three jobs' state, keeps the good one
    clock.at(161)
    signals = [job_state(), job_state(job="job-newer"), job_state(job="job-b"), job_state(job="job-c")]
    [finding] = after.detect(signals)
    assert finding.subject.id == JOB
    assert list(second.detector_state.load_all("stall")) == [JOB]  # the unreadable rows are gone


# -- idle GPUs --------------------------------------------------------------------------------------------------


def idle(clock: Clock, store: Store | None) -> IdleGpuDetector:
    return IdleGpuDetector(threshold_pct=5, window_s=600, clock=clock,
                           memory=None if store is None else store.detector_state)


def test_a_job_idle_for_8_of_10_minutes_before_a_restart_is_reported_2_minutes_after(db, stores) -> None:
    clock = Clock(T0)
    assert idle_polls(idle(clock, restart(db, stores)), clock, 17) == []  # idle polls at 0 .. 480 s
    clock.at(510)  # Argus was down for one poll

    after, forgetful = idle(clock, restart(db, stores)), idle(clock, None)
    for t in (510, 540, 570):
        signals = [snapshot(W1, W2), job("job-a", {W1: 4}), *node_util(W1, 1.0, clock.at(t))]
        assert after.detect(signals) == [] and forgetful.detect(signals) == []
    signals = [snapshot(W1, W2), job("job-a", {W1: 4}), *node_util(W1, 1.0, clock.at(600))]
    assert forgetful.detect(signals) == []  # without memory the window started again at 510 s
    [finding] = after.detect(signals)  # at 600 s: ten minutes after the job went idle
    assert finding.category is Category.IDLE_GPU and finding.first_seen == T0
    assert finding.attrs["idle_seconds"] == 600.0


def test_an_idle_episode_reported_before_the_restart_closes_when_the_gpus_are_busy_again(db, stores) -> None:
    clock = Clock(T0)
    before = idle(clock, restart(db, stores))
    [reported] = idle_polls(before, clock, 21)

    after = idle(clock, restart(db, stores))
    assert idle_polls(after, clock, 2) == []  # still idle: the same episode, reported once
    assert poll(after, clock, snapshot(W1, W2), job("job-a", {W1: 4}), node_util(W1, 80.0, clock.now)) == []
    [recovery] = after.recoveries()
    assert recovery.fingerprint == reported.fingerprint and "back to 80%" in recovery.reason
    assert restart(db, stores).detector_state.load_all("idle_gpu") == {}  # the ended episode is forgotten


def test_an_unreported_idle_window_not_watched_for_longer_than_stale_after_starts_again(db, stores) -> None:
    clock = Clock(T0)
    idle_polls(idle(clock, restart(db, stores)), clock, 17)  # idle 0 .. 480 s
    clock.at(480 + 600)  # Argus down for ten minutes: the GPUs were not watched

    after = idle(clock, restart(db, stores))
    assert idle_polls(after, clock, 20) == []  # a new window from the first poll after the restart
    [finding] = idle_polls(after, clock, 1)
    assert finding.first_seen == T0 + timedelta(seconds=1080)


def test_an_unreadable_idle_episode_starts_fresh(db, stores) -> None:
    clock = Clock(T0)
    first = restart(db, stores)
    first.detector_state.save("idle_gpu", {"job-a": {"v": 1, "idle_since": "yesterday", "seen_idle_at": None,
                                                     "fingerprint": None, "max_util": 0}})
    after = idle(clock, restart(db, stores))
    assert idle_polls(after, clock, 20) == []
    [finding] = idle_polls(after, clock, 1)
    assert finding.first_seen == T0
