"""Remediation on the real local cluster: a worker running a job's rank is killed, Argus opens a lost-node
incident, keeps the scene, drains the node, and resubmits the job, which resumes from its checkpoint on the
other worker. Once in auto mode, once in approval mode through the API (where the agent may approve only
what the policy lets it). Then a runner killed in the middle of a step repeats nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.ray_state import RayStateCollector
from control.jobs import JobController
from control.jobspec import JobSpec
from control.local import LocalRunner
from core.types import ActionState, Category
from detectors.lost_node import LostNodeDetector
from remediation.actions import Context
from remediation.policy import Mode, load_policy
from remediation.runner import Remediator
from stage.localstack.trainer import RESUMABLE_TRAINER
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray]



class Env:
    def __init__(self, ray_cluster, tmp_path: Path, mode: Mode) -> None:
        self.cluster = ray_cluster
        self.store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
        self.shared = tmp_path / "shared"
        (self.shared / "code").mkdir(parents=True)
        (self.shared / "code" / "train.py").write_text(RESUMABLE_TRAINER)
        self.jobs = JobController(ray_cluster.dashboard_url, self.shared, code_roots=[self.shared])
        policy = load_policy(mode=mode)
        guards = policy.guards.model_copy(update={"min_drain_interval_s": 0, "max_drained_share": 1.0,
                                                  "resubmit_backoff_s": 0})
        self.policy = policy.model_copy(update={"guards": guards})
        self.ctx = Context(jobs=self.jobs, registry=self.store.nodes(), nodes=None,
                           dashboard_url=ray_cluster.dashboard_url, gcs_address=ray_cluster.gcs_address,
                           local=LocalRunner(), store=self.store)
        self.remediator = Remediator(self.store, self.policy, self.ctx)
        self.pipeline = Pipeline(collectors=[RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)],
                                 detectors=[LostNodeDetector(lookback_s=30)],
                                 incidents=IncidentDesk(self.store))

    def submit(self, **env: str) -> str:
        spec = JobSpec(name="grpo", workload="grpo", entrypoint=f"{sys.executable} train.py", owner="alice",
                       code_path=str(self.shared / "code"), working_dir=str(self.shared / "code"), env=env)
        return self.jobs.submit(spec).submission_id

    def log_value(self, sid: str, key: str) -> str:
        def found() -> str | None:
            try:
                log = self.jobs.logs(sid)
            except Exception:  # noqa: BLE001 - no driver yet
                return None
            line = next((x for x in log.splitlines() if x.startswith(key + "=")), None)
            return line.split("=", 1)[1] if line else None

        return wait_until(f"job {sid} to print {key}", found, timeout=120)

    def worker_index(self, node_id: str) -> int:
        return next(w.index for w in self.cluster.workers if w.node_id == node_id)

    def lost_node_incident(self):
        def opened():
            return [i for i in self.pipeline.run_once().opened if i.category is Category.NODE_LOST]

        [incident] = wait_until("a node_lost incident", opened, timeout=90, interval=0.3)
        return incident

    def run_until_settled(self, incident_id: str, timeout: float = 180) -> list[Any]:
        def settled():
            self.remediator.run_pending()
            actions = self.store.list_actions(incident_id)
            return actions if actions and all(a.state not in (ActionState.APPROVED, ActionState.RUNNING)
                                              for a in actions) else None

        return wait_until("the plan to finish", settled, timeout=timeout, interval=0.5)

    def stop_all(self) -> None:
        for record in self.jobs.list():
            if not record.ended:
                self.jobs.stop(record.submission_id, reason="test teardown")
        self.store.close()


def scenario(env: Env, ray_faults) -> tuple[Any, str, float]:
    """Submit, kill the worker the rank runs on, detect: (incident, old submission id, kill time)."""
    sid = env.submit()
    rank_node = env.log_value(sid, "RANK_NODE")
    assert env.log_value(sid, "RESUME_FROM") == "none"
    wait_until("a checkpoint", lambda: list((env.shared / "jobs" / sid / "checkpoints").glob("global_step_*")),
               timeout=60)
    env.pipeline.run_once()  # Argus sees the node ALIVE with the job's rank on it
    killed_at = ray_faults.kill_worker(env.worker_index(rank_node))
    incident = env.lost_node_incident()
    assert sid in [j.get("submission_id") for j in incident.attrs["jobs"]]
    return incident, sid, killed_at


def check_recovered(env: Env, actions: list[Any], sid: str, dead_node: str) -> str:
    by_kind = {a.kind: a for a in actions}
    assert [a.kind for a in actions] == ["keep_scene", "drain_node", "resubmit_job"]
    assert all(a.state is ActionState.SUCCEEDED for a in actions), [(a.kind, a.state, a.result) for a in actions]
    # the node's incident names every job with work there (an earlier test's may still be ending): this job's scene
    scene = next(Path(f) for f in by_kind["keep_scene"].result["folders"] if f"/jobs/{sid}/" in f)
    manifest = json.loads((scene / "manifest.json").read_text())
    assert {"incident.json", "config/jobspec.yaml", "ray/actors.json"} <= set(manifest["files"])
    new_sid = f"{sid}-r1"
    [mine] = [j for j in by_kind["resubmit_job"].result["jobs"] if j["job"] == sid]
    assert mine["new"] == new_sid and mine["state"] == "submitted"
    resumed = env.log_value(new_sid, "RESUME_FROM")
    assert "/checkpoints/global_step_" in resumed and sid in resumed
    new_node = env.log_value(new_sid, "RANK_NODE")
    assert new_node != dead_node
    assert env.jobs.get(new_sid).status == "RUNNING"
    marker = json.loads((env.shared / "jobs" / new_sid / "config" / "resubmit.json").read_text())
    assert marker["of"] == sid and marker["attempt"] == 1
    return new_sid


def test_lost_node_auto_mode_keeps_scene_drains_and_resubmits(ray_cluster, ray_faults, tmp_path: Path) -> None:
    env = Env(ray_cluster, tmp_path, Mode.AUTO)
    try:
        incident, sid, killed_at = scenario(env, ray_faults)
        planned = env.remediator.plan(incident)
        assert [a.state for a in planned] == [ActionState.APPROVED] * 3
        assert env.remediator.plan(incident) == planned  # planning twice plans once
        actions = env.run_until_settled(incident.id)
        new_sid = check_recovered(env, actions, sid, incident.subject.id)
        print(f"\nfault to resubmitted job RUNNING: {time.time() - killed_at:.1f} s ({new_sid})")
        # a second incident for the job would not resubmit it again: the chain's next id is -r2, and the
        # guard on resubmits per day counts this one
        audited = [r.path for r in env.store.list_audit(limit=10) if r.actor == "argus-remediation"]
        assert sorted(audited) == ["/remediation/drain_node", "/remediation/keep_scene", "/remediation/resubmit_job"]
    finally:
        env.stop_all()


def test_lost_node_in_approval_mode_through_the_api(ray_cluster, ray_faults, tmp_path: Path) -> None:
    env = Env(ray_cluster, tmp_path, Mode.APPROVAL)
    app = create_app(store=env.store, remediator=env.remediator)
    tokens = {r: env.store.create_token(f"t-{r}", r, created_by="tests")[1] for r in ("operator", "agent", "viewer")}

    def client(role: str) -> TestClient:
        return TestClient(app, headers={"Authorization": f"Bearer {tokens[role]}"}, raise_server_exceptions=False)

    try:
        incident, sid, _ = scenario(env, ray_faults)
        proposed = client("agent").post(f"/v1/incidents/{incident.id}/actions", json={"plan": "policy"})
        assert proposed.status_code == 201, proposed.text
        ids = {a["kind"]: a["id"] for a in proposed.json()["items"]}
        assert all(a["state"] == "planned" for a in proposed.json()["items"])
        env.remediator.run_pending()
        assert all(a.state is ActionState.PLANNED for a in env.store.list_actions(incident.id))  # nothing ran

        assert client("viewer").post(f"/v1/actions/{ids['keep_scene']}:approve").status_code == 403
        refused = client("agent").post(f"/v1/actions/{ids['drain_node']}:approve")
        assert refused.status_code == 403 and "may not approve drain_node" in refused.json()["message"]
        assert client("agent").post(f"/v1/actions/{ids['keep_scene']}:approve").status_code == 200
        assert client("agent").post(f"/v1/actions/{ids['resubmit_job']}:approve").status_code == 200
        assert client("operator").post(f"/v1/actions/{ids['drain_node']}:approve").status_code == 200
        again = client("operator").post(f"/v1/actions/{ids['drain_node']}:approve")
        assert again.status_code == 409

        actions = env.run_until_settled(incident.id)
        check_recovered(env, actions, sid, incident.subject.id)
        listed = client("viewer").get("/v1/actions", params={"incident_id": incident.id}).json()["items"]
        assert [a["state"] for a in listed] == ["succeeded"] * 3
        assert listed[1]["result"]["approved_by"] == "t-operator"
    finally:
        env.stop_all()


CRASHING_RUNNER = """
import sys
sys.path.insert(0, {root!r})
from argus.store.store import Store
from control.jobs import JobController
from control.local import LocalRunner
from remediation.actions import Context
from remediation.policy import load_policy
from remediation.runner import Remediator
store = Store({url!r})
jobs = JobController({dashboard!r}, __import__("pathlib").Path({shared!r}))
ctx = Context(jobs=jobs, registry=store.nodes(), nodes=None, dashboard_url={dashboard!r}, gcs_address=None,
              local=LocalRunner(), store=store, stop_wait_s=120)
Remediator(store, load_policy(mode="auto"), ctx).run_pending()
"""


def test_a_runner_killed_mid_step_repeats_nothing(ray_cluster, tmp_path: Path) -> None:
    env = Env(ray_cluster, tmp_path, Mode.AUTO)
    try:
        sid = env.submit()
        env.log_value(sid, "RANK_NODE")
        # A hang: the policy keeps the scene and resubmits, which first stops the running job and waits.
        from core.types import Evidence, Finding, Severity, Subject, SubjectKind

        finding = Finding(category=Category.NCCL_HANG, reason="TrainingStalled",
                          subject=Subject(kind=SubjectKind.JOB, id=sid), summary=f"job {sid} stalled",
                          severity=Severity.CRITICAL, evidence=(Evidence(source="test", text="no progress"),),
                          first_seen=__import__("core.types", fromlist=["utcnow"]).utcnow(),
                          attrs={"submission_id": sid})
        incident, _ = env.store.record_finding(finding)
        env.remediator.plan(incident)
        script = tmp_path / "runner.py"
        script.write_text(textwrap.dedent(CRASHING_RUNNER.format(
            root=str(Path(__file__).resolve().parents[2]), url=f"sqlite:///{tmp_path / 'argus.db'}",
            dashboard=ray_cluster.dashboard_url, shared=str(env.shared))))
        proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def resubmit_running():
            return any(a.kind == "resubmit_job" and a.state is ActionState.RUNNING
                       for a in env.store.list_actions(incident.id))

        wait_until("the runner to be inside the resubmit step", resubmit_running, timeout=120, interval=0.05)
        proc.send_signal(signal.SIGKILL)  # the crash: mid-step, state left RUNNING
        proc.wait(timeout=30)

        recovered = env.remediator.recover()
        assert [a.kind for a in recovered] == ["resubmit_job"]
        actions = env.run_until_settled(incident.id)
        assert [a.state for a in actions] == [ActionState.SUCCEEDED, ActionState.SUCCEEDED]
        resubmits = [j.submission_id for j in env.jobs.list() if j.submission_id.startswith(f"{sid}-r")]
        assert resubmits == [f"{sid}-r1"]  # exactly one new job, whether or not the killed runner had submitted
        env.remediator.recover()
        assert env.remediator.run_pending() == []  # nothing left to do, nothing done twice
    finally:
        env.stop_all()
