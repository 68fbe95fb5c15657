"""The job queue on a real Ray cluster of its own (a head and two workers advertising 4 GPUs each), through the API
with user tokens: two users submit three jobs, the third does not fit, waits with its reason and starts by itself
when the first ends; a gang that can never fit in the cluster expires in the queue with its reason; a user neither
sees nor stops another user's job.

Each job's driver reserves its gang as a placement group of `nnodes` bundles of {GPU: gpus_per_node} (STRICT_SPREAD,
as a trainer's worker group does), says HOLDING once Ray placed it, and ends when a file appears in its job folder.
The queue's chore is ticked by the test, as the daemon would every job_queue_interval_s.

A cluster of its own: the session cluster's GPUs may be held by other tests' jobs, and this test needs to know what
is free.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.control_plane import ControlPlane, job_queue
from argus.store.store import Store
from argus.store.tokens import Role
from control.jobs import JobController
from control.queue import QueueState
from stage.localstack.ray_cluster import RayCluster
from tests.helpers import own_ray_cluster, wait_until

pytestmark = pytest.mark.ray

HOLD = textwrap.dedent("""
    import os, pathlib, time
    import ray
    from ray.util.placement_group import placement_group

    ray.init()
    n, g = int(os.environ["ARGUS_NNODES"]), int(os.environ["ARGUS_GPUS_PER_NODE"])
    group = placement_group([{"GPU": g}] * n, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=120)
    print("HOLDING", flush=True)
    release = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "release"
    deadline = time.time() + 600
    while not release.exists() and time.time() < deadline:
        time.sleep(0.5)
    print("RELEASED", flush=True)
""")


@pytest.fixture
def own_ray(tmp_path: Path) -> Iterator[RayCluster]:
    with own_ray_cluster(tmp_path / "ray", "127.0.0.12", ("127.0.0.13", "127.0.0.14"), worker_gpus=4) as cluster:
        yield cluster


class Site:
    def __init__(self, cluster: RayCluster, tmp_path: Path) -> None:
        self.store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
        self.shared = tmp_path / "shared"
        self.jobs = JobController(cluster.dashboard_url, self.shared, code_roots=[self.shared])
        registry = self.store.nodes()
        self.queue = job_queue(self.store.job_queue, self.jobs, registry)
        control = ControlPlane(jobs=self.jobs, registry=registry, queue=self.queue, manager=None, ssh_key_dirs=())
        self.app = create_app(store=self.store, control=control)
        self.tokens = {name: self.store.create_token(name, Role.USER, created_by="tests")[1]
                       for name in ("alice", "bob")}
        self.tokens["ops"] = self.store.create_token("ops", Role.OPERATOR, created_by="tests")[1]
        for user in ("alice", "bob"):
            code = self.jobs.user_dir(user) / "code"
            (code / "hold.py").write_text(HOLD)

    def as_(self, who: str) -> TestClient:
        return TestClient(self.app, headers={"Authorization": f"Bearer {self.tokens[who]}"},
                          raise_server_exceptions=False)

    def submit(self, who: str, name: str, **over: Any) -> Any:
        code = self.shared / "users" / who / "code"
        spec = {"name": name, "owner": who, "entrypoint": f"{sys.executable} hold.py", "code_path": str(code),
                "working_dir": str(code), "nnodes": 1, "gpus_per_node": 4, **over}
        return self.as_(who).post("/v1/jobs", json=spec)

    def holding(self, sid: str) -> bool:
        self.queue.tick()
        try:
            return "HOLDING" in self.jobs.tail(sid, 50)
        except Exception:  # noqa: BLE001 - not started, or its log not there yet
            return False

    def release(self, sid: str) -> None:
        folder = self.jobs.job_dir(sid)
        if folder.exists():
            (folder / "release").write_text("done\n")


def test_two_users_three_jobs_the_third_waits_and_starts_when_the_first_ends(own_ray: RayCluster,
                                                                             tmp_path: Path) -> None:
    site = Site(own_ray, tmp_path)
    started: list[str] = []
    try:
        first = site.submit("alice", "first")
        assert first.status_code == 201, first.text
        a = first.json()["job"]["submission_id"]
        started.append(a)
        second = site.submit("bob", "second")
        assert second.status_code == 201, second.text
        b = second.json()["job"]["submission_id"]
        started.append(b)
        third = site.submit("alice", "third")
        assert third.status_code == 202, third.text
        c = third.json()["job"]["submission_id"]
        started.append(c)
        assert third.json()["job"]["queue"]["reason"].startswith(
            "waiting for 1 node × 4 GPUs on any node: no node has 4 free")
        wait_until("both first jobs to hold their GPUs", lambda: site.holding(a) and site.holding(b), 180)
        site.queue.tick()
        assert site.queue.get(c).state is QueueState.QUEUED  # Ray now shows the GPUs used, and still nothing fits

        # users see their own jobs only; another's is not found, and cannot be stopped
        alice, bob = site.as_("alice"), site.as_("bob")
        assert {j["submission_id"] for j in alice.get("/v1/jobs").json()["items"]} == {a, c}
        assert {j["submission_id"] for j in bob.get("/v1/jobs").json()["items"]} == {b}
        assert bob.get(f"/v1/jobs/{a}").status_code == 404 and bob.get(f"/v1/jobs/{c}").status_code == 404
        assert bob.post(f"/v1/jobs/{a}/stop", json={"reason": "mine now"}).status_code == 404
        assert bob.post(f"/v1/jobs/{c}/stop", json={"reason": "mine now"}).status_code == 404
        assert bob.get(f"/v1/jobs/{a}/logs").status_code == 404
        assert site.submit("bob", "as-alice", owner="alice").status_code == 403
        assert {j["submission_id"] for j in site.as_("ops").get("/v1/jobs").json()["items"]} == {a, b, c}
        queue_view = alice.get("/v1/jobs/queue").json()["items"]
        assert [(j["submission_id"], j["state"]) for j in queue_view] == [(a, "running"), (c, "queued")]

        site.release(a)
        wait_until("the third job to start and hold its GPUs", lambda: site.holding(c), 180)
        entry = site.queue.get(c)
        assert entry.state is QueueState.STARTED and entry.waited_s is not None and entry.waited_s > 0
        assert site.queue.get(a).state is QueueState.FINISHED and site.queue.get(a).ray_status == "SUCCEEDED"
        view = {j["submission_id"]: j for j in alice.get("/v1/jobs/queue").json()["items"]}
        assert view[a]["state"] == "finished" and view[c]["state"] == "running"
        assert view[c]["queue"]["waited_s"] == entry.waited_s

        # a gang no cluster of this size can hold waits, says why, and expires after its queue timeout
        huge = site.submit("bob", "huge", nnodes=3, queue_timeout_s=3)
        assert huge.status_code == 202, huge.text
        d = huge.json()["job"]["submission_id"]
        assert "the cluster has only 2 nodes with 4 GPUs in all" in huge.json()["job"]["queue"]["reason"]
        wait_until("the huge gang to expire", lambda: site.queue.tick() is not None
                   and site.queue.get(d).state is QueueState.EXPIRED, 30)
        expired = bob.get(f"/v1/jobs/{d}").json()["job"]
        assert expired["state"] == "expired" and expired["queue"]["reason"].startswith(
            "not started within its queue timeout of 3 s: waiting for 3 nodes × 4 GPUs on any node")
        assert not site.jobs.folder(d).exists()
    finally:
        for sid in started:
            site.release(sid)
        for sid in started:
            wait_until(f"job {sid} to end", lambda s=sid: site.queue.tick() is not None
                       and site.queue.get(s).state is not QueueState.STARTED, 120)
        site.store.close()
