"""The one wording of what a job waits for and what the cluster has free (core.waits), shared by the job
controller's timeout reason and the waiting-job detector."""

from __future__ import annotations

from core.waits import (
    NodeFree,
    bundles_text,
    driver_advice,
    driver_wants,
    entrypoint_demand,
    free_text,
    matches,
)


def test_a_drivers_demand_is_what_ray_schedules_it_with() -> None:
    assert entrypoint_demand(resources={"worker": 0.001}, num_cpus=2, num_gpus=0, memory=None) == {
        "worker": 0.001, "CPU": 2.0}
    assert entrypoint_demand(num_gpus="x", memory=2 * 2**30) == {"memory": 2 * 2**30}
    assert driver_wants({"worker": 0.001, "memory": 2 * 2**30}, {}) == "resources worker=0.001, memory=2.0 GiB"
    assert driver_wants({}, {}) == "it a place"
    assert driver_wants({"GPU": 8}, {"argus.io/pool": "h100"}) == "labels argus.io/pool=h100 and resources GPU=8"


def test_the_advice_names_the_pool_when_there_is_one() -> None:
    assert driver_advice({"argus.io/pool": "h100"}).startswith("join a node into pool h100")
    assert driver_advice({}) == "see `ray status` for free nodes, or resubmit asking for less"


def test_equal_bundles_are_counted() -> None:
    assert bundles_text([{"GPU": 8}, {"GPU": 8.0}]) == "2 bundles of {GPU: 8}"
    assert bundles_text([{"GPU": 8, "CPU": 4}, {"CPU": 1}]) == "1 bundle of {GPU: 8, CPU: 4} and 1 bundle of {CPU: 1}"
    assert bundles_text([]) == "no bundles"


def test_label_selectors_as_ray_reads_them() -> None:
    labels = {"argus.io/pool": "h100", "zone": "a"}
    assert matches(labels, {"argus.io/pool": "h100"}) and not matches(labels, {"argus.io/pool": "a100"})
    assert matches(labels, {"zone": "in(a, b)"}) and not matches(labels, {"zone": "!in(a,b)"})
    assert matches(labels, {"gpu": "!a10"}) and not matches(labels, {"gpu": "a10"})  # a missing label
    assert not matches(labels, {"zone": "!a"})


def test_free_per_node_for_what_is_asked_then_gpus_and_cpus() -> None:
    nodes = [NodeFree("10.0.0.1", total={"CPU": 8}, free={"CPU": 2}),
             *(NodeFree(f"10.0.0.{i}", total={"GPU": 8, "CPU": 32}, free={"GPU": g, "CPU": 16})
               for i, g in ((2, 8), (3, 4), (4, 8)))]
    assert free_text({"GPU": 16}, nodes) == (
        "largest free on one node: 8 GPU; 3 alive nodes with GPU: 8/8/4 free; "
        "largest free on one node: 16 CPU; 4 alive nodes with CPU: 16/16/16/2 free")
    assert free_text({"no_such_thing": 1}, nodes[:1]).startswith("no alive node has no_such_thing; largest free")
    assert free_text({"GPU": 1}, [NodeFree("10.0.0.2", total={"GPU": 8})]) == (
        "free resources unknown (Ray's autoscaler report was not available)")


def test_a_selector_narrows_the_nodes_and_says_how_many_match() -> None:
    nodes = [NodeFree("a", labels={"argus.io/pool": "h100"}, total={"GPU": 8}, free={"GPU": 0}),
             NodeFree("b", total={"GPU": 8}, free={"GPU": 8})]
    assert free_text({"GPU": 8}, nodes, {"argus.io/pool": "h100"}, also=()) == (
        "1 of 2 alive nodes match labels argus.io/pool=h100; largest free on one node: 0 GPU; "
        "1 alive node with GPU: 0 free")
    assert free_text({"GPU": 8}, nodes, {"argus.io/pool": "a100"}, also=()) == (
        "0 of 2 alive nodes match labels argus.io/pool=a100; no alive node matching them has GPU")


def test_a_long_node_list_is_cut() -> None:
    nodes = [NodeFree(f"n{i}", total={"GPU": 8}, free={"GPU": float(i % 9)}) for i in range(20)]
    text = free_text({"GPU": 8}, nodes, also=())
    assert text.startswith("largest free on one node: 8 GPU; 20 alive nodes with GPU: 8/8/7/7/")
    assert text.endswith("/… (8 more) free")
