"""StallDetector on constructed signals with a fake clock: what stops, what is merely slow, what resumes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from core.errors import ConfigError
from core.types import Category, Signal, SignalKind, Subject, SubjectKind
from detectors.stall import LOG_GROWTH, ProgressPattern, StallDetector
from tests.support import Clock
from tests.support.job_states import resubmission

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
JOB = "raysubmit_abc"
LOG = "/tmp/ray/session/logs/job-driver-raysubmit_abc.log"


def job_state(status: str = "RUNNING", job: str = JOB) -> Signal:
    return Signal(
        kind=SignalKind.JOB_STATE,
        source="ray.jobs",
        subject=Subject(kind=SubjectKind.JOB, id=job, name="python train.py"),
        observed_at=T0,
        attrs={"status": status, "submission_id": job},
    )


class Log:
    """Lines of one job's driver log, numbered like the file."""

    def __init__(self, job: str = JOB, source: str = LOG, stream: str = "job-logs") -> None:
        self.job, self.source, self.stream, self.n = job, source, stream, 0

    def line(self, text: str, at: datetime) -> Signal:
        self.n += 1
        return Signal(
            kind=SignalKind.LOG_LINE,
            source=self.source,
            subject=Subject(kind=SubjectKind.JOB, id=self.job),
            observed_at=at,
            text=text,
            line=self.n,
            attrs={"stream": self.stream},
        )


def gpu_util(value: float, at: datetime, gpu: str = "GPU-1", job: str = JOB) -> Signal:
    return Signal(
        kind=SignalKind.METRIC,
        source="prometheus",
        subject=Subject(kind=SubjectKind.GPU, id=gpu, name=f"node1/{gpu}"),
        observed_at=at,
        value=value,
        attrs={"metric": "DCGM_FI_DEV_GPU_UTIL", "labels": {"submission_id": job}},
    )


def run_steps(det: StallDetector, clock: Clock, log: Log, times: list[float], fmt: str = "step {n} loss=0.5"):
    """One step line per poll at each time; returns the findings of every poll."""
    out = []
    for n, t in enumerate(times, start=1):
        at = clock.at(t)
        out.append(det.detect([job_state(), log.line(fmt.format(n=n), at)]))
    return out


def poll(det: StallDetector, clock: Clock, t: float, *signals: Signal):
    clock.at(t)
    return det.detect([job_state(), *signals])


def test_fires_after_three_step_intervals_with_the_last_step_as_evidence() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    assert run_steps(det, clock, log, [10.0 * i for i in range(1, 11)]) == [[]] * 10  # last step at t=100
    # interval 10 s -> threshold max(60, 30) = 60 s
    assert poll(det, clock, 159) == []
    [finding] = poll(det, clock, 161)
    assert finding.category is Category.NCCL_HANG and finding.reason == "TrainingStalled"
    assert finding.subject.id == JOB and finding.subject.name == "python train.py"
    last = finding.evidence[0]
    assert (last.source, last.line, last.at) == (LOG, 10, T0 + timedelta(seconds=100))
    assert "step 10 loss=0.5" in last.text
    assert finding.attrs["step_interval_s"] == pytest.approx(10.0)
    assert finding.attrs["threshold_s"] == pytest.approx(60.0)
    assert finding.attrs["stalled_s"] == pytest.approx(61.0)
    assert finding.attrs["submission_id"] == JOB
    assert finding.first_seen == T0 + timedelta(seconds=100)
    # still stalled: the same episode, the same fingerprint
    [again] = poll(det, clock, 200)
    assert again.fingerprint == finding.fingerprint and again.attrs["stalled_s"] == pytest.approx(100.0)
    assert det.recoveries() == []


def test_the_threshold_follows_the_jobs_own_step_interval() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [40.0 * i for i in range(1, 8)])  # last step at t=280, interval 40 s
    assert poll(det, clock, 280 + 119) == []
    [finding] = poll(det, clock, 280 + 121)
    assert finding.attrs["threshold_s"] == pytest.approx(120.0)


def test_progress_resuming_ends_the_episode_and_a_new_stall_is_the_same_fault_back() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0 * i for i in range(1, 6)])  # last at 50
    [first] = poll(det, clock, 111)
    assert poll(det, clock, 115, log.line("step 6 loss=0.4", clock.at(115))) == []
    [recovered] = det.recoveries()
    assert recovered.fingerprint == first.fingerprint and recovered.detector == "stall"
    assert recovered.reason.startswith("progress resumed (steps)") and "step 6 loss=0.4" in recovered.reason
    assert recovered.observed_at == clock.at(115)
    assert det.recoveries() == []
    [second] = poll(det, clock, 115 + 3 * 65 + 1)
    assert second.fingerprint == first.fingerprint  # the same job hung again: the desk reopens its incident
    assert second.evidence[0].line == log.n


def test_slow_but_progressing_job_is_never_flagged() -> None:
    """The step interval grows 20 s -> ~200 s, gradually; every step still arrives."""
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    t, gap, n = 0.0, 20.0, 0
    step_times = []
    while gap < 200:
        t += gap
        step_times.append(t)
        gap *= 1.15
    for t_next in step_times:
        # poll every 5 s between steps, like the pipeline does
        while clock.now < T0 + timedelta(seconds=t_next - 5):
            assert poll(det, clock, (clock.now - T0).total_seconds() + 5) == []
        n += 1
        assert poll(det, clock, t_next, log.line(f"step {n}", clock.at(t_next))) == []


def test_batched_lines_share_their_polls_gap() -> None:
    """A poll every 5 s reads ten 0.5 s steps at once: the interval is 0.5 s, not 0 and not 5."""
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=5, factor=3, clock=clock)
    n = 0
    for t in (5.0, 10.0, 15.0, 20.0):
        at = clock.at(t)
        batch = []
        for _ in range(10):
            n += 1
            batch.append(log.line(f"step {n}", at))
        assert det.detect([job_state(), *batch]) == []
    assert poll(det, clock, 24.9) == []
    [finding] = poll(det, clock, 25.1)
    assert finding.attrs["step_interval_s"] == pytest.approx(0.5)
    assert finding.attrs["threshold_s"] == pytest.approx(5.0)
    assert finding.evidence[0].text == "step 40"


def test_only_running_jobs_are_judged() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    for status in ("PENDING", "SUCCEEDED"):
        clock.at(0)
        det.detect([job_state(status), log.line("step 1", clock.now)])
        clock.at(10)
        det.detect([job_state(status), log.line("step 2", clock.now)])
        clock.at(1000)
        assert det.detect([job_state(status)]) == []
    # lines of a job no state collector has reported: not judged either
    other = Log(job="raysubmit_unknown")
    det.detect([other.line("step 1", clock.at(0)), other.line("step 2", clock.at(10))])
    assert det.detect([]) == []


def test_a_job_that_finishes_while_stalled_ends_its_episode_but_is_not_a_recovery() -> None:
    """The hang ended with the job, not with progress: its incident stays open for the failed-job path."""
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0, 20.0, 30.0])
    [finding] = poll(det, clock, 100)
    clock.at(105)
    assert det.detect([job_state("FAILED")]) == []
    assert det.recoveries() == []
    assert det.progress() == {}  # the job is no longer judged


def test_a_hung_job_stopped_and_resubmitted_closes_once_the_resubmission_runs() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0, 20.0, 30.0])
    [finding] = poll(det, clock, 100)
    clock.at(110)  # Argus's resubmit_job stops the hung job, then submits JOB-r1
    det.detect([job_state("STOPPED"), resubmission(JOB, 1, "PENDING", at=clock.now),
                job_state("RUNNING", job="raysubmit_unrelated")])
    assert det.recoveries() == []
    clock.at(120)
    assert det.detect([job_state("STOPPED"), resubmission(JOB, 1, "RUNNING", at=clock.now)]) == []
    [recovered] = det.recoveries()
    assert recovered.fingerprint == finding.fingerprint and recovered.detector == "stall"
    assert recovered.reason == (
        f"job {JOB} ended STOPPED while hung and was resubmitted as {JOB}-r1, which reached RUNNING")
    det.detect([job_state("STOPPED"), resubmission(JOB, 1, "RUNNING", at=clock.tick(10))])
    assert det.recoveries() == []


def test_a_job_that_ended_without_hanging_has_no_stall_to_close_when_resubmitted() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0, 20.0, 30.0])
    clock.at(40)
    det.detect([job_state("FAILED")])
    det.detect([job_state("FAILED"), resubmission(JOB, 1, "RUNNING", at=clock.tick(10))])
    assert det.recoveries() == []


def test_repeated_steps_and_other_lines_are_not_progress_once_a_job_prints_steps() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0 * i for i in range(1, 6)], fmt="(Trainer pid=1) step {n}")  # last: step 5 @50
    noise = [
        log.line("(Trainer pid=2) step 5", clock.at(60)),  # rank 1 catching up to the same step
        log.line("(Trainer pid=2) step 4", clock.at(60)),
        log.line("(raylet) WARNING: 1 PYTHON worker processes have been started on node", clock.at(90)),
    ]
    for signal in noise:
        det.detect([job_state(), signal])
    [finding] = poll(det, clock, 111)
    assert finding.evidence[0].line == 5  # the last real progress, not the echoes after it


@pytest.mark.parametrize(
    "fmt",
    [
        "step:{n} - actor/entropy:0.61 - critic/score/mean:0.12",  # verl
        "Epoch 0:  {n}%|####      | {n}/100 [00:10<00:12, 4.5it/s, loss=0.5]",  # Lightning / tqdm
        " iteration      {n}/    1000 | consumed samples: 1024 | lm loss: 5.2E+00",  # Megatron
        "INFO trainer: global_step={n} loss=0.5",
        "{{'loss': 0.52, 'learning_rate': 1e-05, 'epoch': 0.0{n}}}",  # Hugging Face Trainer
        "[Step #{n}] lr=0.001",
    ],
)
def test_common_progress_line_formats(fmt: str) -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0 * i for i in range(1, 8)], fmt=fmt)
    [finding] = poll(det, clock, 70 + 61)
    assert finding.attrs["mode"] == "steps"
    assert finding.attrs["step_interval_s"] == pytest.approx(10.0)


def test_tqdm_bar_starting_over_is_progress() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    fmt = "Epoch {e}: {p}%|###| {n}/4 [00:01<00:01]"
    t = 0.0
    for epoch in (1, 2, 3):
        for n in range(1, 5):
            t += 10
            assert poll(det, clock, t, log.line(fmt.format(e=epoch, p=n * 25, n=n), clock.at(t))) == []
    [finding] = poll(det, clock, t + 61)
    assert "Epoch 3: 100%" in finding.evidence[0].text


def test_a_fast_counter_does_not_hide_a_slow_one() -> None:
    """Rollout bars print every second, training steps every 100 s: silence after a rollout is normal."""
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    t = 0.0
    for step in range(1, 5):
        for n in range(1, 31):
            t += 1
            det.detect([job_state(), log.line(f"Processed prompts: {n * 3}%|#| {n}/30 [00:01<00:01]", clock.at(t))])
        t += 70
        det.detect([job_state(), log.line(f"step:{step} - actor/loss:0.1", clock.at(t))])
    # 100 s per training step; 200 s since the last rollout line is still inside 3 x 100 s
    assert poll(det, clock, t + 200) == []
    [finding] = poll(det, clock, t + 301)
    assert finding.attrs["step_interval_s"] == pytest.approx(100.0)


def test_log_growth_is_progress_for_jobs_without_step_lines() -> None:
    """Before its first step a job is judged by log growth, against the startup grace."""
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, startup_grace_s=120, clock=clock)
    for t in (10.0, 20.0, 30.0, 40.0):
        assert poll(det, clock, t, log.line(f"loading shard at {t}", clock.at(t))) == []
    assert poll(det, clock, 159) == []
    [finding] = poll(det, clock, 161)
    assert finding.attrs["mode"] == LOG_GROWTH
    assert finding.attrs["threshold_s"] == pytest.approx(120.0)
    assert finding.confidence < 0.8
    # a job that was quiet for 160 s and then spoke again has shown it may: it gets 3 x 160 s
    assert poll(det, clock, 200, log.line("loading shard again", clock.at(200))) == []
    [recovered] = det.recoveries()
    assert recovered.fingerprint == finding.fingerprint and "progress resumed (log lines)" in recovered.reason
    assert poll(det, clock, 200 + 479) == []
    assert len(poll(det, clock, 200 + 481)) == 1


def test_the_first_step_ends_the_startup_grace() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, startup_grace_s=600, clock=clock)
    assert poll(det, clock, 10, log.line("importing torch", clock.at(10))) == []
    assert poll(det, clock, 500) == []  # silent start-up, inside the grace
    run_steps(det, clock, log, [500.0, 510.0, 520.0, 530.0])
    [finding] = poll(det, clock, 591)
    assert finding.attrs["mode"] == "steps"


def test_gpu_activity_counts_as_progress_and_a_pinned_gpu_does_not() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0 * i for i in range(1, 6)])  # last step at 50
    # a long eval phase without step lines, GPUs busy and varying
    for i, t in enumerate(range(60, 200, 30)):
        assert poll(det, clock, t, gpu_util(40.0 + 30 * (i % 2), clock.at(t))) == []
    # without the GPUs this would have fired at t=111; from t=210 the GPU is pinned at 100%, which is
    # what a spinning NCCL kernel looks like: the jump to 100 is the last movement
    for t in (210, 240, 270):
        assert poll(det, clock, t, gpu_util(100.0, clock.at(t))) == []
    [finding] = poll(det, clock, 300, gpu_util(100.0, clock.now))
    gpu = [e for e in finding.evidence if "DCGM_FI_DEV_GPU_UTIL" in e.text]
    assert gpu and gpu[0].value == 100.0
    assert finding.attrs["gpus"] == ["GPU-1"]


def test_other_streams_are_not_the_jobs_progress() -> None:
    clock, log = Clock(T0), Log()
    raylet = Log(source="raylet.out", stream="raylet")
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0, 20.0, 30.0, 40.0])
    for t in (60.0, 80.0, 100.0):
        det.detect([job_state(), raylet.line(f"step {int(t)}", clock.at(t))])
    assert len(poll(det, clock, 101)) == 1


def test_fingerprint_is_stable_across_restarts() -> None:
    prints = []
    for _ in range(2):
        clock, log = Clock(T0), Log()
        det = StallDetector(min_stall_s=60, factor=3, clock=clock)
        run_steps(det, clock, log, [10.0, 20.0, 30.0, 40.0])
        [finding] = poll(det, clock, 101 + len(prints) * 50)
        prints.append(finding.fingerprint)
    assert prints[0] == prints[1]


def test_too_few_steps_wait_factor_times_the_floor() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    run_steps(det, clock, log, [10.0])
    assert poll(det, clock, 10 + 179) == []
    [finding] = poll(det, clock, 10 + 181)
    assert finding.attrs["step_interval_s"] is None


def test_patterns_are_data_and_bad_ones_fail_at_start() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, patterns=[{"name": "it", "pattern": r"\bit=(?P<step>\d+)"}], clock=clock)
    run_steps(det, clock, log, [10.0, 20.0, 30.0], fmt="it={n}")
    assert poll(det, clock, 91)[0].attrs["mode"] == "steps"
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        ProgressPattern("broken", r"step (\d+")
    with pytest.raises(ConfigError, match="needs a name and a pattern"):
        StallDetector(patterns=[{"pattern": "x"}])
    with pytest.raises(ConfigError, match="min_stall_s"):
        StallDetector(min_stall_s=0)


def test_the_rank_whose_progress_stopped_first_is_named_when_no_stack_says() -> None:
    # Ray tags each actor's lines with its pid and node; a rank that stopped printing well before the others is the
    # odd one when no stacks were taken.
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=60, factor=3, clock=clock)
    for n, t in enumerate(range(5, 55, 5), start=1):
        lines = [log.line(f"(Rank pid=101, ip=10.0.0.7) step {n} loss=0.5", clock.at(t))]
        if t <= 30:
            lines.append(log.line(f"(Rank pid=102, ip=10.0.0.8) step {n} loss=0.5", clock.at(t)))
        det.detect([job_state(), *lines])
    [finding] = poll(det, clock, 111)
    assert finding.attrs["stopped_first"] == {"pid": 102, "node": "10.0.0.8"}
    assert "pid 102 (node 10.0.0.8) printed its last progress 20 s before any other rank: 'step 6 loss=0.5'" in \
        finding.summary
    assert [r["pid"] for r in finding.attrs["rank_progress"]] == [102, 101]
    assert any("printed its last progress" in e.text for e in finding.evidence)


def test_ranks_that_stopped_together_or_printed_once_name_no_rank() -> None:
    for stop_b, b_lines in ((50, 10), (50, 1)):
        clock, log = Clock(T0), Log()
        det = StallDetector(min_stall_s=60, factor=3, clock=clock)
        for n, t in enumerate(range(5, 55, 5), start=1):
            lines = [log.line(f"(Rank pid=101, ip=10.0.0.7) step {n} loss=0.5", clock.at(t))]
            if t <= stop_b and n <= b_lines:
                lines.append(log.line(f"(Rank pid=102, ip=10.0.0.8) step {n} loss=0.5", clock.at(t)))
            det.detect([job_state(), *lines])
        [finding] = poll(det, clock, 111)
        assert finding.attrs["stopped_first"] is None and "printed its last progress" not in finding.summary
