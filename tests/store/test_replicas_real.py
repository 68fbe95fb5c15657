"""Two real `argus serve` replicas on one PostgreSQL database (a fresh one on the server at 127.0.0.1:5432): one
leads, the other serves the API and takes over within 15 s of the leader being SIGKILLed; a replica stopped cleanly
gives the lease up at once. And on the session's real Ray cluster: a worker running a job's rank is killed, and the
leader is SIGKILLed while it runs the lost node's resubmit step; the follower takes over, and the job is resubmitted
exactly once."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from argus.store.store import Store
from control.local import LocalRunner
from core.types import ActionState
from detectors.lost_node import LostNodeDetector
from remediation.actions import Context
from remediation.policy import Mode
from remediation.runner import Remediator
from stage.localstack.argus_cli import ARGUS, argus_env
from stage.localstack.ports import free_port
from tests.helpers import wait_until
from tests.remediation.test_remediation_real import Env
from tests.store.conftest import _postgres_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _postgres_url(request)


def replica_env(tmp_path: Path, db: str, name: str, **more: str) -> dict[str, str]:
    return argus_env({"ARGUS_DATA_DIR": str(tmp_path / name), "ARGUS_DATABASE_URL": db,
                      "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_POLL_INTERVAL_S": "0.5",
                      "ARGUS_REQUEST_TIMEOUT_S": "1", "ARGUS_LEADER_ELECTION": "true", "ARGUS_LEASE_TTL_S": "10",
                      "ARGUS_LEASE_RENEW_S": "2", "ARGUS_REPLICA_ID": name, "PYTHONUNBUFFERED": "1", **more})


def serve(tmp_path: Path, db: str, name: str, port: int, **more: str) -> subprocess.Popen[str]:
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=replica_env(tmp_path, db, name, **more),
                            stdout=log, stderr=subprocess.STDOUT, text=True)


def leader_of(port: int) -> tuple[int, dict[str, Any]] | None:
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/v1/leader", timeout=2)
    except httpx.HTTPError:
        return None
    return answer.status_code, answer.json()


def wait_for(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := check()) is not None and got is not False:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_follower_takes_over_within_15_s_of_the_leader_being_killed(tmp_path: Path, pg_url: str) -> None:
    ports = {"a": free_port(), "b": free_port()}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        procs["a"] = subprocess.Popen([*ARGUS, "serve", "--port", str(ports["a"])],
                                      env=replica_env(tmp_path, pg_url, "a"), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        wait_for("replica a to lead", lambda: (leader_of(ports["a"]) or (0, {}))[0] == 200)
        procs["b"] = subprocess.Popen([*ARGUS, "serve", "--port", str(ports["b"])],
                                      env=replica_env(tmp_path, pg_url, "b"), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        status, body = wait_for("replica b to answer", lambda: leader_of(ports["b"]))
        assert status == 503 and body["holder"] == "a" and body["replica"] == "b" and body["error"] == "NotLeader"
        health = httpx.get(f"http://127.0.0.1:{ports['b']}/v1/health", timeout=5).json()
        assert health["replica"] == {"id": "b", "role": "follower", "leader": "a", "term": 1, "lease_error": None}
        # a follower serves the API from the store
        store = Store(pg_url)
        try:
            _, viewer = store.create_token("replica-test", "viewer", created_by="test")
        finally:
            store.close()
        listed = httpx.get(f"http://127.0.0.1:{ports['b']}/v1/incidents",
                           headers={"authorization": f"Bearer {viewer}"}, timeout=5)
        assert listed.status_code == 200

        procs["a"].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for("replica b to lead", lambda: (leader_of(ports["b"]) or (0, {}))[0] == 200, timeout_s=30)
        took = time.monotonic() - killed_at
        print(f"takeover after SIGKILL: {took:.1f} s")
        assert took <= 15, took
        assert leader_of(ports["b"])[1]["term"] == 2

        procs["b"].send_signal(signal.SIGINT)
        output, _ = procs["b"].communicate(timeout=60)
        assert procs["b"].returncode == 0, output
        assert "replica b leads (term 2)" in output and "replica b gave up the leader lease" in output
        assert "Traceback" not in output
        store = Store(pg_url)
        try:
            assert not store.leases.get("argus-leader").held  # given up: a third replica would lead at once
        finally:
            store.close()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


class PgEnv(Env):
    """The remediation tests' job, cluster and detection (tests/remediation/test_remediation_real.py), on the
    replicas' PostgreSQL store."""

    def __init__(self, ray_cluster: Any, tmp_path: Path, url: str) -> None:
        super().__init__(ray_cluster, tmp_path, Mode.AUTO)
        self.store.close()
        self.store = Store(url)
        self.ctx = Context(jobs=self.jobs, registry=self.store.nodes(), nodes=None,
                           dashboard_url=ray_cluster.dashboard_url, gcs_address=ray_cluster.gcs_address,
                           local=LocalRunner(), store=self.store)
        self.remediator = Remediator(self.store, self.policy, self.ctx)  # plans only: the replicas run the steps
        from argus.incidents.desk import IncidentDesk
        from argus.pipeline import Pipeline
        from collectors.ray_state import RayStateCollector

        self.pipeline = Pipeline(collectors=[RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)],
                                 detectors=[LostNodeDetector(lookback_s=30)], incidents=IncidentDesk(self.store))


@pytest.mark.ray
def test_a_leader_killed_mid_resubmit_hands_over_and_the_job_is_resubmitted_exactly_once(
        ray_cluster: Any, ray_faults: Any, tmp_path: Path, pg_url: str) -> None:
    env = PgEnv(ray_cluster, tmp_path, pg_url)
    policy = tmp_path / "policy.yaml"  # the built-in policy with the remediation tests' guards (no backoff)
    policy.write_text(yaml.safe_dump(env.policy.model_dump(mode="json")))
    cluster = {"ARGUS_RAY_DASHBOARD_URL": ray_cluster.dashboard_url, "ARGUS_RAY_GCS_ADDRESS": ray_cluster.gcs_address,
               "ARGUS_SHARED_ROOT": str(env.shared), "ARGUS_REMEDIATION_POLICY": str(policy),
               "ARGUS_REMEDIATION_MODE": "approval",  # their own incidents wait; the test's plan is approved
               "ARGUS_REMEDIATION_INTERVAL_S": "0.3", "ARGUS_POLL_INTERVAL_S": "1", "ARGUS_REQUEST_TIMEOUT_S": "10"}
    ports = {"a": free_port(), "b": free_port()}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        procs["a"] = serve(tmp_path, pg_url, "a", ports["a"], **cluster)
        wait_for("replica a to lead", lambda: (leader_of(ports["a"]) or (0, {}))[0] == 200)
        procs["b"] = serve(tmp_path, pg_url, "b", ports["b"], **cluster)
        wait_for("replica b to follow", lambda: (leader_of(ports["b"]) or (0, {}))[0] == 503)

        # The trainer outlives its rank's node and takes 4 s to stop, as one saving a last checkpoint does: the
        # resubmit step, which stops it first, runs for seconds, long enough to be caught inside (without it the
        # step took a blink and a loaded machine's poll missed it).
        sid = env.submit(STAGE_TRAINER_STOP_GRACE_S="4")
        rank_node = env.log_value(sid, "RANK_NODE")
        wait_until("a checkpoint", lambda: list((env.shared / "jobs" / sid / "checkpoints").glob("global_step_*")),
                   timeout=60)
        env.pipeline.run_once()  # the node ALIVE with the job's rank on it
        ray_faults.kill_worker(env.worker_index(rank_node))

        def lost() -> Any:
            env.pipeline.run_once()  # the replicas' loops see it too: whichever files it first opens the incident
            # whichever finding opened it (a replica's log line may, before any loop lists the node's jobs), the
            # incident learns the jobs from the first finding that knows them (argus/store/incidents.py)
            return next((i for i in env.store.list_incidents(state="open", category="node_lost")
                         if i.subject.id == rank_node and i.attrs.get("jobs")), None)

        incident = wait_until("the node_lost incident", lost, timeout=90, interval=0.3)
        assert sid in [j.get("submission_id") for j in incident.attrs["jobs"]]
        # the leader planned it for approval (its policy), or the test's auto policy did: either way, approved
        planned = env.remediator.plan(incident)
        for action in planned:
            if action.state is ActionState.PLANNED:
                env.remediator.approve(action.id, who="test-operator")
        assert [a.state for a in env.store.list_actions(incident.id)] == [ActionState.APPROVED] * 3

        def resubmit_running() -> bool:
            return any(a.kind == "resubmit_job" and a.state is ActionState.RUNNING
                       for a in env.store.list_actions(incident.id))

        wait_until("the leader to be inside the resubmit step", resubmit_running, timeout=180, interval=0.05)
        procs["a"].send_signal(signal.SIGKILL)  # the leader dies mid-step: the step stays RUNNING in the store
        killed_at = time.monotonic()
        wait_for("replica b to lead", lambda: (leader_of(ports["b"]) or (0, {}))[0] == 200, timeout_s=30)
        took = time.monotonic() - killed_at
        print(f"takeover mid-resubmit: {took:.1f} s")
        assert took <= 15, took

        def settled() -> list[Any] | None:
            actions = env.store.list_actions(incident.id)
            return actions if all(a.state not in (ActionState.APPROVED, ActionState.RUNNING) for a in actions) \
                else None

        actions = wait_until("the new leader to finish the plan", settled, timeout=180, interval=0.5)
        assert [a.kind for a in actions] == ["keep_scene", "drain_node", "resubmit_job"]
        assert all(a.state is ActionState.SUCCEEDED for a in actions), [(a.kind, a.state, a.result) for a in actions]
        [mine] = [j for j in actions[2].result["jobs"] if j["job"] == sid]
        # "submitted" where the killed leader had not got that far, "exists" where it had: never a second job
        assert mine["new"] == f"{sid}-r1" and mine["state"] in ("submitted", "exists"), mine
        assert "/checkpoints/global_step_" in env.log_value(f"{sid}-r1", "RESUME_FROM")
        assert env.log_value(f"{sid}-r1", "RANK_NODE") != rank_node
        resubmits = sorted(j.submission_id for j in env.jobs.list() if j.submission_id.startswith(f"{sid}-r"))
        assert resubmits == [f"{sid}-r1"]  # exactly one new job, whether or not the killed leader had submitted it
        resubmit = next(a for a in actions if a.kind == "resubmit_job")
        assert "interrupted by a restart" in str(resubmit.result.get("recovered")), resubmit.result
        assert "replica b leads (term 2)" in (tmp_path / "b.log").read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        env.stop_all()

