"""The control plane through HTTP on the session's real Ray cluster and a real sshd: a job submitted over
the API runs on a worker, writes its folder, is stopped, and its old checkpoints are cleaned; a node
registered over the API joins Ray through SSH, is drained, undrained (joined again), drained and taken
offline. Every step goes through the role checks and lands in the audit log."""

from __future__ import annotations

import sys
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
from control.node_manager import NODE_LABEL, NodeManager
from stage.localstack.ray_cluster import RayCluster
from stage.localstack.sshd import Sshd
from tests.helpers import wait_until
from tests.node_helpers import NODE_IP, node_data, processes_with, ray_temp_dir

temp_dir = ray_temp_dir

TRAIN = """
import os, pathlib, time, trainer_version
ckpt = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints"
for step in (10, 20, 30, 40):
    (ckpt / f"global_step_{step}").mkdir()
    (ckpt / f"global_step_{step}" / "model.pt").write_bytes(b"w" * step)
(ckpt / "latest_checkpointed_iteration.txt").write_text("40")
print("VERSION=" + trainer_version.VERSION, flush=True)
print("HOLDING", flush=True)
time.sleep(600)
"""


class Api:
    def __init__(self, store: Store, control: ControlPlane) -> None:
        self.app = create_app(store=store, control=control)
        self.tokens = {r: store.create_token(f"t-{r.value}", r, created_by="tests")[1] for r in Role}

    def as_(self, role: Role) -> TestClient:
        return TestClient(self.app, headers={"Authorization": f"Bearer {self.tokens[role]}"},
                          raise_server_exceptions=False)


@pytest.fixture
def plane(ray_cluster: RayCluster, sshd: Sshd, tmp_path: Path) -> Iterator[tuple[Api, ControlPlane, Store]]:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    shared = tmp_path / "shared"
    shared.mkdir()
    jobs = JobController(ray_cluster.dashboard_url, shared, code_roots=[shared])
    registry = store.nodes()
    manager = NodeManager(registry, gcs_address=ray_cluster.gcs_address, dashboard_url=ray_cluster.dashboard_url,
                          join_timeout_s=120, offline_timeout_s=60)
    control = ControlPlane(jobs=jobs, registry=registry, queue=job_queue(store.job_queue, jobs, registry),
                           manager=manager, ssh_key_dirs=(sshd.client_key.parent,))
    api = Api(store, control)
    yield api, control, store
    for record in jobs.list():  # leave the session cluster as we found it
        if not record.ended:
            jobs.stop(record.submission_id, reason="test teardown")
            wait_until(f"job {record.submission_id} to end", lambda r=record: jobs.get(r.submission_id).ended, 120)
    store.close()


def job_status(client: TestClient, sid: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{sid}")
    assert response.status_code == 200, response.text
    return response.json()["job"]


def test_a_job_over_http_runs_on_a_worker_is_stopped_and_cleaned(plane, ray_cluster: RayCluster) -> None:
    api, control, store = plane
    code = control.jobs.shared_root / "common" / "code" / "v7"
    code.mkdir(parents=True)
    (code / "trainer_version.py").write_text("VERSION = 'v7'\n")
    (code / "train.py").write_text(TRAIN)
    operator, viewer = api.as_(Role.OPERATOR), api.as_(Role.VIEWER)

    spec = {"name": "grpo-small", "workload": "grpo", "entrypoint": f"{sys.executable} train.py", "owner": "alice",
            "code_path": str(code), "working_dir": str(code), "nnodes": 1, "timeout_s": 3600}
    assert viewer.post("/v1/jobs", json=spec).status_code == 403
    created = operator.post("/v1/jobs", json=spec)
    assert created.status_code == 201, created.text
    sid = created.json()["job"]["submission_id"]
    job_dir = Path(created.json()["job"]["job_dir"])
    assert job_dir == control.jobs.jobs_root / sid and (job_dir / "config" / "jobspec.yaml").is_file()

    log = wait_until("the job to print HOLDING", lambda: (r := viewer.get(f"/v1/jobs/{sid}/logs")).status_code == 200
                     and "HOLDING" in r.text and r.text, timeout=120)
    assert "VERSION=v7" in log
    running = job_status(viewer, sid)
    assert running["status"] == "RUNNING" and running["owner"] == "alice" and running["workload"] == "grpo"
    assert running["driver_node_id"] in {w.node_id for w in ray_cluster.workers}
    assert viewer.get(f"/v1/jobs/{sid}/logs", params={"tail": 1}).text.strip() == "HOLDING"
    assert sid in [j["submission_id"] for j in viewer.get("/v1/jobs").json()["items"]]

    busy = operator.post("/v1/ops/cleanup_job_artifacts", json={"submission_id": sid, "keep_last": 1})
    assert busy.status_code == 409 and "RUNNING" in busy.json()["message"]
    assert len(list((job_dir / "checkpoints").glob("global_step_*"))) == 4

    stopped = operator.post(f"/v1/jobs/{sid}/stop", json={"reason": "freeing GPUs for the eval"})
    assert stopped.status_code == 200 and stopped.json()["job"]["mark"] == "stopped"
    wait_until("the job to be STOPPED", lambda: job_status(viewer, sid)["status"] == "STOPPED", timeout=120)

    dry = operator.post("/v1/ops/cleanup_job_artifacts", json={"submission_id": sid, "keep_last": 2, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert [c["name"] for c in dry.json()["cleanup"]["removed"]] == ["global_step_20", "global_step_10"]
    assert len(list((job_dir / "checkpoints").glob("global_step_*"))) == 4
    done = operator.post("/v1/ops/cleanup_job_artifacts", json={"submission_id": sid, "keep_last": 2}).json()
    assert done["cleanup"]["done"] and done["cleanup"]["freed_bytes"] == 30
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == [
        "global_step_30", "global_step_40", "latest_checkpointed_iteration.txt"]

    audited = [(r.actor, r.path, r.status) for r in reversed(store.list_audit(limit=20))]
    assert audited == [
        ("t-viewer", "/v1/jobs", 403),
        ("t-operator", "/v1/jobs", 201),
        ("t-operator", "/v1/ops/cleanup_job_artifacts", 409),
        ("t-operator", f"/v1/jobs/{sid}/stop", 200),
        ("t-operator", "/v1/ops/cleanup_job_artifacts", 200),
        ("t-operator", "/v1/ops/cleanup_job_artifacts", 200),
    ]


def test_a_node_over_http_joins_drains_undrains_and_goes_offline(
    plane, ray_cluster: RayCluster, sshd: Sshd, temp_dir: str
) -> None:
    api, control, _ = plane
    admin, operator, viewer = api.as_(Role.ADMIN), api.as_(Role.OPERATOR), api.as_(Role.VIEWER)
    body = node_data(sshd, temp_dir, name="loop-http")
    assert operator.post("/v1/nodes", json=body).status_code == 403  # registering is for admins
    assert admin.post("/v1/nodes", json=body).status_code == 201

    joined = operator.post("/v1/nodes/loop-http/join", json={"reason": "new node"})
    assert joined.status_code == 200, joined.text
    first_id = joined.json()["ray_node_id"]
    ray_node = ray_cluster.node_state(first_id)
    assert ray_node["state"] == "ALIVE" and ray_node["node_ip"] == NODE_IP
    assert ray_node["labels"][NODE_LABEL] == "loop-http"

    drained = operator.post("/v1/nodes/loop-http/drain", json={"reason": "xid 79 on gpu 3"})
    assert drained.status_code == 200 and drained.json()["state"] == "draining", drained.text
    wait_until("Ray to end the drained idle node", lambda: ray_cluster.node_state(first_id)["state"] == "DEAD", 60)

    undrained = operator.post("/v1/nodes/loop-http/undrain", json={"reason": "gpu 3 replaced"})
    assert undrained.status_code == 200, undrained.text
    second_id = undrained.json()["ray_node_id"]
    assert second_id != first_id and ray_cluster.node_state(second_id)["state"] == "ALIVE"
    assert viewer.get("/v1/nodes/loop-http").json()["node"]["state"] == "online"

    assert operator.post("/v1/nodes/loop-http/drain", json={"reason": "retire"}).status_code == 200
    off = operator.post("/v1/nodes/loop-http/offline", json={"reason": "retire"})
    assert off.status_code == 200 and off.json()["state"] == "offline", off.text
    assert processes_with(temp_dir) == []
    assert operator.post("/v1/nodes/loop-http/drain", json={"reason": "late"}).status_code == 409

    history = viewer.get("/v1/nodes/loop-http").json()["transitions"]
    assert [(t["from"], t["to"], t["actor"]) for t in history] == [
        (None, "pending", "t-admin"),
        ("pending", "online", "t-operator"),
        ("online", "draining", "t-operator"),
        ("draining", "online", "t-operator"),
        ("online", "draining", "t-operator"),
        ("draining", "offline", "t-operator"),
    ]
    alive = {n["node_ip"] for n in ray_cluster.list_nodes() if n["state"] == "ALIVE"}
    assert {w.ip for w in ray_cluster.workers} <= alive
