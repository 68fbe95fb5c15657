"""Helpers for tests that start Ray nodes over the test sshd: each such node is this host, advertising
NODE_IP, with its own short Ray temp dir by which its processes are found and killed."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from control.nodes import NodeSpec
from stage.localstack.ports import free_port
from stage.localstack.sshd import Sshd

NODE_IP = "127.0.0.5"
RAY_BIN = str(Path(sys.executable).parent / "ray")


def processes_with(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in arg for arg in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_tree(procs: list[psutil.Process]) -> None:
    everything = list(procs)
    for p in procs:
        try:
            everything += p.children(recursive=True)
        except psutil.Error:
            pass
    for p in everything:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(everything, timeout=15)


@pytest.fixture
def ray_temp_dir() -> Iterator[str]:
    """A short unique Ray temp dir; whatever runs with it in its command line is killed afterwards."""
    path = tempfile.mkdtemp(prefix="ag-n", dir="/tmp")
    try:
        yield path
    finally:
        kill_tree(processes_with(path))
        shutil.rmtree(path, ignore_errors=True)


def node_data(sshd: Sshd, temp_dir: str, **over: Any) -> dict[str, Any]:
    """A node that is this host reached over the test sshd, advertising NODE_IP to Ray."""
    data: dict[str, Any] = {
        "name": "loop-05",
        "host": "127.0.0.1",
        "ssh_user": sshd.user,
        "ssh_port": sshd.port,
        "ssh_key_path": str(sshd.client_key),
        "host_key": sshd.host_public_key,
        "node_ip": NODE_IP,
        "labels": {"argus.io/zone": "loopback"},
        "pool": "test",
        "gpus": 0,
        "cpus": 1,
        "ray_bin": RAY_BIN,
        "ray_temp_dir": temp_dir,
        "ray_ports": {
            "metrics_export_port": free_port(min_port=20000),
            "dashboard_agent_listen_port": free_port(),
            "dashboard_agent_grpc_port": free_port(),
            "runtime_env_agent_port": free_port(),
        },
    }
    data.update(over)
    return data


def node_spec(sshd: Sshd, temp_dir: str, **over: Any) -> NodeSpec:
    return NodeSpec.parse(node_data(sshd, temp_dir, **over))
