"""The node manager against a real sshd on loopback and the session's real Ray cluster.

sshd runs commands as the current user on this machine, so "the node" is this host reached over SSH: a
Ray worker started through it advertises 127.0.0.5 and lives in its own short temp dir, which is how
offline (and this test's cleanup) find its processes without touching any other Ray process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from control.node_manager import NODE_LABEL, NodeManager
from control.nodes import MemoryNodeRegistry, NodeState
from control.ssh import HostKeyRejected, SshRunner
from core.errors import InputError
from stage.localstack.ray_cluster import RayCluster
from stage.localstack.sshd import Sshd
from tests.node_helpers import NODE_IP, node_spec, processes_with, ray_temp_dir

temp_dir = ray_temp_dir  # this module's tests call the fixture temp_dir


def manager(ray_cluster: RayCluster, registry: MemoryNodeRegistry) -> NodeManager:
    return NodeManager(registry, gcs_address=ray_cluster.gcs_address, dashboard_url=ray_cluster.dashboard_url,
                       join_timeout_s=120, offline_timeout_s=60)


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)


def test_a_node_joins_over_ssh_is_drained_and_taken_offline(
    sshd: Sshd, ray_cluster: RayCluster, temp_dir: str
) -> None:
    registry = MemoryNodeRegistry()
    nodes = manager(ray_cluster, registry)
    spec = node_spec(sshd, temp_dir)

    assert nodes.register(spec, actor="alice").state is NodeState.PENDING
    with pytest.raises(InputError, match="cannot go from pending to draining"):
        nodes.drain(spec.name, actor="alice", reason="too early")

    joined = nodes.join(spec.name, actor="alice", reason="new node")
    assert joined.ok, f"{joined.message} ({joined.hint})"
    assert joined.state is NodeState.ONLINE
    ray_node = ray_cluster.node_state(joined.ray_node_id)
    assert ray_node is not None and ray_node["state"] == "ALIVE" and ray_node["node_ip"] == NODE_IP
    assert ray_node["labels"][NODE_LABEL] == spec.name and ray_node["labels"]["argus.io/pool"] == "test"
    assert ray_node["resources_total"].get("worker") == 1
    started = processes_with(temp_dir)
    assert started, "the worker started over SSH has no process with its temp dir"
    tree = started + [c for p in started for c in p.children(recursive=True)]
    # started with the ray's bin first on PATH, so its dashboard agent finds py-spy for stack dumps
    assert started[0].environ()["PATH"].split(":")[0] == str(Path(spec.ray_bin).parent)

    probed = nodes.probe(spec.name, disk_path=temp_dir)
    assert probed.ok, probed.message
    assert probed.data["reachable"] is True
    assert probed.data["cpus"] >= 1 and probed.data["memory_total_bytes"] > 0
    assert probed.data["disk"]["total_bytes"] > 0 and probed.data["disk"]["mount"].startswith("/")
    assert probed.data["nvidia_smi"] in {"absent", "present"}
    assert probed.data["py_spy"] == str(Path(spec.ray_bin).parent / "py-spy")  # the venv's, beside its ray
    assert registry.get(spec.name).state is NodeState.ONLINE  # a probe changes nothing

    drained = nodes.drain(spec.name, actor="bob", reason="xid 79 on gpu 0")
    assert drained.ok, f"{drained.message} ({drained.hint})"
    assert drained.state is NodeState.DRAINING
    # Ray's drain: no new work lands there; an idle node's raylet exits at once, saying why.
    dead = wait_for(lambda: (n := ray_cluster.node_state(joined.ray_node_id)) and n["state"] == "DEAD" and n,
                    60, "the drained node to be DEAD in Ray")
    assert "preemption" in (dead["state_message"] or "") and "xid 79 on gpu 0" in dead["state_message"]

    with pytest.raises(InputError, match="cannot go from draining to pending"):
        nodes.reset(spec.name, actor="bob", reason="out of order")

    off = nodes.offline(spec.name, actor="bob", reason="retire")
    assert off.ok, f"{off.message} ({off.hint})"
    assert off.state is NodeState.OFFLINE
    assert ray_cluster.node_state(joined.ray_node_id)["state"] == "DEAD"
    assert processes_with(temp_dir) == []
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(InputError, match="cannot go from offline to draining"):
        nodes.drain(spec.name, actor="bob", reason="too late")

    log = registry.transitions(spec.name)
    assert [(t.from_state, t.to_state, t.actor) for t in log] == [
        (None, NodeState.PENDING, "alice"),
        (NodeState.PENDING, NodeState.ONLINE, "alice"),
        (NodeState.ONLINE, NodeState.DRAINING, "bob"),
        (NodeState.DRAINING, NodeState.OFFLINE, "bob"),
    ]
    # the session cluster is as it was: its own workers are still alive
    alive = {n["node_ip"] for n in ray_cluster.list_nodes() if n["state"] == "ALIVE"}
    assert {w.ip for w in ray_cluster.workers} <= alive


def test_a_changed_host_key_is_refused_and_the_join_fails_without_running_anything(
    sshd: Sshd, ray_cluster: RayCluster, temp_dir: str
) -> None:
    # any other valid key stands in for "the node was replaced, or someone is in the middle"
    other_key = " ".join(sshd.client_key.with_suffix(".pub").read_text().split()[:2])
    spec = node_spec(sshd, temp_dir, name="loop-mitm", host_key=other_key)

    with pytest.raises(HostKeyRejected) as err:
        SshRunner(spec, connect_timeout_s=15).run(["true"])
    assert f"127.0.0.1:{sshd.port}" in str(err.value) and "re-pin" in (err.value.hint or "")

    registry = MemoryNodeRegistry()
    nodes = manager(ray_cluster, registry)
    nodes.register(spec, actor="alice")
    probed = nodes.probe(spec.name)
    assert not probed.ok and probed.data == {"reachable": False} and "host key" in probed.message
    joined = nodes.join(spec.name, actor="alice")
    assert not joined.ok and joined.state is NodeState.FAILED and "host key" in joined.message
    assert processes_with(temp_dir) == []


def test_the_runner_passes_each_argument_verbatim_and_reports_exit_status(sshd: Sshd, temp_dir: str) -> None:
    runner = SshRunner(node_spec(sshd, temp_dir), connect_timeout_s=15, command_timeout_s=60)
    marker = Path(temp_dir) / "pwned"
    hostile = f"; touch {marker} $(touch {marker}) `touch {marker}` | & > {marker}\n'\""
    echoed, failed, plain = runner.run_all([["printf", "%s", hostile], ["sh", "-c", "exit 3"], ["true"]])
    assert echoed.ok and echoed.stdout == hostile
    assert not marker.exists()
    assert failed.exit_status == 3 and not failed.ok
    assert plain.ok and plain.duration_s >= 0
    cut = runner.run(["sleep", "30"], timeout_s=1)
    assert cut.timed_out and cut.exit_status is None


def test_a_draining_node_finishes_its_work_and_takes_no_new_job(
    sshd: Sshd, ray_cluster: RayCluster, temp_dir: str, tmp_path: Path
) -> None:
    """Out of rotation: a job of the node's pool that is submitted once the node drains waits (PENDING) instead of
    landing there, while the job already running on it goes on until it ends or the drain's deadline comes."""
    import sys

    from control.jobs import JobController
    from control.jobspec import JobSpec

    registry = MemoryNodeRegistry()
    nodes = manager(ray_cluster, registry)
    spec = node_spec(sshd, temp_dir, name="loop-rotation", pool="rotation")
    nodes.register(spec, actor="alice")
    joined = nodes.join(spec.name, actor="alice", reason="new node")
    assert joined.ok, f"{joined.message} ({joined.hint})"
    jobs = JobController(ray_cluster.dashboard_url, tmp_path, code_roots=[tmp_path])
    hold = f"{sys.executable} -c \"import time; print('holding', flush=True); time.sleep(300)\""
    running = jobs.submit(JobSpec(name="held", owner="alice", pool="rotation", entrypoint=hold))
    late = None
    try:
        wait_for(lambda: jobs.get(running.submission_id).status == "RUNNING", 120, "the pool's job to run")
        assert jobs.get(running.submission_id).driver_node_id == joined.ray_node_id

        drained = nodes.drain(spec.name, actor="bob", reason="rotation test", deadline_s=600)
        assert drained.ok and drained.state is NodeState.DRAINING, drained.message
        late = jobs.submit(JobSpec(name="late", owner="alice", pool="rotation", entrypoint=hold))
        time.sleep(15)  # long enough for Ray to place a driver on any node that would take it (it takes ~1 s)
        assert jobs.get(late.submission_id).status == "PENDING"  # the pool's only node is draining
        assert jobs.get(running.submission_id).status == "RUNNING"  # before its deadline, running work goes on
    finally:
        for job in (running, late):
            if job is not None:
                jobs.stop(job.submission_id, reason="test teardown")
        off = nodes.offline(spec.name, actor="bob", reason="retire")
        assert off.ok, off.message
