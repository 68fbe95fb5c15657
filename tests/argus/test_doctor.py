"""`argus doctor` (argus/doctor.py): against the real local stack (the session's Ray cluster with profiling on, its
Prometheus scraping a dcgm-exporter simulator, a migrated SQLite store, a shared root) every check passes; with one part
missing, that part fails and says how to fix it, and the rest still pass. Without a stack: a fresh install's missing
pieces, the command's exit code and JSON, and the doctor changing nothing. Ray's refusals of stack dumps are checked
against the texts Ray's dashboard sends (a transport standing in for the dashboard, said so below)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from argus.doctor import FAIL, OK, SKIP, WARN, Check, check_py_spy, run_checks
from argus.store import migrate
from argus.store.store import Store
from core.settings import Settings, load_settings
from stage.localstack.argus_cli import ARGUS, argus_env
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def stack_settings(tmp_path: Path, **more: Any) -> Settings:
    (tmp_path / "shared" / "jobs").mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{tmp_path / 'data' / 'argus.db'}"
    Store(db).close()  # migrated, as argus serve leaves it
    return load_settings(None, data_dir=tmp_path / "data", database_url=db, shared_root=tmp_path / "shared", **more)


@pytest.mark.ray
@pytest.mark.prometheus
def test_the_local_stack_passes_and_each_missing_part_is_named_with_its_fix(
        tmp_path: Path, ray_cluster: Any, prometheus_stack: Any) -> None:
    prometheus = prometheus_stack.prometheus
    sim = DcgmExporterSim("gpu-node-1", gpus=2, host=ray_cluster.worker(1).ip).start()
    try:
        address = f"{sim.host}:{sim.port}"
        prometheus.set_targets("dcgm-exporter", [address])
        settings = stack_settings(tmp_path, ray_dashboard_url=ray_cluster.dashboard_url,
                                  ray_gcs_address=ray_cluster.gcs_address, prometheus_url=prometheus.url)

        def doctor_says(name: str, status: str) -> dict[str, Check] | None:
            checks = by_name(run_checks(settings))
            return checks if checks[name].status == status else None

        checks = wait_until("Prometheus to scrape the exporter", lambda: doctor_says("dcgm-exporter targets", OK),
                            timeout=60)
        assert {n: c.status for n, c in checks.items() if c.status not in (OK, SKIP)} == {}, checks
        assert "3 node(s) alive" in checks["ray dashboard"].detail  # and the session's killed workers, dead
        assert checks["py-spy on nodes"].detail == "py-spy answers through Ray's dashboard on 3 node(s)"
        assert checks["clock vs ray head"].status == OK and checks["ssh to nodes"].status == SKIP

        sim.stop()  # one part missing: the GPU node's exporter
        checks = wait_until("Prometheus to see the exporter down", lambda: doctor_says("dcgm-exporter targets", FAIL),
                            timeout=60)
        down = checks["dcgm-exporter targets"]
        assert address in down.detail and "start dcgm-exporter" in str(down.fix)
        assert [n for n, c in checks.items() if c.status == FAIL] == ["dcgm-exporter targets"]

        gone = settings.model_copy(update={"ray_dashboard_url": "http://127.0.0.1:9"})  # Ray's dashboard missing
        checks = by_name(run_checks(gone))
        assert checks["ray dashboard"].status == FAIL and "127.0.0.1:9" in checks["ray dashboard"].detail
        assert "ray_dashboard_url" in str(checks["ray dashboard"].fix)
        assert checks["py-spy on nodes"].status == SKIP
    finally:
        sim.stop()


def test_a_fresh_install_is_told_what_is_missing_and_the_doctor_changes_nothing(tmp_path: Path) -> None:
    env = argus_env({"ARGUS_DATA_DIR": str(tmp_path / "data"), "ARGUS_SHARED_ROOT": str(tmp_path / "nfs"),
                     "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_PROMETHEUS_URL": "http://127.0.0.1:9",
                     "ARGUS_REQUEST_TIMEOUT_S": "2"})
    done = subprocess.run([*ARGUS, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    checks = {c["check"]: c for c in json.loads(done.stdout)}
    assert checks["database"]["status"] == WARN and "argus db upgrade" in checks["database"]["fix"]
    assert checks["shared root"]["status"] == FAIL and f"mount the shared storage at {tmp_path / 'nfs'}" in (
        checks["shared root"]["fix"])
    assert checks["prometheus"]["status"] == FAIL and checks["ray dashboard"]["status"] == FAIL
    assert checks["ray gcs"]["status"] == WARN and checks["llm"]["status"] == SKIP
    assert not (tmp_path / "data" / "argus.db").exists()  # nothing created
    table = subprocess.run([*ARGUS, "doctor"], env=env, capture_output=True, text=True, timeout=120)
    assert table.returncode == 1 and "to fix: ray dashboard, prometheus, shared root" in " ".join(table.stdout.split())


def test_an_old_schema_is_named_and_left_as_it_is(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'argus.db'}"
    migrate.upgrade(db, "0004")
    settings = load_settings(None, data_dir=tmp_path, database_url=db, shared_root=tmp_path,
                             ray_dashboard_url="http://127.0.0.1:9", request_timeout_s=1)
    database = by_name(run_checks(settings))["database"]
    assert database.status == FAIL and "is at revision 0004, Argus needs" in database.detail
    assert "argus db upgrade" in str(database.fix)
    assert migrate.current_revision(db) == "0004"


@pytest.mark.postgres
def test_a_clock_off_from_the_database_is_named(tmp_path: Path) -> None:
    from tests.store.conftest import PG_SERVER

    settings = load_settings(None, data_dir=tmp_path, database_url=f"{PG_SERVER}/postgres", shared_root=tmp_path,
                             ray_dashboard_url="http://127.0.0.1:9", request_timeout_s=1)
    import time

    right = by_name(run_checks(settings))["clock vs database"]
    assert right.status == OK, right
    ahead = by_name(run_checks(settings, now=lambda: time.time() + 7))["clock vs database"]
    assert ahead.status == FAIL and "7." in ahead.detail and "ahead of it" in ahead.detail
    assert "chrony" in str(ahead.fix)


# Ray's dashboard's own answers (ray/dashboard/modules/reporter: reporter_head.py and profile_manager.py), served by a
# transport standing in for the dashboard: the classification of each.
PROFILING_OFF = ("Profiling is disabled by default for security reasons. To enable profiling, set the environment "
                 "variable RAY_DASHBOARD_ENABLE_PROFILING=1 on the Ray head node.")
NO_PY_SPY = "Failed to execute: py-spy is not installed"


@pytest.mark.parametrize(("status", "text", "verdict", "fix"), [
    (403, PROFILING_OFF, FAIL, "RAY_DASHBOARD_ENABLE_PROFILING=1"),
    (500, NO_PY_SPY, FAIL, "pip install py-spy"),
    (500, "Error: Failed to find python version from target process", OK, None),
])
def test_ray_refusing_stack_dumps_says_why(status: int, text: str, verdict: str, fix: str | None) -> None:
    nodes = [{"nodeId": "a" * 56, "nodeManagerAddress": "10.0.0.7"}]
    stand_in = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, text=text)))
    check = check_py_spy(Settings(ray_dashboard_url="http://ray-head:8265"), stand_in, nodes)
    assert check.status == verdict
    if fix:
        assert fix in str(check.fix)
    if text == NO_PY_SPY:
        assert "10.0.0.7" in check.detail


@pytest.mark.ray
@pytest.mark.sshd
def test_registered_nodes_are_probed_over_ssh_and_an_unreachable_one_is_named(
        tmp_path: Path, ray_cluster: Any, sshd: Any) -> None:
    from control.node_manager import NodeManager
    from tests.node_helpers import node_spec

    settings = stack_settings(tmp_path, ray_dashboard_url=ray_cluster.dashboard_url,
                              ray_gcs_address=ray_cluster.gcs_address)
    store = Store(settings.effective_database_url)
    try:
        manager = NodeManager(store.nodes(), gcs_address=ray_cluster.gcs_address,
                              dashboard_url=ray_cluster.dashboard_url)
        manager.register(node_spec(sshd, "/tmp/ag-doctor-a", name="loop-a"), actor="test")  # never started
        ssh = by_name(run_checks(settings))["ssh to nodes"]
        assert ssh.status == OK and ssh.detail == "1 registered node(s) answer over SSH", ssh
        manager.register(node_spec(sshd, "/tmp/ag-doctor-b", name="loop-gone", ssh_port=9), actor="test")
        ssh = by_name(run_checks(settings))["ssh to nodes"]
        assert ssh.status == FAIL and ssh.detail.startswith("1 of 2: loop-gone: node loop-gone is unreachable")
        assert "ssh user and key" in str(ssh.fix)
    finally:
        store.close()
