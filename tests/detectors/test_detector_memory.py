"""The stall, idle-GPU and metric-rule detectors across an Argus restart: their state saved in a real SQLite store (the
`store` fixture) and loaded by a new detector on a new Store over the same file, with a hand-moved clock.

Each restart test also runs a detector without memory on the same signals: it must miss what the remembering
one finds, so the tests fail if the state is not really carried over.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest
from loguru import logger

from argus.store.store import Store
from core.types import Category
from detectors.idle_gpu import IdleGpuDetector
from detectors.metric_rules import MetricRuleDetector, MetricRuleSet
from detectors.stall import StallDetector
from tests.detectors.test_idle_gpu import W1, W2, idle_polls, job, node_util, poll, snapshot
from tests.detectors.test_metric_rules import GOOD, evaluated, fire_hot_gpu, gpu, series, write
from tests.detectors.test_metric_rules import Clock as RuleClock
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


# -- metric rules -----------------------------------------------------------------------------------------------

HOT = [evaluated("HotGpu"), series("HotGpu", 95, gpu())]  # HotGpu (for: 2m) active on GPU-1
COOL = [evaluated("HotGpu", 0)]  # HotGpu evaluated, no series: absent
HOT_KEY = "HotGpu/gpu:GPU-1"


@pytest.fixture
def rules(tmp_path) -> MetricRuleSet:
    return MetricRuleSet.load([write(tmp_path, GOOD)])


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    seen: list[str] = []
    handler = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    yield seen
    logger.remove(handler)


def metric(rules: MetricRuleSet, clock: RuleClock, store: Store | None) -> MetricRuleDetector:
    return MetricRuleDetector(rules, clock=clock, memory=None if store is None else store.detector_state)


def test_a_rule_firing_before_a_restart_that_ends_after_it_recovers_under_the_same_fingerprint(
        db, stores, rules) -> None:
    clock = RuleClock()
    [reported] = fire_hot_gpu(metric(rules, clock, restart(db, stores)), clock, gpu())

    after, forgetful = metric(rules, clock, restart(db, stores)), metric(rules, clock, None)
    clock.advance(30)
    assert after.detect(COOL) == [] and forgetful.detect(COOL) == []  # absent from here
    clock.advance(119)
    after.detect(COOL)
    assert after.recoveries() == []  # absent for less than its `for`
    clock.advance(1)
    after.detect(COOL)
    forgetful.detect(COOL)
    [recovery] = after.recoveries()
    assert forgetful.recoveries() == []  # without memory the incident would stay open forever
    assert recovery.fingerprint == reported.fingerprint and recovery.detector == "metric_rules"
    assert "no longer holds for n1/gpu1" in recovery.reason  # the subject remembered, named as it was reported
    assert restart(db, stores).detector_state.load_all("metric_rules") == {}  # the ended episode is forgotten


def test_an_absence_begun_before_a_restart_counts_from_when_it_began(db, stores, rules) -> None:
    clock = RuleClock()
    before = metric(rules, clock, restart(db, stores))
    [reported] = fire_hot_gpu(before, clock, gpu())
    clock.advance(30)
    before.detect(COOL)  # absent from 00:02:30
    clock.advance(60)

    after = metric(rules, clock, restart(db, stores))
    after.detect(COOL)
    assert after.recoveries() == []
    clock.advance(60)  # 120 s after the absence began before the restart, 60 s after the restart
    after.detect(COOL)
    [recovery] = after.recoveries()
    assert recovery.fingerprint == reported.fingerprint and "since 2026-01-01 00:02:30 UTC" in recovery.reason


def test_a_rule_still_firing_after_a_restart_is_not_reported_again(db, stores, rules) -> None:
    clock = RuleClock()
    memory = CountingMemory(restart(db, stores))
    fire_hot_gpu(MetricRuleDetector(rules, clock=clock, memory=memory), clock, gpu())
    assert [list(s) for s in memory.saves] == [[HOT_KEY], [HOT_KEY]]  # pending, then fired

    memory = CountingMemory(restart(db, stores))
    after, forgetful = MetricRuleDetector(rules, clock=clock, memory=memory), metric(rules, clock, None)
    again: list[object] = []
    for _ in range(10):  # five minutes more of the same fault
        clock.advance(30)
        assert after.detect(HOT) == []
        again += forgetful.detect(HOT)
    assert len(again) == 1  # without memory it would be reported a second time
    assert memory.saves == []  # nothing changed: nothing written
    assert after.pending() == {("HotGpu", "gpu:GPU-1"): clock.now - timedelta(seconds=420)}
    assert after.recoveries() == []


def test_a_pending_rule_keeps_its_since_across_a_restart(db, stores, rules) -> None:
    clock = RuleClock()
    start = clock.now
    assert metric(rules, clock, restart(db, stores)).detect(HOT) == []  # pending from `start`
    clock.advance(60)

    after, forgetful = metric(rules, clock, restart(db, stores)), metric(rules, clock, None)
    assert after.detect(HOT) == [] and forgetful.detect(HOT) == []
    clock.advance(60)
    assert forgetful.detect(HOT) == []  # without memory it counts its `for` from the restart
    [finding] = after.detect(HOT)  # active for 2m since before the restart
    assert finding.first_seen == start and finding.reason == "HotGpu"


def test_unreadable_metric_rule_state_starts_fresh_with_a_warning(db, stores, rules, warnings) -> None:
    clock = RuleClock()
    first = restart(db, stores)
    fire_hot_gpu(metric(rules, clock, first), clock, gpu())
    good = first.detector_state.load_all("metric_rules")[HOT_KEY]
    first.detector_state.save("metric_rules", {
        "HotGpu/gpu:GPU-2": {**good, "subject_key": "gpu:GPU-2", "since": "yesterday"},
        "HotGpu/gpu:GPU-3": {**good, "subject_key": "gpu:GPU-3", "fired": "yes"},
        "HotGpu/gpu:GPU-4": {**good, "subject_key": "gpu:GPU-4", "subject": {"kind": "gpu"}},
        "HotGpu/gpu:GPU-5": {**good, "subject_key": "gpu:GPU-5"},  # its subject is GPU-1's
        "HotGpu/gpu:GPU-6": good,  # GPU-1's state under another key
        "HotGpu/gpu:GPU-7": {**good, "v": 2},
        "XidNow/gpu:GPU-8": {**good, "reason": "XidNow", "subject_key": "gpu:GPU-8", "since": "2026-01-01T00:00:00"},
    })

    second = restart(db, stores)
    after = metric(rules, clock, second)  # refuses seven keys' state, keeps the good one, raises nothing
    why = {"GPU-2": "'yesterday' is not an ISO time", "GPU-3": "fired is 'yes'", "GPU-4": "subject is unreadable",
           "GPU-5": "subject gpu:GPU-1 is not gpu:GPU-5", "GPU-6": "saved under another key",
           "GPU-7": "format version 2", "GPU-8": "has no time zone"}
    assert len(warnings) == 7 and all("starts fresh" in w for w in warnings)
    for gpu_id, fragment in why.items():
        assert any(f"gpu:{gpu_id} is unreadable" in w and fragment in w for w in warnings), gpu_id
    assert after.pending() == {("HotGpu", "gpu:GPU-1"): clock.now - timedelta(seconds=120)}
    clock.advance(30)
    signals = [evaluated("HotGpu", 7), *(series("HotGpu", 95, gpu(f"GPU-{n}")) for n in range(1, 8))]
    assert after.detect(signals) == []  # GPU-1 still firing; the others pending afresh from now
    assert set(second.detector_state.load_all("metric_rules")) == {f"HotGpu/gpu:GPU-{n}" for n in range(1, 8)}
    assert second.detector_state.load_all("metric_rules")["HotGpu/gpu:GPU-2"]["since"] == clock.now.isoformat()


def test_a_remembered_pair_of_a_rule_no_longer_loaded_is_forgotten(db, stores, rules, warnings) -> None:
    clock = RuleClock()
    xid_now = [evaluated("XidNow"), series("XidNow", 79, gpu("GPU-2"))]
    before = metric(rules, clock, restart(db, stores))
    fire_hot_gpu(before, clock, gpu())
    assert len(before.detect(xid_now)) == 1  # XidNow (for: 0s) fires at once

    second = restart(db, stores)
    without_hot = MetricRuleSet([r for r in rules if r.reason != "HotGpu"])
    after = metric(without_hot, clock, second)
    assert any("HotGpu is no longer loaded" in w for w in warnings)
    assert list(after.pending()) == [("XidNow", "gpu:GPU-2")]
    assert after.detect(xid_now) == []  # the rule still loaded goes on firing, not reported again
    assert list(second.detector_state.load_all("metric_rules")) == ["XidNow/gpu:GPU-2"]

    back = metric(rules, clock, restart(db, stores))  # HotGpu loaded again: it starts over, pending for 2m
    assert back.detect(HOT) == []
    assert back.pending()[("HotGpu", "gpu:GPU-1")] == clock.now


def test_a_subject_too_long_for_a_memory_key_is_remembered_under_a_digest(db, stores, rules) -> None:
    clock = RuleClock()
    odd = gpu("GPU-" + "x" * 600)  # a subject id past the store's 512-character keys
    [reported] = fire_hot_gpu(metric(rules, clock, restart(db, stores)), clock, odd)
    [key] = stores[-1].detector_state.load_all("metric_rules")
    assert key.startswith("HotGpu/sha256:") and len(key) < 100

    after = metric(rules, clock, restart(db, stores))
    assert after.detect([evaluated("HotGpu"), series("HotGpu", 95, odd)]) == []  # still firing, known
    clock.advance(30)
    after.detect(COOL)
    clock.advance(120)
    after.detect(COOL)
    [recovery] = after.recoveries()
    assert recovery.fingerprint == reported.fingerprint
