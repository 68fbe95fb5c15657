"""Command builders: argv from validated values only; hostile values are refused before anything is built."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from control import commands
from control.nodes import NodeSpec, RayPorts
from core.errors import InputError
from tests.control.test_nodes import HOSTILE, spec_data

GCS = "127.0.0.2:6380"
NODE_ID = "a1" * 28


def start_kwargs(**over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = dict(gcs_address=GCS, node_ip="127.0.0.5", resources={"worker": 1},
                              labels={"argus.io/node": "gpu-01"}, temp_dir="/tmp/ag-n1", num_gpus=4, num_cpus=1,
                              ray_bin="/opt/venv/bin/ray")
    kw.update(over)
    return kw


def test_ray_start_worker_builds_one_argument_per_value() -> None:
    argv = commands.ray_start_worker(**start_kwargs(ports=RayPorts(metrics_export_port=20001)))
    assert argv[:2] == ["sh", "-c"] and argv[3:5] == ["argus-ray-start", "/opt/venv/bin"]
    argv = argv[5:]
    assert argv[:3] == ["timeout", "--kill-after=10", "120"]
    assert argv[3:5] == ["/opt/venv/bin/ray", "start"]
    assert f"--address={GCS}" in argv and "--node-ip-address=127.0.0.5" in argv
    assert "--num-gpus=4" in argv and "--num-cpus=1" in argv and "--temp-dir=/tmp/ag-n1" in argv
    assert "--metrics-export-port=20001" in argv
    assert "--block" not in argv  # returns once the node is started
    resources = next(a for a in argv if a.startswith("--resources="))
    assert json.loads(resources.split("=", 1)[1]) == {"worker": 1}
    assert "--labels=argus.io/node=gpu-01" in argv


def test_ray_start_for_a_spec_carries_its_gpus_temp_dir_and_ports() -> None:
    spec = NodeSpec.parse(spec_data(ray_ports={"dashboard_agent_listen_port": 52001}))
    argv = commands.ray_start_for(spec, GCS, {"worker": 1}, {"argus.io/node": spec.name})
    assert "--num-gpus=8" in argv and "--temp-dir=/tmp/ray-gpu01" in argv
    assert "--dashboard-agent-listen-port=52001" in argv and "--node-ip-address=10.0.0.7" in argv


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["gcs_address", "node_ip", "temp_dir", "ray_bin"])
def test_ray_start_worker_refuses_hostile_strings(field: str, value: str) -> None:
    with pytest.raises(InputError, match="refused"):
        commands.ray_start_worker(**start_kwargs(**{field: value}))


@pytest.mark.parametrize("value", HOSTILE)
def test_ray_start_worker_refuses_hostile_resources_and_labels(value: str) -> None:
    with pytest.raises(InputError, match="refused resources"):
        commands.ray_start_worker(**start_kwargs(resources={value: 1}))
    with pytest.raises(InputError, match="refused labels"):
        commands.ray_start_worker(**start_kwargs(labels={value: "x"}))
    if value:
        with pytest.raises(InputError, match="refused labels"):
            commands.ray_start_worker(**start_kwargs(labels={"k": value}))


@pytest.mark.parametrize("over", [
    {"num_gpus": 17}, {"num_gpus": -1}, {"num_gpus": "4"}, {"num_gpus": True}, {"num_cpus": 2000},
    {"resources": {"worker": "1; id"}}, {"resources": {"worker": float("nan")}}, {"timeout_s": 0},
    {"gcs_address": "127.0.0.2:99999"}, {"gcs_address": "127.0.0.2"}, {"ports": {"metrics_export_port": 1}},
])
def test_ray_start_worker_refuses_bad_numbers(over: dict[str, Any]) -> None:
    with pytest.raises(InputError):
        commands.ray_start_worker(**start_kwargs(**over))


def test_drain_uses_rays_drain_node_with_preemption() -> None:
    argv = commands.drain(GCS, NODE_ID, "argus: xid 79 on gpu 3", ray_bin="ray", deadline_s=600)
    assert argv == ["ray", "drain-node", f"--address={GCS}", f"--node-id={NODE_ID}",
                    "--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=argus: xid 79 on gpu 3",
                    "--deadline-remaining-seconds=600"]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["gcs_address", "node_id", "reason", "ray_bin"])
def test_drain_refuses_hostile_strings(field: str, value: str) -> None:
    kw: dict[str, Any] = {"gcs_address": GCS, "node_id": NODE_ID, "reason": "ok", "ray_bin": "ray"}
    kw[field] = value
    if field == "reason" and value in {"a b", "-rf"}:  # plain words are a fine reason; argv keeps them whole
        assert commands.drain(**kw)[-1] == f"--reason-message={value}"
        return
    with pytest.raises(InputError, match="refused"):
        commands.drain(**kw)


def test_drain_refuses_a_negative_deadline_and_a_short_node_id() -> None:
    with pytest.raises(InputError):
        commands.drain(GCS, NODE_ID, "ok", deadline_s=-1)
    with pytest.raises(InputError):
        commands.drain(GCS, NODE_ID[:-2], "ok")


def test_offline_without_temp_dir_is_ray_stop_and_with_one_passes_it_as_data() -> None:
    assert commands.offline(None, ray_bin="/opt/ray") == ["/opt/ray", "stop", "--grace-period=15"]
    argv = commands.offline("/tmp/ag-n1", grace_s=5)
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["argus-offline", "/tmp/ag-n1", "5"]
    assert "/tmp/ag-n1" not in argv[2]  # the script is a constant; the dir is only ever "$1"
    assert argv[2] == commands.offline("/tmp/other", grace_s=5)[2]


@pytest.mark.parametrize("value", HOSTILE + ["/", "/tmp/../etc", "/tmp/a b"])
def test_offline_and_probe_refuse_hostile_paths(value: str) -> None:
    if value == "/":
        with pytest.raises(InputError):
            commands.offline(value)
        assert commands.probe(value)["df"][-1] == "/"
        return
    with pytest.raises(InputError, match="refused"):
        commands.offline(value)
    with pytest.raises(InputError, match="refused"):
        commands.probe(value)
    with pytest.raises(InputError, match="refused"):
        commands.offline(None, ray_bin=value)


def test_a_venvs_ray_starts_with_its_bin_first_on_path(tmp_path: Path) -> None:
    """The node's dashboard agent finds py-spy (stack dumps) on PATH only: run the wrapper for real."""
    argv = commands.ray_start_worker(**start_kwargs(ray_bin=str(tmp_path / "bin" / "ray")))
    wrapper = argv[:argv.index("timeout")]
    shown = subprocess.run([*wrapper, "sh", "-c", 'echo "$PATH"; echo "$#" "$1"', "x", "a b"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[0].startswith(f"{tmp_path}/bin:") and shown[0].endswith(os.environ["PATH"])
    assert shown[1] == "1 a b"  # every argument passed on as it was
    assert commands.ray_start_worker(**start_kwargs(ray_bin="ray"))[0] == "timeout"  # a ray on PATH: as it is


def test_the_probe_finds_py_spy_beside_ray_or_on_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    spy = bin_dir / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    find = commands.probe(ray_bin=str(bin_dir / "ray"))["py_spy"]
    assert subprocess.run(find, capture_output=True, text=True).stdout.strip() == str(spy)
    spy.unlink()
    empty_path = {"PATH": str(tmp_path / "nothing")}
    missing = subprocess.run(["/bin/sh", *find[1:]], capture_output=True, text=True, env=empty_path)
    assert missing.returncode == 0 and missing.stdout.strip() == ""
    with pytest.raises(InputError):
        commands.probe(ray_bin="ray; reboot")


def test_probe_commands() -> None:
    cmds = commands.probe("/var/lib")
    assert cmds["uname"] == ["uname", "-a"] and cmds["nproc"] == ["nproc"] and cmds["free"] == ["free", "-b"]
    assert cmds["df"] == ["df", "-P", "-k", "/var/lib"]
    assert cmds["nvidia_smi"][0] == "nvidia-smi" and cmds["nvidia_smi"][-1].startswith("--format=csv")


# -- the offline script, run for real on this machine against stand-in processes -----------------------


@pytest.fixture
def sleepers() -> Iterator[Callable[[str], psutil.Process]]:
    """Start `python - --session-dir=<dir>/...` processes that sleep, each with a child; kill all after."""
    started: list[subprocess.Popen[bytes]] = []
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
            " time.sleep(120)")

    def start(arg: str) -> psutil.Process:
        proc = subprocess.Popen([sys.executable, "-c", code, arg])
        started.append(proc)
        p = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while not p.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        return p

    yield start
    for proc in started:
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
        proc.kill()
        proc.wait(timeout=30)


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_offline_script_stops_only_processes_of_that_temp_dir_and_their_children(
    sleepers: Callable[[str], psutil.Process],
) -> None:
    base = Path(tempfile.mkdtemp(prefix="ag-c-", dir="/tmp"))
    mine = sleepers(f"--session-dir={base}/n1/session_1")
    mine_child = mine.children()[0]
    neighbour = sleepers(f"--session-dir={base}/n10/session_1")  # a prefix of the name, not the dir
    neighbour_child = neighbour.children()[0]

    argv = commands.offline(f"{base}/n1", grace_s=5)
    # through a shell, exactly as sshd runs it: proves the quoting too
    done = subprocess.run(["bash", "-c", shlex.join(argv)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stopped")
    assert {int(p) for p in done.stdout.split()[1:]} == {mine.pid, mine_child.pid}
    psutil.wait_procs([mine], timeout=30)
    assert gone(mine) and gone(mine_child)
    assert not gone(neighbour) and not gone(neighbour_child)

    again = subprocess.run(["bash", "-c", shlex.join(argv)], capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == "none"
    base.rmdir()
