"""GPU readings from node agents: NVML on the node (a stand-in GPU host here, stage/sim/nvml_host.py; the real GPU
where one exists), sent with the agent's batches to the real central app (uvicorn on loopback, SQLite tokens), and
turned by AgentGpuCollector into the series dcgm-exporter would give, which the real idle-GPU detector attributes
to the agent's node."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pynvml
import pytest

from argus.agents.node_agent import NodeAgent
from collectors.agent_gpus import AgentGpuCollector, AgentGpuReport, readings_of, samples_of
from collectors.nvml import NvmlCollector
from core.types import Category, SubjectKind
from detectors.idle_gpu import IdleGpuDetector
from stage.localstack.central import Central
from stage.sim.nvml_host import StandInGpuHost, two_gpus
from tests.detectors.test_idle_gpu import job, snapshot
from tests.support import Clock

NODE = ("node-a", "10.0.0.7", 2.0)


def gpu_agent(tmp_path: Path, url: str, token: str, nvml_module: Any, **kw: Any) -> NodeAgent:
    logs = tmp_path / "session" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "raylet.out").touch()
    return NodeAgent(node_id=NODE[0], node_ip=NODE[1], central_url=url, token=token, logs_dir=str(logs),
                     kernel_log="off", hostname="gpu-host-7", nvml_module=nvml_module,
                     **{"interval_s": 0.1, "gpu_interval_s": 10.0, **kw})


def test_an_agent_sends_its_gpus_as_dcgm_exporter_series_about_its_node(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    host = StandInGpuHost(two_gpus())
    agent = gpu_agent(tmp_path, server.url, token, host)
    agent.run_once()
    assert agent.counters.gpu_reads == 1 and agent.stats()["gpus"] == "nvml: 2 GPU(s)"
    signals = AgentGpuCollector(server.inbox).collect()
    direct = NvmlCollector(hostname="gpu-host-7", nvml=StandInGpuHost(two_gpus())).collect()
    # the same series, values and labels as NVML read on the node, plus the node's IP as the instance
    assert sorted((s.attrs["metric"], s.subject.id, s.value) for s in signals) == \
        sorted((s.attrs["metric"], s.subject.id, s.value) for s in direct)
    for signal in signals:
        assert signal.subject.kind is SubjectKind.GPU and signal.source == "agent://10.0.0.7/nvml"
        assert signal.attrs["hostname"] == "gpu-host-7"
        labels = signal.attrs["labels"]
        assert labels["instance"] == "10.0.0.7" and labels["Hostname"] == "gpu-host-7"
        assert labels["pci_bus_id"].count(":") == 2 and labels["DCGM_FI_DRIVER_VERSION"]
    xid = [s for s in signals if s.attrs["metric"] == "DCGM_FI_DEV_XID_ERRORS"]
    assert {s.attrs["labels"]["err_code"] for s in xid} == {"0"}
    assert AgentGpuCollector(server.inbox).collect() == []  # each report is read once
    listed = httpx.get(f"{server.url}/v1/agents", headers={"authorization": f"Bearer {viewer(server)}"}).json()
    assert listed[0]["stats"]["gpus"] == "nvml: 2 GPU(s)"
    agent.stop()


def test_readings_are_states_the_newest_replaces_one_the_central_has_not_answered(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    gpus = two_gpus()
    host = StandInGpuHost(gpus)
    clock = [0.0]
    agent = gpu_agent(tmp_path, server.url, token, host, clock=lambda: clock[0], heartbeat_s=1000.0)
    agent.run_once()
    AgentGpuCollector(server.inbox).collect()
    server.stop()
    for step, util in ((10.0, 55), (20.0, 66)):  # two readings while the central is away
        clock[0] = step
        gpus[0].util = util
        agent._retry_at = float("-inf")
        agent.run_once()
    assert agent.counters.gpu_reads == 3 and agent.counters.send_failures == 2
    assert len(agent._gpus) == 2  # one reading per GPU waits, not one per poll
    server.start()
    clock[0] = 25.0  # not due for a new reading: the one waiting is sent
    agent._retry_at = float("-inf")
    agent.run_once()
    utils = {s.attrs["gpu"]: s.value for s in AgentGpuCollector(server.inbox).collect()
             if s.attrs["metric"] == "DCGM_FI_DEV_GPU_UTIL"}
    assert utils == {0: 66.0, 1: 0.0}
    agent.stop()


def test_a_node_without_a_gpu_driver_says_so_sends_no_gpus_and_tries_again_later(
        tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    host = StandInGpuHost(two_gpus(), init_error=pynvml.NVMLError_LibraryNotFound)
    clock = [0.0]
    agent = gpu_agent(tmp_path, server.url, token, host, clock=lambda: clock[0], nvml_retry_s=300.0)
    agent.run_once()
    assert agent.stats()["gpus"].startswith("none: cannot reach NVML at gpu-host-7")
    clock[0] = 100.0
    agent.run_once()
    assert host.init_calls == 1  # not before nvml_retry_s
    clock[0] = 301.0
    host.init_error = None  # the driver was installed
    agent.run_once()
    assert host.init_calls == 2 and agent.stats()["gpus"] == "nvml: 2 GPU(s)"
    assert len(server.inbox.take_gpus()) == 1
    agent.stop()


def test_nvml_off_reads_no_gpu(tmp_path: Path, central: tuple[Central, str]) -> None:
    server, token = central
    host = StandInGpuHost(two_gpus())
    agent = gpu_agent(tmp_path, server.url, token, host, nvml=False)
    agent.run_once()
    assert host.init_calls == 0 and agent.stats()["gpus"] == "off" and server.inbox.take_gpus() == []
    agent.stop()


def test_the_idle_gpu_detector_finds_the_agents_node_by_its_ip() -> None:
    clock = Clock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    detector = IdleGpuDetector(threshold_pct=5, window_s=60, clock=clock)
    gpus = two_gpus()
    gpus[0].util = 0
    readings = readings_of(NvmlCollector(hostname="gpu-host-7", nvml=StandInGpuHost(gpus)).samples())
    found = []
    for _ in range(4):
        report = AgentGpuReport(NODE[0], NODE[1], "gpu-host-7", clock.now, readings)
        signals = [s.to_signal(clock.now) for s in samples_of(report)]
        found += detector.detect([snapshot(NODE), job("job-a", {NODE: 2}), *signals])
        clock.tick(30)
    [finding] = found
    assert finding.category is Category.IDLE_GPU and finding.attrs["nodes"][0]["node_ip"] == "10.0.0.7"
    assert finding.attrs["attribution"] == "exact"


def viewer(server: Central) -> str:
    _, token = server.store.create_token(f"viewer-{datetime.now().timestamp()}", "viewer", created_by="test")
    return token


@pytest.mark.parametrize("gpus", [
    [{"gpu": 0, "uuid": "GPU-1", "model_name": "H100", "values": {"DCGM_FI_DEV_GPU_UTIL": "NaN"}}],
    [{"gpu": 0, "uuid": "GPU-1", "model_name": "H100", "values": {"../../etc": 1.0}}],
    [{"gpu": 0, "uuid": "GPU 1;rm", "model_name": "H100", "values": {}}],
    [{"gpu": -1, "uuid": "GPU-1", "model_name": "H100", "values": {}}],
    [{"gpu": 0, "uuid": "GPU-1", "model_name": "H100", "values": {f"DCGM_FI_X{i}": 1.0 for i in range(65)}}],
    [{"gpu": 0, "uuid": "GPU-1", "model_name": "H100", "values": {}, "labels": {"Hostname": "x" * 300}}],
    [{"gpu": i, "uuid": f"GPU-{i}", "model_name": "H100", "values": {}} for i in range(65)],
    [{"gpu": 0, "uuid": "GPU-1", "model_name": "H100", "values": {}, "surprise": 1}],
])
def test_hostile_gpu_readings_are_refused_and_keep_nothing(central: tuple[Central, str], gpus: Any) -> None:
    server, token = central
    body = {"node_id": "n1", "node_ip": "10.0.0.1", "gpus": gpus}
    answer = httpx.post(f"{server.url}/v1/agents/batch", json=body, headers={"authorization": f"Bearer {token}"},
                        timeout=30)
    assert answer.status_code == 422, answer.text
    assert server.inbox.take_gpus() == []


def test_labels_a_reading_may_not_set_are_dropped_and_the_node_decides_hostname_and_instance(
        central: tuple[Central, str]) -> None:
    server, token = central
    body = {"node_id": "n1", "node_ip": "fd00::7", "hostname": "gpu-9", "gpus": [
        {"gpu": 3, "uuid": "GPU-3", "model_name": "H100", "values": {"DCGM_FI_DEV_GPU_UTIL": 12.5},
         "labels": {"Hostname": "someone-else", "instance": "10.9.9.9", "pci_bus_id": "00000000:3B:00.0"}}]}
    answer = httpx.post(f"{server.url}/v1/agents/batch", json=body, headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200 and answer.json() == {"accepted": 0, "gpus": 1}
    [signal] = AgentGpuCollector(server.inbox).collect()
    labels = signal.attrs["labels"]
    assert labels["Hostname"] == "gpu-9" and labels["instance"] == "[fd00::7]" and labels["pci_bus_id"]
    assert signal.value == 12.5 and signal.observed_at > datetime.now(timezone.utc) - timedelta(minutes=1)
