"""The real three-node Ray cluster: its shape, a lost node, a restart, and a clean stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stage.localstack.process import ProcessError, is_alive
from stage.localstack.ray_cluster import RayCluster

pytestmark = pytest.mark.ray


def test_head_and_two_workers_are_alive(ray_cluster):
    alive = [n for n in ray_cluster.list_nodes() if n["state"] == "ALIVE"]
    assert len(alive) == 3
    by_ip = {n["node_ip"]: n for n in alive}
    assert set(by_ip) == {"127.0.0.2", "127.0.0.3", "127.0.0.4"}
    head = by_ip["127.0.0.2"]
    assert head["is_head_node"]
    assert head["resources_total"].get("CPU", 0) == 0
    for i, ip in ((1, "127.0.0.3"), (2, "127.0.0.4")):
        res = by_ip[ip]["resources_total"]
        assert res["worker"] == 1 and res[f"worker{i}"] == 1 and res["CPU"] == 1
        assert by_ip[ip]["node_id"] == ray_cluster.worker(i).node_id
    assert {n.node_id for n in ray_cluster.nodes} == {n["node_id"] for n in alive}


def test_service_discovery_file_lists_metrics_targets(ray_cluster):
    assert len(str(ray_cluster.head.temp_dir)) < 40  # room for Ray's unix socket paths
    groups = json.loads(ray_cluster.sd_file.read_text())
    targets = {t for g in groups for t in g["targets"]}
    assert f"127.0.0.2:{ray_cluster.head.metrics_port}" in targets


def test_killed_worker_is_declared_dead_then_restarted(ray_cluster, ray_faults):
    old = ray_cluster.worker(2)
    old_pids = old.pids()
    ray_faults.kill_worker(2)
    dead = ray_cluster.wait_node_state(old.node_id, "DEAD", timeout=60)
    assert "health check" in dead["state_message"] or "heartbeat" in dead["state_message"]
    # The blocking `ray start` parent takes the rest of the node down by itself.
    deadline = time.monotonic() + 30
    while any(is_alive(p) for p in old_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in old_pids if is_alive(p)] == []

    new = ray_faults.restart_worker(2)
    assert new.node_id != old.node_id
    assert ray_cluster.node_state(new.node_id)["state"] == "ALIVE"
    assert ray_cluster.node_state(new.node_id)["resources_total"]["worker2"] == 1
    assert ray_cluster.worker(2) is new


def test_failed_head_start_names_the_process_and_cleans_up(tmp_path):
    fake = tmp_path / "ray"
    fake.write_text("#!/bin/sh\necho 'fake ray cannot start' >&2\nexit 4\n")
    fake.chmod(0o755)
    cluster = RayCluster(tmp_path / "c", worker_ips=(), ray_bin=str(fake))
    with pytest.raises(ProcessError) as info:
        cluster.start(timeout=30)
    assert "ray-head" in str(info.value) and "fake ray cannot start" in str(info.value)
    cluster.stop()
    assert cluster.nodes == []


def test_stop_leaves_no_process_behind(tmp_path):
    # A head-only cluster keeps this cheap; workers are stopped by the same code path.
    cluster = RayCluster(tmp_path / "solo", worker_ips=(), head_ip="127.0.0.2")
    with cluster:
        pids = cluster.head.pids()
        temp_root = cluster.head.temp_dir.parent
        assert len(pids) > 5
    assert [p for p in pids if is_alive(p)] == []
    assert not temp_root.exists()
    assert not (Path(tmp_path / "solo") / "ray-temp").exists()
    cluster.stop()
