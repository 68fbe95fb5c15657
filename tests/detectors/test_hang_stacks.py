"""Which rank holds a hang up (detectors/hang_stacks.py), on real py-spy dumps of a 3-rank gloo job (see
tests/fixtures/stacks/README.md): rank 0 waits in all_reduce, rank 1 spins outside it, rank 2 blocks on a lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.hang_stacks import RankStack, judge, localize, parse_dump, place_of

STACKS = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def dump(name: str) -> str:
    return (STACKS / name).read_text()


def rank(pid: int, name: str, node: str = "10.0.0.7", state: str | None = None) -> RankStack:
    return RankStack(label=f"Rank pid {pid}", pid=pid, node=node, dump=dump(name), state=state)


WAITING = rank(4000, "gloo_rank0_in_all_reduce.txt", "10.0.0.5")


def test_a_dump_parses_into_threads_and_frames_innermost_first() -> None:
    [main] = parse_dump(dump("gloo_rank0_in_all_reduce.txt"))
    assert main.name == "MainThread" and main.status == "idle"
    assert main.frames[0].func == "all_reduce" and main.frames[0].file.endswith("torch/distributed/distributed_c10d.py")
    assert main.frames[0].collective and not main.frames[-1].collective
    assert parse_dump("not a dump\nat all") == [] and parse_dump("") == []


def test_a_rank_spinning_outside_the_collective_is_named_with_its_line() -> None:
    found = localize([WAITING, rank(4001, "gloo_rank1_spinning.txt")])
    [culprit] = found.culprits
    assert culprit.rank.pid == 4001 and culprit.busy
    assert found.sentence == ("Rank pid 4001 (node 10.0.0.7) runs outside the collective, in <module> (gloo2.py:14); "
                              "1 other rank waits in all_reduce")


def test_a_rank_blocked_on_a_lock_is_named_as_blocked() -> None:
    found = localize([WAITING, WAITING, rank(4002, "gloo_rank2_blocked_on_lock.txt")])
    assert [c.rank.pid for c in found.culprits] == [4002]
    assert "is blocked outside the collective, in <module> (gloo2.py:17); 2 other ranks wait in all_reduce" in (
        found.sentence)


def test_a_stopped_rank_is_the_culprit_by_its_state_and_its_unreadable_stack_says_why() -> None:
    found = localize([WAITING, rank(4002, "gloo_rank2_stopped.txt", state="T")])
    assert found.sentence.startswith("Rank pid 4002 (node 10.0.0.7) stopped (state T)")
    # without the state, the dump py-spy could not take is still the odd one out, saying why
    unknown = localize([WAITING, rank(4002, "gloo_rank2_stopped.txt")])
    assert [c.rank.pid for c in unknown.culprits] == [4002]
    assert "could not suspend it" in unknown.sentence


def test_when_every_rank_waits_the_report_says_the_cause_is_elsewhere() -> None:
    found = localize([WAITING, rank(4003, "gloo_rank0_in_all_reduce.txt")])
    assert not found.culprits
    assert "all 2 ranks Argus could see wait in all_reduce" in found.sentence


def test_a_collective_is_known_by_its_library_not_only_its_name() -> None:
    own = "Thread 1 (idle): \"MainThread\"\n    wait (mytrainer/queue.py:10)\n    main (train.py:3)\n"
    place = place_of(RankStack("r", 1, None, own))
    assert place.kind == "elsewhere" and place.frame and place.frame.func == "wait"


@pytest.mark.parametrize("text", ["", "\x00" * 100, "Thread x (idle)\n" * 10_000, "    a (b:1)\n" * 50_000])
def test_hostile_or_huge_dumps_are_read_without_error(text: str) -> None:
    found = localize([RankStack("r", None, None, text), WAITING])
    assert found.places and isinstance(found.sentence, str)
    assert found.as_json()["ranks"]


def test_a_rank_waiting_for_its_gpu_is_the_one_a_host_collective_waits_for_on_real_gpu_dumps() -> None:
    # bench/gpu_checks.py on an H200 (tests/fixtures/stacks/README.md): rank 0 blocks in torch.cuda.synchronize()
    # behind a kernel that does not end, rank 1 waits for it in a gloo all_reduce.
    stuck = RankStack("rank 0 pid 607", 607, "127.0.0.1", dump("h200_rank0_waits_for_its_gpu.txt"), gpu="0")
    waits = RankStack("rank 1 pid 608", 608, "127.0.0.1", dump("h200_rank1_in_all_reduce.txt"), gpu="0")
    assert place_of(stuck).kind == "gpu_wait" and not place_of(stuck).busy  # py-spy's "active" is the CUDA spin
    found = localize([stuck, waits])
    assert [c.rank.pid for c in found.culprits] == [607]
    assert found.sentence == ("rank 0 pid 607 (node 127.0.0.1, GPU 0) waits for its GPU, in synchronize "
                              "(__init__.py:1162): work queued on the GPU does not finish; 1 other rank waits in "
                              "all_reduce")
    call = judge([stuck, waits], [stuck, waits])
    assert call.verdict == "hung" and call.localization.culprits[0].rank.pid == 607


def test_ranks_all_waiting_for_their_gpus_are_a_hang_with_no_culprit_and_a_spinning_rank_among_them_is_one() -> None:
    # With NCCL a collective is a GPU kernel: every rank of a hung collective sits in a GPU wait.
    ranks = [RankStack(f"rank {i} pid {700 + i}", 700 + i, "10.0.0.5", dump("h200_rank0_waits_for_its_gpu.txt"))
             for i in range(4)]
    found = localize(ranks)
    assert not found.culprits and len(found.waiting) == 4
    assert found.sentence.startswith("all 4 ranks Argus could see wait for their GPUs (in synchronize)")
    assert judge(ranks, ranks).verdict == "hung"
    spinning = rank(4001, "gloo_rank1_spinning.txt")
    found = localize([*ranks[:3], spinning])
    assert [c.rank.pid for c in found.culprits] == [4001] and len(found.waiting) == 3


def test_native_frames_are_not_python_frames() -> None:
    # py-spy --native adds library frames without a line ("cuCtxSynchronize_v2 (libcuda.so...)"): the Python frames
    # still place the rank.
    stuck = RankStack("rank 0", 607, None, dump("h200_rank0_waits_for_its_gpu_native.txt"))
    assert place_of(stuck).kind == "gpu_wait"
