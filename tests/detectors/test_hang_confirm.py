"""A suspected hang confirmed (or held back) by two stack samples: detectors/hang_stacks.py `judge` on real py-spy
dumps (tests/fixtures/stacks), and the stall detector's suspicion, confirmation and deferral on a fake clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from core.types import Signal, SignalKind, Subject, SubjectKind
from detectors.hang_stacks import RankStack, judge, ranks_of
from detectors.stall import StallDetector
from tests.detectors.test_stall import JOB, Log, poll, run_steps
from tests.support import Clock

STACKS = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SITE = "/work/main/.venv/lib/python3.11/site-packages"
# A rank writing a checkpoint, in py-spy's format (constructed: the frames torch.save goes through)
SAVING = f"""Process 4003: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4003 (active+gil): "MainThread"
    write (zipfile.py:1200)
    _save (torch/serialization.py:1150)
    save ({SITE}/torch/serialization.py:965)
    save_checkpoint (train.py:88)
    train (train.py:120)
"""
SPIN_ELSEWHERE = """Process 4001: python gloo2.py 1
Python v3.11.7 (/usr/bin/python3.11)

Thread 4001 (active+gil): "MainThread"
    shuffle_buffer (gloo2.py:31)
    <module> (gloo2.py:20)
"""


def dump(name: str) -> str:
    return (STACKS / name).read_text()


def proc(pid: int, text: str | None, *, label: str = "Rank", state: str | None = None,
         node: str = "10.0.0.7", error: str | None = None) -> dict[str, Any]:
    return {"label": label, "pid": pid, "node_id": f"node-{node}", "node_ip": node, "dump": text, "error": error,
            "state": state}


def ranks(*procs: dict[str, Any]) -> list[RankStack]:
    return ranks_of(list(procs))


WAIT = dump("gloo_rank0_in_all_reduce.txt")


def test_a_stopped_rank_confirms_the_hang_and_is_named() -> None:
    sample = [proc(4000, WAIT, node="10.0.0.5"), proc(4002, None, state="T", error=dump("gloo_rank2_stopped.txt"))]
    call = judge(ranks(*sample), ranks(*sample))
    assert call.verdict == "hung"
    [culprit] = call.localization.culprits
    assert (culprit.rank.pid, culprit.rank.node, culprit.kind) == (4002, "10.0.0.7", "stopped")
    assert "stopped (state T)" in call.localization.sentence and "1 other rank waits in all_reduce" in call.why


def test_a_rank_spinning_or_blocked_in_one_place_while_the_others_wait_confirms_the_hang() -> None:
    for odd in ("gloo_rank1_spinning.txt", "gloo_rank2_blocked_on_lock.txt"):
        sample = [proc(4000, WAIT), proc(4004, WAIT), proc(4001, dump(odd), state="R")]
        call = judge(ranks(*sample), ranks(*sample))
        assert call.verdict == "hung", odd
        assert [c.rank.pid for c in call.localization.culprits] == [4001]
        assert "state R" in call.localization.sentence  # the process state is part of who it is


def test_a_rank_whose_stack_moves_to_another_function_is_busy_not_confirmed() -> None:
    first = ranks(proc(4000, WAIT), proc(4001, dump("gloo_rank1_spinning.txt")))
    second = ranks(proc(4000, WAIT), proc(4001, SPIN_ELSEWHERE))
    call = judge(first, second)
    assert call.verdict == "busy" and "pid 4001" in call.why and "moved" in call.why


def test_a_rank_saving_a_checkpoint_is_silent_work_however_long_the_others_wait() -> None:
    sample = [proc(4000, WAIT), proc(4003, SAVING)]
    call = judge(ranks(*sample), ranks(*sample))
    assert call.verdict == "working"
    assert "saving a checkpoint" in call.why and "pid 4003" in call.why


def test_a_save_in_uninterruptible_sleep_is_still_silent_work() -> None:
    # Seen on the real cluster: torch.save of a checkpoint spends whole seconds in D (disk I/O), both samples.
    # With a readable stack, the stack decides and the state is said.
    in_d = [proc(4000, WAIT), proc(4003, SAVING, state="D")]
    call = judge(ranks(*in_d), ranks(*in_d))
    assert call.verdict == "working" and "state D" in call.why and "saving a checkpoint" in call.why
    # With none (py-spy cannot attach in D), what the rank was doing in the earlier sample, or the call before, says.
    unreadable = [proc(4000, WAIT), proc(4003, None, state="D", error="Error: Failed to suspend process")]
    call = judge(ranks(proc(4000, WAIT), proc(4003, SAVING, state="R")), ranks(*unreadable))
    assert call.verdict == "working" and "uninterruptible sleep (I/O) while saving a checkpoint" in call.why
    before = judge(ranks(proc(4000, WAIT), proc(4003, SAVING)), ranks(proc(4000, WAIT), proc(4003, SAVING)))
    call = judge(ranks(*unreadable), ranks(*unreadable), previous=before)
    assert call.verdict == "working"
    # A rank in D all along with no stack and nothing known of it is what it looks like: stuck in the kernel.
    assert judge(ranks(*unreadable), ranks(*unreadable)).verdict == "hung"
    blocked = [proc(4000, WAIT), proc(4003, dump("gloo_rank2_blocked_on_lock.txt"), state="D")]
    assert judge(ranks(*blocked), ranks(*blocked)).verdict == "hung"


def test_all_ranks_waiting_still_is_a_hang_whose_cause_is_elsewhere_but_moving_waits_are_not() -> None:
    still = [proc(4000, WAIT), proc(4001, WAIT)]
    call = judge(ranks(*still), ranks(*still))
    assert call.verdict == "hung" and "is not among them" in call.localization.sentence
    moved = WAIT.replace("distributed_c10d.py:", "distributed_c10d.py:1")  # other lines: calls that return
    call = judge(ranks(*still), ranks(proc(4000, moved), proc(4001, moved)))
    assert call.verdict == "busy"


def test_stacks_that_cannot_be_read_cannot_confirm() -> None:
    sample = [proc(4000, None, error="HTTP 500: py-spy is not installed"), proc(4001, None, error="timed out")]
    assert judge(ranks(*sample), ranks(*sample)).verdict == "unknown"
    lonely = [proc(4000, dump("gloo_rank1_spinning.txt"))]  # no rank in a collective: nothing waits for it
    assert judge(ranks(*lonely), ranks(*lonely)).verdict == "unknown"


def test_the_ranks_are_the_actor_class_in_the_collective_not_the_driver_or_helpers() -> None:
    found = ranks(proc(1, SPIN_ELSEWHERE, label="driver"), proc(2, dump("gloo_rank1_spinning.txt"), label="Logger"),
                  proc(3, WAIT, label="Worker"), proc(4, WAIT, label="Worker"))
    assert [r.pid for r in found] == [3, 4]
    assert [r.pid for r in ranks(proc(1, SPIN_ELSEWHERE, label="driver"))] == [1]  # a job with no actors


# -- the stall detector: suspicion, confirmation, deferral ------------------------------------------------------


def stacks(clock: Clock, first: list[dict[str, Any]], second: list[dict[str, Any]], taken: datetime) -> Signal:
    return Signal(kind=SignalKind.STACKS, source="http://head:8265/worker/traceback",
                  subject=Subject(kind=SubjectKind.JOB, id=JOB), observed_at=clock.now,
                  attrs={"samples": [first, second], "sampled_at": [taken.isoformat(), taken.isoformat()]})


def steady(clock: Clock) -> tuple[StallDetector, Log]:
    """A job that printed a step every 2 s until t=40 (suspected at t=60, called by silence alone at t=100)."""
    det, log = StallDetector(min_stall_s=60, factor=3, suspect_min_s=20, clock=clock), Log()
    run_steps(det, clock, log, [2.0 * i for i in range(1, 21)])
    return det, log


def test_a_suspected_job_is_sampled_once_and_its_stacks_confirm_the_hang_at_once() -> None:
    clock = Clock(T0)
    det, _ = steady(clock)
    assert poll(det, clock, 59) == [] and det.stack_requests() == []
    assert poll(det, clock, 61) == []  # suspected, not called: the stacks will tell
    assert det.stack_requests() == [JOB] and det.stack_requests() == []  # asked once
    sample = [proc(4000, WAIT), proc(4002, dump("gloo_rank2_blocked_on_lock.txt"), state="S")]
    [finding] = poll(det, clock, 65, stacks(clock, sample, sample, clock.at(62)))
    assert finding.attrs["confirmed_by"] == "stacks" and finding.confidence == 0.95
    assert finding.attrs["localization"]["culprits"][0]["pid"] == 4002
    assert "show a hang: Rank pid 4002 (node 10.0.0.7, state S) is blocked outside the collective" in finding.summary
    assert "10 min" not in finding.summary  # no timeout this job never stated
    assert [e.text for e in finding.evidence if e.source == "py-spy"] == [
        "Rank pid 4002 (node 10.0.0.7, state S) is blocked outside the collective, in <module> (gloo2.py:17)",
        "1 rank(s) wait in all_reduce (pids 4000; nodes 10.0.0.7)"]
    [again] = poll(det, clock, 70)  # it keeps firing as one incident while the hang lasts
    assert again.fingerprint == finding.fingerprint and det.stack_requests() == []


def test_a_job_that_became_suspect_between_ticks_is_sampled_at_once() -> None:
    # The sampler asks at the start of a tick, before the detector runs: the suspicion is judged then, not a tick late.
    clock = Clock(T0)
    det, _ = steady(clock)
    assert poll(det, clock, 59) == [] and det.stack_requests() == []
    clock.at(61)
    assert det.stack_requests() == [JOB] and det.stack_requests() == []
    sample = [proc(4000, WAIT), proc(4002, dump("gloo_rank2_blocked_on_lock.txt"), state="S")]
    [finding] = poll(det, clock, 64, stacks(clock, sample, sample, clock.at(62)))
    assert finding.attrs["confirmed_by"] == "stacks"


def test_samples_from_before_the_suspicion_or_of_a_job_that_moved_on_say_nothing() -> None:
    clock = Clock(T0)
    det, log = steady(clock)
    poll(det, clock, 61)
    sample = [proc(4000, WAIT), proc(4002, dump("gloo_rank2_blocked_on_lock.txt"))]
    assert poll(det, clock, 63, stacks(clock, sample, sample, clock.at(55))) == []  # taken before t=61
    assert poll(det, clock, 64, log.line("step 21 loss=0.4", clock.at(64))) == []  # it moved: no suspicion
    assert det.stack_requests() == []


def test_silent_work_holds_the_call_back_until_it_ends_or_lasts_too_long() -> None:
    clock = Clock(T0)
    det, log = steady(clock)
    poll(det, clock, 61)
    det.stack_requests()
    saving = [proc(4000, WAIT), proc(4003, SAVING)]
    assert poll(det, clock, 64, stacks(clock, saving, saving, clock.at(62))) == []
    assert poll(det, clock, 130) == []  # past the silence threshold (t=100): still saving, no hang
    assert det.stack_requests() == [JOB]  # asked again, resample_s after
    assert poll(det, clock, 131, log.line("step 21 loss=0.4", clock.at(131))) == []  # the save ended: no hang
    assert det.recoveries() == []

    clock = Clock(T0)  # a save that never ends is a hang after max_work_s
    det, _ = steady(clock)
    det.max_work = timedelta(seconds=300)
    poll(det, clock, 61)
    det.stack_requests()
    poll(det, clock, 64, stacks(clock, saving, saving, clock.at(62)))
    assert poll(det, clock, 40 + 299) == []
    [finding] = poll(det, clock, 40 + 301)
    assert finding.attrs["confirmed_by"] == "silence" and finding.attrs["stacks_verdict"] == "working"
    assert "saving a checkpoint" in finding.summary


def test_without_stacks_or_with_busy_stacks_the_hang_is_called_by_silence_alone() -> None:
    clock = Clock(T0)
    det, _ = steady(clock)
    poll(det, clock, 61)
    det.stack_requests()
    first = [proc(4000, WAIT), proc(4001, dump("gloo_rank1_spinning.txt"))]
    second = [proc(4000, WAIT), proc(4001, SPIN_ELSEWHERE)]
    assert poll(det, clock, 64, stacks(clock, first, second, clock.at(62))) == []
    assert poll(det, clock, 99) == []
    [finding] = poll(det, clock, 101)
    assert finding.attrs["confirmed_by"] == "silence" and finding.attrs["stacks_verdict"] == "busy"
    assert finding.attrs["localization"]["culprits"][0]["pid"] == 4001

    quiet = Clock(T0)  # no sampler at all: as before stacks existed
    det, _ = steady(quiet)
    assert poll(det, quiet, 99) == []
    [finding] = poll(det, quiet, 101)
    assert finding.attrs["confirmed_by"] == "silence" and finding.attrs["localization"] is None
