"""Two real `argus serve` replicas on one PostgreSQL database (a fresh one on the server at 127.0.0.1:5432): one
leads, the other serves the API and takes over within 15 s of the leader being SIGKILLed; a replica stopped cleanly
gives the lease up at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from argus.store.store import Store
from stage.localstack.ports import free_port
from tests.store.conftest import _postgres_url

pytestmark = pytest.mark.postgres
ARGUS = [sys.executable, "-c", "import sys; sys.argv[0] = 'argus'; from argus.cli import main; main()"]


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _postgres_url(request)


def replica_env(tmp_path: Path, db: str, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env.update({"ARGUS_DATA_DIR": str(tmp_path / name), "ARGUS_DATABASE_URL": db,
                "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_POLL_INTERVAL_S": "0.5",
                "ARGUS_REQUEST_TIMEOUT_S": "1", "ARGUS_LEADER_ELECTION": "true", "ARGUS_LEASE_TTL_S": "10",
                "ARGUS_LEASE_RENEW_S": "2", "ARGUS_REPLICA_ID": name})
    return env


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
