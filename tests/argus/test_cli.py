"""The `argus` command as a user runs it: a subprocess, clear errors, no tracebacks."""

import json
import os
import subprocess
import sys
from datetime import datetime, timezone

from argus.store.store import Store
from core.types import Category, Finding, Subject, SubjectKind

ARGUS = [sys.executable, "-m", "argus.cli"]


def run(*args, env=None, stdin=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    full_env.update(env or {})
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=full_env, input=stdin, timeout=120)


def test_incidents_list_and_show(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    incident, _ = store.record_finding(
        Finding(
            category=Category.NODE_LOST,
            reason="RayNodeDead",
            subject=Subject(kind=SubjectKind.NODE, id="abc123", name="127.0.0.3"),
            summary="Ray node 127.0.0.3 died: health check failed",
            first_seen=datetime.now(timezone.utc),
        )
    )
    store.close()
    env = {"ARGUS_DATA_DIR": str(tmp_path)}
    listed = run("incidents", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["id"] == incident.id and row["category"] == "node_lost"
    shown = run("incidents", "show", incident.id, env=env)
    assert shown.returncode == 0 and "127.0.0.3" in shown.stdout and "RayNodeDead" in shown.stdout
    table = run("incidents", "list", env=env)
    assert incident.id in table.stdout


def test_unknown_incident_is_a_clear_error(tmp_path):
    result = run("incidents", "show", "inc-nope", env={"ARGUS_DATA_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "inc-nope" in result.stderr and "Traceback" not in result.stderr


def test_malformed_settings_file_is_a_clear_error(tmp_path):
    config = tmp_path / "argus.yaml"
    config.write_text("poll_interval_s: [1, 2\n")
    result = run("incidents", "list", "--config", str(config))
    assert result.returncode == 2
    assert str(config) in result.stderr and "line" in result.stderr and "Traceback" not in result.stderr
    result = run("config", "show", env={"ARGUS_API_PORT": "not-a-port"})
    assert result.returncode == 2 and "ARGUS_API_PORT" in result.stderr


def test_unreachable_database_is_a_clear_error():
    result = run("incidents", "list", env={"ARGUS_DATABASE_URL": "postgresql+psycopg2://u:secret@127.0.0.1:9/x"})
    assert result.returncode == 2
    assert "database" in result.stderr and "secret" not in result.stderr and "Traceback" not in result.stderr


def test_help_lists_the_commands():
    result = run("--help")
    assert result.returncode == 0
    for command in ("serve", "incidents", "analyze", "demo", "tokens", "jobs"):
        assert command in result.stdout
    assert "dcgm-sim" not in result.stdout  # the simulator is the stage's (`argus-stage dcgm-sim`), not Argus's


def test_demo_without_the_stage_says_how_to_get_it():
    # What an `argus-gpu` wheel install sees: no `stage` package (None in sys.modules makes its import fail).
    program = ("import sys; sys.modules['stage'] = None; sys.argv = ['argus', 'demo']; "
               "from argus.cli import main; main()")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=full_env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "stage" in result.stderr and "make demo" in result.stderr and "pip install -e ./stage" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_stays_up_without_ray_and_says_so(tmp_path):
    import signal
    import time

    import httpx

    from stage.localstack.ports import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env.update({"ARGUS_DATA_DIR": str(tmp_path), "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9",
                "ARGUS_PROMETHEUS_URL": "http://127.0.0.1:9",
                "ARGUS_POLL_INTERVAL_S": "0.5", "ARGUS_REQUEST_TIMEOUT_S": "1"})
    # A token made the way an admin makes one, before the server starts on the same data dir.
    created = subprocess.run([*ARGUS, "tokens", "create", "serve-test", "--role", "viewer"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    auth = {"Authorization": f"Bearer {created.stdout.strip()}"}
    proc = subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, health = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).json()
                if {"ray_state", "ray_logs", "prometheus"} <= set(health["unreachable"]):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert health and health["status"] == "degraded"
        assert {"ray_state", "ray_logs", "prometheus"} <= set(health["unreachable"])
        assert httpx.get(f"http://127.0.0.1:{port}/v1/incidents", timeout=5).status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/v1/incidents", headers=auth, timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "cannot reach Ray state API" in output and "cannot reach Prometheus" in output
    assert "Traceback" not in output


def test_jobs_queue_lists_the_queue_with_its_reasons(tmp_path):
    from control.admission import Gang
    from control.queue import QueueEntry, QueueState

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    now = datetime.now(timezone.utc)
    for sid, state in (("sft-1", QueueState.STARTED), ("grpo-2", QueueState.QUEUED)):
        store.job_queue.add(QueueEntry(position=0, submission_id=sid, owner="alice", gang=Gang(2, 8, "h20"),
                                       request={"spec": {}}, state=state, enqueued_at=now,
                                       reason="waiting for 2 nodes × 8 GPUs in pool h20: 1 node has 8 free (gpu-3)"))
    store.close()
    env = {"ARGUS_DATA_DIR": str(tmp_path)}
    listed = run("jobs", "queue", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["submission_id"], r["state"]) for r in rows] == [("sft-1", "running"), ("grpo-2", "queued")]
    table = run("jobs", "queue", "--state", "queued", env=env)
    assert table.returncode == 0 and "grpo-2" in table.stdout and "sft-1" not in table.stdout
    assert "waiting for 2 nodes" in table.stdout  # the reason (rich may fold the rest of it)
    bad = run("jobs", "queue", "--state", "sleeping", env=env)
    assert bad.returncode == 2 and "is not one of" in bad.stderr and "Traceback" not in bad.stderr
