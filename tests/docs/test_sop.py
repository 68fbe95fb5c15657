"""The procedures of docs/sop/ run as written: every `bash` block of each procedure, in order, in one shell, against
a real `argus serve` on the session's Ray cluster (with the test sshd for the node that joins), with the README's
settings pointing at it. The files a procedure reads (node.json, job.json) are written by the test for this cluster,
and each `json` example of the procedures is checked against Argus's own validation, so an example that no longer
parses fails here too. `sh` blocks are the values a reader fills in; the test gives them (JOB) itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from control.jobspec import JobSpec
from control.nodes import NodeSpec
from stage.localstack.argus_cli import argus_env, create_token, serving
from stage.localstack.ray_cluster import RayCluster
from stage.localstack.sshd import Sshd
from tests.helpers import wait_until
from tests.node_helpers import node_data, ray_temp_dir

SOP = Path(__file__).resolve().parents[2] / "docs" / "sop"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
temp_dir = ray_temp_dir

OOM_TRAINER = '''
import os, pathlib, sys
ckpt = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints"
(ckpt / "global_step_10").mkdir(parents=True, exist_ok=True)
print("step:10 - actor/loss:0.71", flush=True)
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "train.py", line 88, in forward', file=sys.stderr)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of "
      "79.11 GiB of which 1.02 GiB is free.", file=sys.stderr, flush=True)
sys.exit(1)
'''
TRAINER = '''
import os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints"
for step in (10, 20, 30):
    (ckpt / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
    (ckpt / f"global_step_{step}" / "model.pt").write_bytes(b"w" * 1000)
    print(f"step:{step} - actor/loss:0.5", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("trained", flush=True)
'''


def blocks(name: str, language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall((SOP / name).read_text()) if lang == language]


@dataclass
class Stage:
    url: str
    operator: str
    admin: str
    shared: Path
    code: Path

    def submit(self, name: str, entrypoint: str) -> str:
        spec = {"name": name, "owner": "alice", "entrypoint": entrypoint, "code_path": str(self.code),
                "working_dir": str(self.code)}
        answer = httpx.post(f"{self.url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {self.operator}"},
                            timeout=60)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["job"]["submission_id"])

    def run(self, name: str, folder: Path, **extra: str) -> str:
        """The procedure's bash blocks in one `bash -euo pipefail`; its output (the test fails on a failed step)."""
        steps = blocks(name, "bash")
        assert steps, f"{name} has no bash block"
        script = "\n".join(f"echo '::: step {n}'\n{body}" for n, body in enumerate(steps, start=1))
        env = {**os.environ, "ARGUS_URL": self.url, "ARGUS_TOKEN": self.operator, "ARGUS_ADMIN_TOKEN": self.admin,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=900)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{name} failed at its last step shown:\n{output[-6000:]}"
        return done.stdout


@pytest.fixture(scope="module")
def stage(ray_cluster: RayCluster, sshd: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("sop")
    shared, code = root / "shared", root / "shared" / "users" / "alice" / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAINER)
    (code / "oom.py").write_text(OOM_TRAINER)
    env = argus_env({"ARGUS_DATA_DIR": str(root / "data"), "ARGUS_SHARED_ROOT": str(shared),
                     "ARGUS_RAY_DASHBOARD_URL": ray_cluster.dashboard_url,
                     "ARGUS_RAY_GCS_ADDRESS": ray_cluster.gcs_address,
                     "ARGUS_NODE_SSH_KEY_DIRS": json.dumps([str(sshd.client_key.parent)]),
                     "ARGUS_REMEDIATION_MODE": "approval", "ARGUS_POLL_INTERVAL_S": "1"})
    operator, admin = create_token(env, "sop-operator", "operator"), create_token(env, "sop-admin", "admin")
    with serving(env, root / "argus-serve.log") as url:
        made = Stage(url, operator, admin, shared, code)
        try:
            yield made
        finally:
            _stop_jobs(made)


def _stop_jobs(stage: Stage) -> None:
    headers = {"Authorization": f"Bearer {stage.operator}"}
    try:
        for job in httpx.get(f"{stage.url}/v1/jobs", headers=headers, timeout=30).json()["items"]:
            if not job["ended"]:
                httpx.post(f"{stage.url}/v1/jobs/{job['submission_id']}/stop", json={"reason": "test teardown"},
                           headers=headers, timeout=30)
    except (httpx.HTTPError, KeyError, ValueError):
        pass


def test_the_examples_in_the_procedures_are_what_argus_accepts() -> None:
    checked = 0
    for page in sorted(SOP.glob("*.md")):
        for example in blocks(page.name, "json"):
            data: dict[str, Any] = json.loads(example)
            (NodeSpec if "host" in data else JobSpec).model_validate(data)
            checked += 1
    assert checked >= 2


@pytest.mark.ray
@pytest.mark.sshd
def test_a_node_comes_online_runs_a_job_and_goes_offline_as_the_procedure_says(
        stage: Stage, sshd: Sshd, temp_dir: str, tmp_path: Path) -> None:
    node = node_data(sshd, temp_dir, name="sop-node", pool="sop")
    (tmp_path / "node.json").write_text(json.dumps(node))
    (tmp_path / "job.json").write_text(json.dumps({
        "name": "sop-smoke", "workload": "sft", "owner": "alice", "pool": "sop",
        "entrypoint": f"{sys.executable} train.py", "code_path": str(stage.code), "working_dir": str(stage.code),
        "timeout_s": 600}))
    said = stage.run("node-lifecycle.md", tmp_path)
    assert '"state":"online"' in said and '"state":"offline"' in said
    assert re.search(r"is SUCCEEDED", said) and "trained" in said
    sid = re.search(r"submitted (\S+)", said)
    assert sid is not None
    headers = {"Authorization": f"Bearer {stage.operator}"}
    ran_on = httpx.get(f"{stage.url}/v1/jobs/{sid.group(1)}", headers=headers, timeout=30).json()["job"]
    joined = re.search(r'"ray_node_id":"([0-9a-f]+)"', said)  # what the join answered
    assert joined is not None and ran_on["driver_node_id"] == joined.group(1)  # the pool's job ran on the new node
    assert '"freed_bytes":2000' in said  # two of three checkpoints of 1000 bytes went
    checkpoints = sorted(p.name for p in (stage.shared / "jobs" / sid.group(1) / "checkpoints").iterdir())
    assert checkpoints == ["global_step_30"]


@pytest.mark.ray
def test_a_failed_job_is_triaged_as_the_procedure_says(stage: Stage, tmp_path: Path) -> None:
    sid = stage.submit("sop-oom", f"{sys.executable} oom.py")
    headers = {"Authorization": f"Bearer {stage.operator}"}
    wait_until("the job to fail", lambda: httpx.get(f"{stage.url}/v1/jobs/{sid}", headers=headers, timeout=30).json()[
        "job"]["status"] == "FAILED", timeout=120)  # someone triages a job that failed
    log = tmp_path / "driver.log"
    log.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    said = stage.run("triage.md", tmp_path, JOB=sid, ARGUS_LOG=str(log))
    assert "incident: inc-" in said and "gpu_oom" in said and "CUDA out of memory" in said
    assert '"state":"succeeded"' in said  # the scene was kept
    assert "no restart planned for this category" in said
    incident = re.search(r"incident: (inc-\S+)", said)
    assert incident is not None
    found = httpx.get(f"{stage.url}/v1/incidents/{incident.group(1)}", headers=headers, timeout=30).json()["incident"]
    assert found["state"] == "resolved" and found["category"] == "gpu_oom"


@pytest.mark.ray
def test_held_gpus_and_old_checkpoints_are_reclaimed_as_the_procedure_says(stage: Stage, tmp_path: Path) -> None:
    sid = stage.submit("sop-holder", f"{sys.executable} train.py 600")
    headers = {"Authorization": f"Bearer {stage.operator}"}
    wait_until("the holding job to write its checkpoints", lambda: len(list(
        (stage.shared / "jobs" / sid / "checkpoints").glob("global_step_*"))) == 3, timeout=120)
    said = stage.run("reclaim.md", tmp_path, JOB=sid)
    assert sid in said and '"status":"STOPPED"' in said and '"freed_bytes":1000' in said
    assert httpx.get(f"{stage.url}/v1/jobs/{sid}", headers=headers, timeout=30).json()["job"]["status"] == "STOPPED"
