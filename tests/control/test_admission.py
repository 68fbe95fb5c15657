"""Gang admission (control/admission.py): whole gangs or nothing, best fit, first that fits, claims not yet visible
in Ray, per-user limits, and reasons a person understands. Plain data: the real cluster's run is
test_queue_real.py."""

from __future__ import annotations

from control.admission import Admit, Candidate, Claim, Gang, NodeCapacity, Wait, admit, best_fit, why_waiting


def node(name: str, free: float, *, total: float = 8, pool: str | None = "h20") -> NodeCapacity:
    return NodeCapacity(node_id=f"id-{name}", name=name, pool=pool, total_gpus=total, free_gpus=free)


def job(key: str, nnodes: int, gpus: int, *, pool: str | None = "h20", owner: str = "alice") -> Candidate:
    return Candidate(key, owner, Gang(nnodes=nnodes, gpus_per_node=gpus, pool=pool))


def test_a_gang_is_admitted_whole_or_not_at_all() -> None:
    nodes = [node("a", 8), node("b", 4)]
    decisions = admit([job("j1", 2, 8)], nodes, [])
    assert decisions == [Wait("j1", "waiting for 2 nodes × 8 GPUs in pool h20: 1 node has 8 free (a)")]
    assert admit([job("j2", 2, 4)], nodes, []) == [Admit("j2", ("id-b", "id-a"))]


def test_best_fit_keeps_whole_nodes_for_bigger_gangs() -> None:
    nodes = [node("full", 8), node("half", 4)]
    assert best_fit({"id-full": 8, "id-half": 4}, Gang(1, 4, "h20"), nodes) == ("id-half",)
    # so a 4-GPU job then an 8-GPU job both start, where worst fit would have blocked the second
    assert [type(d) for d in admit([job("small", 1, 4), job("big", 1, 8)], nodes, [])] == [Admit, Admit]


def test_first_that_fits_lets_a_small_job_pass_a_big_one_that_waits() -> None:
    nodes = [node("a", 8), node("b", 8)]
    decisions = admit([job("big", 3, 8), job("small", 1, 8), job("next", 1, 8), job("late", 1, 8)], nodes, [])
    assert [type(d).__name__ for d in decisions] == ["Wait", "Admit", "Admit", "Wait"]
    assert "pool h20 has only 2 nodes with 8 GPUs in all" in decisions[0].reason  # type: ignore[union-attr]
    assert decisions[3] == Wait("late", "waiting for 1 node × 8 GPUs in pool h20: no node has 8 free "
                                        "(the most on one node: 0)")


def test_a_started_job_not_yet_seen_in_ray_holds_its_place() -> None:
    nodes = [node("a", 8), node("b", 8)]
    claim = Claim("first", "bob", Gang(1, 8, "h20"), seen_gpus=0)  # admitted a moment ago: Ray shows nothing yet
    assert admit([job("second", 2, 8)], nodes, [claim]) == [
        Wait("second", "waiting for 2 nodes × 8 GPUs in pool h20: 1 node has 8 free (b)")]
    # once Ray shows its GPUs used, the claim takes nothing more: Ray's free figure already counts them
    seen = Claim("first", "bob", Gang(1, 8, "h20"), seen_gpus=8)
    assert admit([job("second", 1, 8)], [node("a", 0), node("b", 8)], [seen]) == [Admit("second", ("id-b",))]


def test_pools_are_kept_apart_and_an_empty_pool_says_so() -> None:
    nodes = [node("a", 8, pool="h100"), node("b", 8, pool="h20")]
    assert admit([job("x", 1, 8, pool="h100")], nodes, []) == [Admit("x", ("id-a",))]
    assert admit([job("y", 1, 8, pool="a6000")], nodes, [])[0] == Wait(
        "y", "waiting for 1 node × 8 GPUs in pool a6000: no alive node is in pool a6000 (draining, offline and "
             "failed nodes take no new job); it starts when one joins")
    assert admit([job("z", 2, 8, pool=None)], nodes, []) == [Admit("z", ("id-a", "id-b"))]


def test_a_job_without_gpus_always_fits() -> None:
    assert admit([job("cpu", 4, 0)], [], []) == [Admit("cpu", ())]


def test_the_user_limit_counts_every_live_job_of_the_user() -> None:
    nodes = [node("a", 8), node("b", 8), node("c", 8)]
    held = [Claim("run1", "alice", Gang(1, 8, "h20"), seen_gpus=8)]
    limit = {"alice": 16, "bob": None}.get
    decisions = admit([job("a2", 1, 8), job("a3", 1, 8), job("b1", 1, 8, owner="bob")],
                      [node("a", 0), node("b", 8), node("c", 8)], held, user_limit=limit)
    assert isinstance(decisions[0], Admit) and isinstance(decisions[2], Admit)
    assert decisions[1] == Wait("a3", "waiting for user alice's GPUs: their running jobs hold 16 of the 16 GPUs a "
                                      "user may hold at once, and this job needs 8")
    never = admit([job("huge", 3, 8)], nodes, [], user_limit=lambda _u: 16)[0]
    assert isinstance(never, Wait) and never.reason.endswith("it can never start under this limit")


def test_why_waiting_names_at_most_a_few_nodes() -> None:
    nodes = [node(f"n{i}", 8) for i in range(10)]
    reason = why_waiting(Gang(11, 8, "h20"), {n.node_id: 8 for n in nodes}, nodes)
    assert "10 nodes have 8 free (n0, n1, n2, n3, n4, n5 …)" in reason
    assert "pool h20 has only 10 nodes with 8 GPUs in all, so it waits for nodes to join" in reason
