"""StallDetector on a log's backlog (lines a collector dated because the file was first seen with them): they count
as progress when they were written, not when read, teach the job's real rhythm, and never call a stall before the
job's usual threshold after Argus first read them."""

from __future__ import annotations

from datetime import datetime, timedelta

from core import signal_keys as keys
from core.types import Signal
from detectors.stall import StallDetector
from tests.detectors.test_stall import T0, Log, job_state, poll
from tests.support import Clock


def dated(log: Log, text: str, written: datetime, read_at: datetime, *, history: bool = False) -> Signal:
    signal = log.line(text, read_at)
    return signal.model_copy(update={"attrs": {**signal.attrs, keys.LINE_TIME: written.isoformat(),
                                               keys.HISTORY: history}})


def burst(log: Log, read_at: datetime, last_written: datetime, steps: int, every_s: float) -> list[Signal]:
    """`steps` step lines written `every_s` apart up to `last_written`, all read at `read_at`."""
    first = last_written - timedelta(seconds=every_s * (steps - 1))
    return [dated(log, f"step {n} loss=0.5", first + timedelta(seconds=every_s * (n - 1)), read_at)
            for n in range(1, steps + 1)]


def test_a_burst_of_old_steps_is_the_jobs_real_rhythm_not_progress_now() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=20, factor=3, clock=clock)
    # Argus starts at T0 and reads 30 steps written 5 s apart, the last one 2 s before it started
    assert det.detect([job_state(), *burst(log, T0, T0 - timedelta(seconds=2), 30, every_s=5.0)]) == []
    progress = det.progress()[log.job]
    assert progress.step == 30 and progress.interval_s == 5.0  # learnt from when they were written
    # steps go on at the same pace, read as they come: no stall
    for n in range(31, 40):
        assert poll(det, clock, 5.0 * (n - 30) - 2, log.line(f"step {n} loss=0.5", clock.at(5.0 * (n - 30) - 2))) == []
    assert det.progress()[log.job].interval_s == 5.0
    # then they stop: stalled after max(20, 3 x 5) = 20 s, as for a job watched from its start
    last = 5.0 * 9 - 2
    assert poll(det, clock, last + 19) == []
    [finding] = poll(det, clock, last + 21)
    assert finding.attrs["step_interval_s"] == 5.0


def test_a_job_silent_for_hours_in_its_backlog_is_stalled_only_after_its_threshold_from_the_first_read() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=20, factor=3, clock=clock)
    hours_ago = T0 - timedelta(hours=3)
    lines = burst(log, T0, hours_ago, 10, every_s=4.0)
    assert det.detect([job_state(), *lines]) == []  # threshold 20 s; silent for 3 h, but read just now
    assert poll(det, clock, 19) == []
    [finding] = poll(det, clock, 21)
    assert finding.first_seen == hours_ago  # the last progress, as it was written
    assert finding.attrs["stalled_s"] > 3 * 3600
    assert finding.attrs["last_progress_line_no"] == 10


def test_a_backlog_step_then_new_steps_recover_nothing_and_call_nothing() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=20, factor=3, clock=clock)
    det.detect([job_state(), *burst(log, T0, T0 - timedelta(hours=3), 5, every_s=4.0)])
    # the job moves again 10 s after Argus started: its gap is long once, the threshold follows its steps
    for t in (10.0, 14.0, 18.0, 22.0, 26.0, 30.0):
        assert poll(det, clock, t, log.line(f"step {int(t)} loss", clock.at(t))) == []
    assert det.recoveries() == []
    assert poll(det, clock, 45) == []


def test_stamps_later_than_the_read_count_as_read_then() -> None:
    # a node whose clock runs ahead (or stamps read in the wrong zone): the line cannot be newer than its reading
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=20, factor=3, clock=clock)
    ahead = T0 + timedelta(hours=8)
    det.detect([job_state(), dated(log, "step 1 loss", ahead, T0), dated(log, "step 2 loss", ahead, T0)])
    [finding] = poll(det, clock, 61)  # few steps: max(20, ...) x 3 = 60 s after T0, not 8 h later
    assert finding.first_seen == T0


def test_a_job_seen_only_through_its_old_backlog_is_not_forgotten_at_once() -> None:
    clock, log = Clock(T0), Log()
    det = StallDetector(min_stall_s=20, factor=3, forget_after_s=3600, clock=clock)
    det.detect([dated(log, "step 1 loss", T0 - timedelta(days=2), T0, history=True)])  # no JOB_STATE this tick
    det.detect([job_state()])
    [finding] = poll(det, clock, 61)
    assert finding.attrs["last_progress_line_no"] == 1
