"""The stall, idle-GPU, metric-rule and log-rule detectors across an Argus restart: their state saved in a real SQLite
store (the `store` fixture) and loaded by a new detector on a new Store over the same file, with a hand-moved clock.

Each restart test also runs a detector without memory on the same signals: it must miss what the remembering
one finds, so the tests fail if the state is not really carried over.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest
from loguru import logger

from argus.store.store import Store
from core.types import Category, Finding, Severity, Subject, SubjectKind, fingerprint_of
from detectors import stall as stall_module
from detectors.engine import RuleSet
from detectors.idle_gpu import IdleGpuDetector
from detectors.log_rules import LogRuleDetector
from detectors.metric_rules import MetricRuleDetector, MetricRuleSet
from detectors.stall import StallDetector
from detectors.stall_state import HUNG_ENDED_MEMORY
from tests.detectors.test_idle_gpu import W1, W2, idle_polls, job, node_util, poll, snapshot
from tests.detectors.test_log_rules import RULES as LOG_RULES
from tests.detectors.test_log_rules import line
from tests.detectors.test_log_rules_history import OOM
from tests.detectors.test_log_rules_history import job_state as ray_job_state
from tests.detectors.test_metric_rules import GOOD, evaluated, fire_hot_gpu, gpu, series, write
from tests.detectors.test_metric_rules import Clock as RuleClock
from tests.detectors.test_stall import JOB, T0, Log, job_state, run_steps
from tests.support import Clock
from tests.support.job_states import resubmission


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


def hang_and_end(det: StallDetector, clock: Clock, job_id: str, start: float, status: str = "FAILED") -> Finding:
    """A job stepping every 10 s from `start`, reported stalled at start + 100 s, ending `status` at start + 105 s."""
    log = Log(job=job_id, source=f"/tmp/ray/session/logs/job-driver-{job_id}.log")
    run = [job_state(job=job_id)]
    for n in (1, 2, 3):
        det.detect([*run, log.line(f"step {n} loss=0.5", clock.at(start + 10 * n))])
    clock.at(start + 100)
    [reported] = det.detect(run)
    clock.at(start + 105)
    assert det.detect([job_state(status, job=job_id)]) == [] and det.recoveries() == []  # ended hung: no recovery
    return reported


def test_a_job_that_ended_hung_before_a_restart_closes_when_its_resubmission_runs_after_it(db, stores) -> None:
    clock = Clock(T0)
    first = restart(db, stores)
    reported = hang_and_end(stall(clock, first), clock, JOB, 0, "STOPPED")
    assert first.detector_state.load_all("stall") == {}  # its rhythm is forgotten: it no longer runs
    assert list(first.detector_state.load_all(HUNG_ENDED_MEMORY)) == [JOB]

    after, forgetful = stall(clock, restart(db, stores)), stall(clock, None)
    clock.at(200)
    signals = [job_state("STOPPED"), resubmission(JOB, 1, "RUNNING", at=clock.now)]
    assert after.detect(signals) == [] and forgetful.detect(signals) == []
    [recovery] = after.recoveries()
    assert forgetful.recoveries() == []  # without memory the stall's incident would stay open
    assert recovery.fingerprint == reported.fingerprint and recovery.detector == "stall"
    assert recovery.reason == (f"job {JOB} ended STOPPED while hung and was resubmitted as {JOB}-r1, "
                               "which reached RUNNING")
    assert restart(db, stores).detector_state.load_all(HUNG_ENDED_MEMORY) == {}  # closed: forgotten


def test_unreadable_ended_stall_state_starts_fresh_with_a_warning(db, stores, warnings) -> None:
    clock = Clock(T0)
    first = restart(db, stores)
    reported = hang_and_end(stall(clock, first), clock, JOB, 0)
    good = first.detector_state.load_all(HUNG_ENDED_MEMORY)[JOB]
    first.detector_state.save(HUNG_ENDED_MEMORY, {
        "job-b": {**good, "job": "job-b", "v": 2},
        "job-c": {**good, "job": "job-c", "status": "RUNNING"},
        "job-d": {**good, "job": "job-d", "ended_at": "2026-03-01T12:01:45"},
        "job-e": {**good, "job": "job-e", "fingerprint": ""},
        "job-f": good,  # JOB's ended stall under another key
    })

    second = restart(db, stores)
    after = stall(clock, second)  # refuses five jobs' state, keeps the good one, raises nothing
    why = {"job-b": "format version 2", "job-c": "'RUNNING', not one a job ends with", "job-d": "has no time zone",
           "job-e": "fingerprint is empty", "job-f": "saved under another key"}
    assert len(warnings) == 5 and all("starts fresh" in w for w in warnings)
    for job_id, fragment in why.items():
        assert any(f"ended job {job_id} is unreadable" in w and fragment in w for w in warnings), job_id
    clock.at(200)
    after.detect([resubmission(job_id, 1, "RUNNING", at=clock.now) for job_id in (JOB, *why)])
    [recovery] = after.recoveries()
    assert recovery.fingerprint == reported.fingerprint
    assert second.detector_state.load_all(HUNG_ENDED_MEMORY) == {}  # the unreadable rows are gone too


def test_ended_stalls_are_remembered_for_the_jobs_that_ended_most_recently(db, stores, monkeypatch) -> None:
    monkeypatch.setattr(stall_module, "_MAX_HUNG_ENDED", 3)
    clock = Clock(T0)
    first = restart(db, stores)
    before = stall(clock, first)
    reported = {job_id: hang_and_end(before, clock, job_id, start)
                for job_id, start in (("job-1", 0), ("job-2", 200), ("job-3", 400))}
    assert set(first.detector_state.load_all(HUNG_ENDED_MEMORY)) == {"job-1", "job-2", "job-3"}

    monkeypatch.setattr(stall_module, "_MAX_HUNG_ENDED", 2)
    second = restart(db, stores)
    after = stall(clock, second)  # a smaller bound: the one that ended first is let go
    reported["job-4"] = hang_and_end(after, clock, "job-4", 600)  # one more: job-2 is let go too
    assert set(second.detector_state.load_all(HUNG_ENDED_MEMORY)) == {"job-3", "job-4"}
    clock.at(800)
    after.detect([resubmission(job_id, 1, "RUNNING", at=clock.now) for job_id in reported])
    assert {r.fingerprint for r in after.recoveries()} == {reported["job-3"].fingerprint,
                                                          reported["job-4"].fingerprint}


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


# -- log rules --------------------------------------------------------------------------------------------------

TRAIN_LOG = "/s/jobs/raysubmit_A/logs/train.log"
LOG_JOB = Subject(kind=SubjectKind.JOB, id="raysubmit_A")


@pytest.fixture
def log_rules(tmp_path) -> RuleSet:
    path = tmp_path / "log_rules.yaml"
    path.write_text(textwrap.dedent(LOG_RULES))
    return RuleSet.load([path])


def log_detector(rules: RuleSet, clock: Clock, store: Store | None, **bounds: int) -> LogRuleDetector:
    return LogRuleDetector(rules, clock=clock, memory=None if store is None else store.detector_state, **bounds)


def test_a_jobs_error_reported_before_a_restart_closes_at_warning_when_the_job_succeeds_after_it(
        db, stores, log_rules) -> None:
    clock = Clock(T0)
    before = log_detector(log_rules, clock, restart(db, stores))
    [reported] = before.detect([ray_job_state("RUNNING"), line(OOM, 12, source=TRAIN_LOG)])
    assert reported.severity is Severity.CRITICAL

    after, forgetful = log_detector(log_rules, clock, restart(db, stores)), log_detector(log_rules, clock, None)
    clock.tick(600)
    assert after.detect([ray_job_state("RUNNING")]) == [] and after.recoveries() == []  # running: still open
    for det in (after, forgetful):
        assert det.detect([ray_job_state("SUCCEEDED")]) == []
    [recovery] = after.recoveries()
    assert forgetful.recoveries() == []  # without memory the incident would stay open
    assert recovery.fingerprint == reported.fingerprint and recovery.severity is Severity.WARNING
    assert recovery.detector == "log_rules"
    assert recovery.reason == f"job raysubmit_A SUCCEEDED: the error at {TRAIN_LOG}:12 did not end it"
    assert restart(db, stores).detector_state.load_all("log_rules") == {}  # closed: forgotten


def test_the_same_fault_reported_again_after_a_restart_is_closed_once(db, stores, log_rules) -> None:
    clock = Clock(T0)
    [reported] = log_detector(log_rules, clock, restart(db, stores)).detect([line(OOM, 12, source=TRAIN_LOG)])

    after = log_detector(log_rules, clock, restart(db, stores))
    clock.tick(60)
    [again] = after.detect([line(OOM, 30, source=TRAIN_LOG)])  # another rank's OOM: the restart forgot the first
    assert again.fingerprint == reported.fingerprint  # the same incident
    after.detect([ray_job_state("SUCCEEDED")])
    [recovery] = after.recoveries()
    assert recovery.reason.endswith(f"{TRAIN_LOG}:12 did not end it")  # the line that opened the incident


def test_log_rule_state_is_saved_only_when_a_jobs_open_findings_change(db, stores, log_rules) -> None:
    clock = Clock(T0)
    memory = CountingMemory(restart(db, stores))
    det = LogRuleDetector(log_rules, clock=clock, memory=memory)
    det.detect([ray_job_state("RUNNING"), line("step 1", 1), line(OOM, 2)])
    assert memory.saves == [{LOG_JOB.id: memory.inner.load_all("log_rules")[LOG_JOB.id]}]
    # the same fault again, a temporary match, other lines, the same status: nothing to write
    det.detect([ray_job_state("RUNNING"), line("step 2", 3), line(OOM, 4), line("memory usage is high", 5)])
    assert len(memory.saves) == 1
    det.detect([line("Killed process 4242 (python)", 6)])  # another category: a second open finding
    assert [f["category"] for f in memory.saves[-1][LOG_JOB.id]["findings"]] == ["gpu_oom", "host_oom"]
    det.detect([ray_job_state("SUCCEEDED")])
    assert len(det.recoveries()) == 2
    assert memory.saves[-1] == {LOG_JOB.id: None} and len(memory.saves) == 3


def test_log_rule_state_is_kept_for_the_jobs_reported_to_most_recently(db, stores, log_rules) -> None:
    clock = Clock(T0)
    jobs = [Subject(kind=SubjectKind.JOB, id=f"job-{n}") for n in range(1, 5)]
    reported: dict[str, str] = {}

    def error_of(det: LogRuleDetector, job_subject: Subject, at: float) -> None:
        clock.at(at)
        [finding] = det.detect([line(OOM, 1, subject=job_subject, source=f"/s/jobs/{job_subject.id}/logs/train.log")])
        reported[job_subject.id] = finding.fingerprint

    first = restart(db, stores)
    before = log_detector(log_rules, clock, first, max_subjects=3)
    for n, job_subject in enumerate(jobs[:3]):
        error_of(before, job_subject, 10.0 * n)
    assert set(first.detector_state.load_all("log_rules")) == {"job-1", "job-2", "job-3"}

    second = restart(db, stores)
    after = log_detector(log_rules, clock, second, max_subjects=2)  # a smaller bound: job-1 is let go
    error_of(after, jobs[3], 40.0)  # one more job: job-2 is let go too, as the bound lets go the oldest
    assert set(second.detector_state.load_all("log_rules")) == {"job-3", "job-4"}
    after.detect([ray_job_state("SUCCEEDED", j) for j in jobs])
    assert {r.fingerprint for r in after.recoveries()} == {reported["job-3"], reported["job-4"]}
    assert reported["job-4"] == fingerprint_of(Category.GPU_OOM, jobs[3])


def test_unreadable_log_rule_state_starts_fresh_with_a_warning(db, stores, log_rules, warnings) -> None:
    clock = Clock(T0)
    first = restart(db, stores)
    [reported] = log_detector(log_rules, clock, first).detect([line(OOM, 12, source=TRAIN_LOG)])
    good = first.detector_state.load_all("log_rules")[LOG_JOB.id]
    [kept] = good["findings"]
    first.detector_state.save("log_rules", {
        "job-b": {**good, "job": "job-b", "v": 2},
        "job-c": {**good, "job": "job-c", "findings": [{**kept, "severity": "catastrophic"}]},
        "job-d": {**good, "job": "job-d", "findings": [{**kept, "reported_at": "yesterday"}]},
        "job-e": {**good, "job": "job-e", "findings": []},
        "job-f": good,  # raysubmit_A's findings under another key
        "job-g": {**good, "job": "job-g", "findings": [{**kept, "line": "12"}]},
        "job-h": {**good, "job": "job-h", "findings": [kept, kept]},
    })

    second = restart(db, stores)
    after = log_detector(log_rules, clock, second)  # refuses seven jobs' state, keeps the good one, raises nothing
    why = {"job-b": "format version 2", "job-c": "'catastrophic' is not a valid Severity",
           "job-d": "'yesterday' is not an ISO time", "job-e": "not a list of 1 to", "job-f": "saved under another key",
           "job-g": "line is '12', not a whole number", "job-h": "one fingerprint twice"}
    assert len(warnings) == 7 and all("starts fresh" in w for w in warnings)
    for job_id, fragment in why.items():
        assert any(f"job {job_id} are unreadable" in w and fragment in w for w in warnings), job_id
    after.detect([])
    assert list(second.detector_state.load_all("log_rules")) == [LOG_JOB.id]  # the unreadable rows are gone
    after.detect([ray_job_state("SUCCEEDED", Subject(kind=SubjectKind.JOB, id=j)) for j in (LOG_JOB.id, *why)])
    [recovery] = after.recoveries()
    assert recovery.fingerprint == reported.fingerprint
