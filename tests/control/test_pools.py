"""A pool means one thing on both sides: the labels and resources join gives a node are what a job naming its
pool asks Ray for, spelt as the installed Ray accepts them. (The run on a real cluster: test_pools_real.py.)"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from ray._private.label_utils import validate_label_selector, validate_node_label_syntax
from ray.job_submission import JobSubmissionClient

from control import commands
from control.jobs import JobController
from control.jobspec import JobSpec
from control.node_manager import node_labels, node_resources
from control.nodes import NodeSpec
from core.errors import ArgusError, InputError
from core.ray_labels import POOL_LABEL

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def node(pool: str | None, **over: object) -> NodeSpec:
    return NodeSpec.parse({"name": "gpu-07", "host": "10.0.0.7", "ssh_key_path": "/keys/id", "host_key": HOST_KEY,
                           "pool": pool, "labels": {"argus.io/zone": "a"}, "gpus": 8, **over})


def job(**fields: object) -> JobSpec:
    return JobSpec.from_dict({"name": "grpo", "workload": "grpo", "entrypoint": "python -m verl.trainer.main_ppo",
                              "owner": "alice", **fields})


def submit_call(spec: JobSpec, tmp_path: Path) -> dict[str, object]:
    jobs = JobController("http://127.0.0.1:1", tmp_path)  # submit_call only builds the call: no Ray is asked
    return jobs.submit_call(spec, "grpo-1", tmp_path / "jobs" / "grpo-1")


def lands_on(call: dict[str, object], spec: NodeSpec) -> bool:
    """Whether Ray may put the driver of `call` on a node joined from `spec`: every label the call selects is on
    the node, and every custom resource it asks for is one the node has (Ray ANDs the two)."""
    labels, resources = node_labels(spec), node_resources(spec)
    selector = call.get("entrypoint_label_selector") or {}
    wanted = call.get("entrypoint_resources") or {}
    assert isinstance(selector, dict) and isinstance(wanted, dict)
    return (all(labels.get(k) == v for k, v in selector.items())
            and all(resources.get(k, 0) >= amount for k, amount in wanted.items()))


def test_a_job_naming_a_pool_lands_on_the_nodes_joined_into_it_and_on_no_other(tmp_path: Path) -> None:
    call = submit_call(job(pool="h100"), tmp_path)
    assert call["entrypoint_label_selector"] == {POOL_LABEL: "h100"}
    assert lands_on(call, node("h100"))
    assert not lands_on(call, node("a100"))
    assert not lands_on(call, node(None))
    # a job naming no pool may land on any joined node
    assert lands_on(submit_call(job(), tmp_path), node(None))
    assert lands_on(submit_call(job(), tmp_path), node("a100"))


def test_the_pool_label_reaches_ray_start_and_the_submit_call_as_the_installed_ray_accepts_them(
    tmp_path: Path,
) -> None:
    spec = node("h100", labels={"argus.io/zone": "a", POOL_LABEL: "other", "argus.io/node": "other"})
    labels = node_labels(spec)
    # the spec's own labels cannot move the node into another pool or rename it
    assert labels[POOL_LABEL] == "h100" and labels["argus.io/node"] == "gpu-07" and labels["argus.io/zone"] == "a"
    argv = commands.ray_start_for(spec, "10.0.0.1:6379", node_resources(spec), labels)
    assert f"--labels=argus.io/node=gpu-07,{POOL_LABEL}=h100,argus.io/zone=a" in argv
    validate_node_label_syntax(labels)  # raises on a key or value `ray start --labels` would refuse

    call = submit_call(job(pool="h100", labels={"example.com/tier": "gold"}), tmp_path)
    assert validate_label_selector(call["entrypoint_label_selector"]) is None  # type: ignore[arg-type]
    # every keyword of the call is one the installed Jobs SDK takes
    inspect.signature(JobSubmissionClient.submit_job).bind(None, **call)


@pytest.mark.parametrize("labels", [{"pool": "h100"}, {POOL_LABEL: "h100"}])
def test_a_pool_given_as_a_label_is_the_pool(labels: dict[str, str], tmp_path: Path) -> None:
    # `labels: {pool: h100}` is how the docs spelt a pool before nodes and jobs shared one key: old specs (and
    # the snapshots a resubmission loads) still land in the pool
    spec = job(labels={**labels, "zone": "rack-3"})
    assert spec.pool_name == "h100"
    assert spec.label_selector == {"zone": "rack-3", POOL_LABEL: "h100"}
    assert lands_on(submit_call(spec, tmp_path), node("h100", labels={"zone": "rack-3"}))
    assert not lands_on(submit_call(spec, tmp_path), node("a100", labels={"zone": "rack-3"}))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"pool": "a", "labels": {"pool": "b"}}, r"names two pools \(pool='a', labels.pool='b'\)"),
        ({"pool": "a", "labels": {POOL_LABEL: "b"}}, "names two pools"),
        ({"labels": {"pool": "a", POOL_LABEL: "b"}}, "names two pools"),
        # the same pool in two places is one place too many (the schema says one of the three)
        ({"pool": "a", "labels": {POOL_LABEL: "a"}}, r"names the pool twice \(pool='a', labels.argus.io/pool='a'\)"),
        ({"labels": {"pool": "a", POOL_LABEL: "a"}}, "names the pool twice"),
        # no node can be joined into these: node pools are lowercase names
        ({"pool": "H100"}, "field 'pool'.*lowercase"),
        ({"pool": "gpu_big"}, "field 'pool'.*lowercase"),
        ({"labels": {"pool": "H100"}}, "labels.pool='H100' is not a pool name"),
    ],
)
def test_a_pool_no_node_can_be_in_is_refused(fields: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        job(**fields)


def test_a_jobs_own_resources_are_asked_for_beside_the_controllers(tmp_path: Path) -> None:
    """A driver pinned with `resources` lands only on the node that has them, and still never on the head."""
    call = submit_call(job(resources={"gpu-07": 0.001}), tmp_path)
    assert call["entrypoint_resources"] == {"worker": 0.001, "gpu-07": 0.001}
    assert lands_on(call, node(None, resources={"gpu-07": 1}))
    assert not lands_on(call, node(None))


class BusyThenReady:
    """A Jobs SDK client whose head has no agent to take a submission for its first `busy` calls (Ray's 500)."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.calls = 0

    def submit_job(self, **call: object) -> str:
        self.calls += 1
        if self.calls <= self.busy:
            raise RuntimeError("Request failed with status code 500: No available agent to submit job, please try "
                               "again later..")
        return str(call["submission_id"])


def test_a_submission_ray_has_no_agent_for_yet_is_tried_again_then_its_answer_stands(tmp_path: Path) -> None:
    pauses: list[float] = []
    ready = BusyThenReady(busy=2)
    jobs = JobController("http://127.0.0.1:1", tmp_path, client=ready, sleep=pauses.append)
    record = jobs.submit(job(submission_id="late-node-1"))
    assert record.submission_id == "late-node-1" and ready.calls == 3 and pauses == [1.0, 2.0]
    never = BusyThenReady(busy=100)
    jobs = JobController("http://127.0.0.1:1", tmp_path, client=never, sleep=pauses.append)
    with pytest.raises(ArgusError, match="No available agent"):
        jobs.submit(job(submission_id="late-node-2"))
    assert never.calls == 5 and not (tmp_path / "jobs" / "late-node-2").exists()  # its folder is not left behind
