"""Remediation through the job queue on a real Ray cluster without spare capacity: a gang job holds both workers
(2 nodes × 4 GPUs), one worker's raylet is killed, Argus detects the lost node and its policy resubmits the job
from its checkpoint; the resubmission does not fit (one node has 4 free), so it waits in the queue with that
reason and starts by itself when a replacement node joins, resuming from the checkpoint. Its folder's resubmit
marker says how long it waited.

A cluster of its own (head and two workers advertising 4 GPUs each): the test needs every GPU accounted for.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.ray_capacity import RayCapacity
from collectors.ray_state import RayStateCollector
from control.jobs import JobController
from control.jobspec import JobSpec
from control.local import LocalRunner
from control.queue import JobQueue, QueueState
from core.types import ActionState, Category
from detectors.lost_node import LostNodeDetector
from remediation.actions import Context
from remediation.policy import Mode, load_policy
from remediation.runner import Remediator
from stage.localstack.ray_cluster import RayCluster
from tests.helpers import own_ray_cluster, wait_until

pytestmark = pytest.mark.ray

GANG_TRAINER = textwrap.dedent("""
    import os, pathlib, time, ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init()
    n, g = int(os.environ["ARGUS_NNODES"]), int(os.environ["ARGUS_GPUS_PER_NODE"])
    ckpt = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints"
    print("RESUME_FROM=" + os.environ.get("ARGUS_RESUME_FROM", "none"), flush=True)
    group = placement_group([{"GPU": g}] * n, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=300)

    @ray.remote(num_cpus=0, num_gpus=g, max_restarts=0)
    class Rank:
        def where(self):
            return ray.get_runtime_context().get_node_id()
        def step(self, i):
            time.sleep(0.2)
            return i

    ranks = [Rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote() for i in range(n)]
    print("RANK_NODES=" + ",".join(ray.get([r.where.remote() for r in ranks])), flush=True)
    for i in range(1, 100000):
        try:
            ray.get([r.step.remote(i) for r in ranks])
        except ray.exceptions.RayActorError:
            print("RANK_LOST: waiting for the job to be stopped", flush=True)
            time.sleep(3600)
        print(f"step:{i} - loss:0.1", flush=True)
        if i % 5 == 0:
            (ckpt / f"global_step_{i}").mkdir(parents=True, exist_ok=True)
""")


@pytest.fixture
def own_ray(tmp_path: Path) -> Iterator[RayCluster]:
    with own_ray_cluster(tmp_path / "ray", "127.0.0.15", ("127.0.0.16", "127.0.0.17"), worker_gpus=4) as cluster:
        yield cluster


def log_value(jobs: JobController, sid: str, key: str, timeout: float = 180) -> str:
    def found() -> str | None:
        try:
            log = jobs.logs(sid)
        except Exception:  # noqa: BLE001 - no driver yet
            return None
        line = next((x for x in log.splitlines() if x.startswith(key + "=")), None)
        return line.split("=", 1)[1] if line else None

    return wait_until(f"job {sid} to print {key}", found, timeout=timeout)


def test_a_lost_node_resubmission_waits_in_the_queue_and_starts_when_a_node_joins(own_ray: RayCluster,
                                                                                tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    shared = tmp_path / "shared"
    code = shared / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(GANG_TRAINER)
    jobs = JobController(own_ray.dashboard_url, shared, code_roots=[shared])
    queue = JobQueue(store.job_queue, jobs, RayCapacity(own_ray.dashboard_url).read, registry=store.nodes())
    policy = load_policy(mode=Mode.AUTO)
    guards = policy.guards.model_copy(update={"min_drain_interval_s": 0, "max_drained_share": 1.0,
                                              "resubmit_backoff_s": 0})
    ctx = Context(jobs=jobs, registry=store.nodes(), nodes=None, dashboard_url=own_ray.dashboard_url,
                  gcs_address=own_ray.gcs_address, local=LocalRunner(), store=store, queue=queue, stop_wait_s=60)
    remediator = Remediator(store, policy.model_copy(update={"guards": guards}), ctx)
    pipeline = Pipeline(collectors=[RayStateCollector(own_ray.dashboard_url, timeout_s=10)],
                        detectors=[LostNodeDetector(lookback_s=30)], incidents=IncidentDesk(store))
    try:
        spec = JobSpec(name="gang", workload="grpo", entrypoint=f"{sys.executable} train.py", owner="alice",
                       code_path=str(code), working_dir=str(code), nnodes=2, gpus_per_node=4)
        entry = queue.submit(spec)
        assert entry.state is QueueState.STARTED
        sid = entry.submission_id
        rank_nodes = log_value(jobs, sid, "RANK_NODES").split(",")
        wait_until("a checkpoint", lambda: list((shared / "jobs" / sid / "checkpoints").glob("global_step_*")), 60)
        pipeline.run_once()  # Argus sees both nodes ALIVE with the job's ranks on them
        driver = jobs.get(sid).driver_node_id
        victim = next(w for w in own_ray.workers if w.node_id in rank_nodes and w.node_id != driver)
        own_ray.kill_worker(victim.index)

        def opened() -> list[Any]:
            return [i for i in pipeline.run_once().opened if i.category is Category.NODE_LOST]

        [incident] = wait_until("a node_lost incident", opened, timeout=90, interval=0.3)
        remediator.plan(incident)

        def settled() -> list[Any] | None:
            remediator.run_pending()
            actions = store.list_actions(incident.id)
            return actions if actions and all(a.state not in (ActionState.APPROVED, ActionState.RUNNING)
                                              for a in actions) else None

        actions = wait_until("the plan to finish", settled, timeout=180, interval=0.5)
        resubmit = next(a for a in actions if a.kind == "resubmit_job")
        assert resubmit.state is ActionState.SUCCEEDED, resubmit.result
        [mine] = [j for j in resubmit.result["jobs"] if j["job"] == sid]
        new_sid = mine["new"]
        assert mine["state"] == "queued", mine
        assert mine["queue"]["reason"].startswith("waiting for 2 nodes × 4 GPUs on any node: ")
        assert "it waits in the queue" in resubmit.result["message"]
        # once Ray has released the stopped job's GPUs, the reason says what is free
        wait_until("the reason to name the free node", lambda: queue.tick() is not None and queue.get(
            new_sid).reason.startswith("waiting for 2 nodes × 4 GPUs on any node: 1 node has 4 free"), 60)
        assert queue.get(new_sid).state is QueueState.QUEUED and not jobs.folder(new_sid).exists()

        own_ray.restart_worker(victim.index)  # a replacement node joins
        wait_until("the resubmission to start", lambda: queue.tick() is not None
                   and queue.get(new_sid).state is QueueState.STARTED, 120)
        resumed = log_value(jobs, new_sid, "RESUME_FROM")
        assert "/checkpoints/global_step_" in resumed and sid in resumed
        log_value(jobs, new_sid, "RANK_NODES")
        started = queue.get(new_sid)
        marker = json.loads(jobs.folder(new_sid).resubmit_file.read_text())
        assert marker["of"] == sid and marker["attempt"] == 1 and marker["queued_s"] == pytest.approx(
            started.waited_s, abs=0.01)
        print(f"\nresubmission waited {started.waited_s:.1f} s in the queue for a replacement node")
    finally:
        for record in jobs.list():
            if not record.ended:
                jobs.stop(record.submission_id, reason="test teardown")
        store.close()
