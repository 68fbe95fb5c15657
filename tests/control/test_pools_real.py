"""Pools on the real stack: a node joined over SSH into a pool runs the job that names the pool, and a job that
names a pool with no node in it is timed out by the chore while PENDING.

The node is this host reached over the test sshd (see tests/node_helpers.py); the session's own workers are in no
pool, so a driver that lands anywhere else than the joined node is a pool Ray did not honour.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.jobs import JobController, JobRecord
from control.jobspec import JobSpec
from control.node_manager import NodeManager
from control.nodes import MemoryNodeRegistry, NodeState
from core.ray_labels import POOL_LABEL
from stage.localstack.ray_cluster import RayCluster
from stage.localstack.sshd import Sshd
from tests.helpers import wait_until
from tests.node_helpers import node_spec, ray_temp_dir

temp_dir = ray_temp_dir  # this module's test calls the fixture temp_dir
PY = sys.executable
POOL = "loop-pool"


@pytest.fixture
def jobs(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[JobController, list[str]]]:
    controller = JobController(ray_cluster.dashboard_url, tmp_path / "shared")
    submitted: list[str] = []
    yield controller, submitted
    # leave the session cluster as we found it: nothing of ours running (a job still PENDING ends once stopped
    # and placed, or when its node is taken offline below)
    for sid in submitted:
        if not controller.get(sid).ended:
            controller.stop(sid, reason="test teardown")


def ended(jobs: JobController, sid: str, timeout: float = 180) -> JobRecord:
    def check() -> JobRecord | None:
        record = jobs.get(sid)
        return record if record.ended else None

    record = wait_until(f"job {sid} to end", check, timeout=timeout)
    assert record is not None
    return record


def test_a_node_joined_into_a_pool_runs_the_job_that_names_it(
    sshd: Sshd, ray_cluster: RayCluster, temp_dir: str, jobs: tuple[JobController, list[str]], tmp_path: Path
) -> None:
    controller, submitted = jobs
    registry = MemoryNodeRegistry()
    nodes = NodeManager(registry, gcs_address=ray_cluster.gcs_address, dashboard_url=ray_cluster.dashboard_url,
                        join_timeout_s=120, offline_timeout_s=60)
    spec = node_spec(sshd, temp_dir, name="loop-pool", pool=POOL)
    nodes.register(spec, actor="alice")
    try:
        # Before the pool has a node, a job naming it waits PENDING; the chore times it out like any other.
        sleeper = tmp_path / "sleeper.py"
        sleeper.write_text("import time\nprint('EARLY STARTED', flush=True)\ntime.sleep(600)\n")
        early = controller.submit(JobSpec(name="early", entrypoint=f"{PY} {sleeper}", owner="alice", pool=POOL,
                                          timeout_s=1))
        submitted.append(early.submission_id)
        assert early.job_dir is not None
        assert wait_until("the chore to time out the PENDING job", controller.enforce_timeouts,
                          timeout=60) == [early.submission_id]
        waiting = controller.get(early.submission_id)
        assert (waiting.status, waiting.mark) == ("PENDING", "timed_out")
        status = json.loads((early.job_dir / "config" / "status.json").read_text())
        assert status["job_status"] == "PENDING", status
        assert f"labels {POOL_LABEL}={POOL}" in status["reason"] and f"join a node into pool {POOL}" in status["reason"]
        assert controller.enforce_timeouts() == []  # asked once

        joined = nodes.join(spec.name, actor="alice", reason="a node for the pool")
        assert joined.ok and joined.ray_node_id, f"{joined.message} ({joined.hint})"
        ray_node = ray_cluster.node_state(joined.ray_node_id)
        assert ray_node is not None and ray_node["labels"][POOL_LABEL] == POOL

        entry = f"{PY} -c 'print(\"IN POOL\", flush=True)'"
        record = controller.submit(JobSpec(name="in-pool", entrypoint=entry, owner="alice", pool=POOL))
        sid = record.submission_id
        submitted.append(sid)
        assert record.job_dir is not None
        done = ended(controller, sid)
        assert done.status == "SUCCEEDED", controller.logs(sid)
        assert done.driver_node_id == joined.ray_node_id  # in the pool, not on the session's own workers
        assert "IN POOL" in controller.logs(sid)
        call = json.loads((record.job_dir / "config" / "submit.json").read_text())
        assert call["entrypoint_label_selector"] == {POOL_LABEL: POOL}

        # The timed-out job got a node too: Ray delivers the stop it was asked for instead of running it on.
        stopped = ended(controller, early.submission_id, timeout=120)
        assert (stopped.status, stopped.mark) == ("STOPPED", "timed_out"), controller.logs(early.submission_id)
    finally:
        if registry.get(spec.name).state is NodeState.ONLINE:
            off = nodes.offline(spec.name, actor="alice", reason="test done")
            assert off.ok, f"{off.message} ({off.hint})"
