"""The dcgm-exporter simulator: real HTTP on loopback, format checked against a real exporter's output."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.errors import ConfigError, InputError, NotFound
from stage.sim.dcgm_exporter import MAX_BODY_BYTES, DcgmExporterSim, stable_gpu_uuid

REPO = Path(__file__).resolve().parents[3]
REAL_SAMPLE = REPO / "tests" / "fixtures" / "dcgm" / "real_exporter_sample.txt"

# dcgm-exporter's etc/default-counters.csv (uncommented lines), written out here independently of the
# simulator's own table so a drift in either shows up.
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
}
# The labels every GPU line carries, in the order dcgm-exporter writes them.
BASE_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
# Labels inserted by MIG (between modelName and Hostname) are not part of the base order.
MIG_LABELS = {"GPU_I_PROFILE", "GPU_I_ID"}

SAMPLE_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scrape(sim: DcgmExporterSim) -> str:
    response = httpx.get(sim.metrics_url, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def values(text: str, metric: str) -> dict[int, tuple[float, dict[str, str]]]:
    """{gpu index: (value, labels)} for one metric, read with prometheus_client's parser."""
    out: dict[int, tuple[float, dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            out[int(sample.labels["gpu"])] = (sample.value, sample.labels)
    return out


def sample_lines(text: str) -> list[re.Match[str]]:
    matches = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE_LINE.match(line)
            assert match is not None, f"line is not name{{labels}} value: {line!r}"
            matches.append(match)
    return matches


@pytest.fixture
def sim():
    with DcgmExporterSim("node-a", gpus=4) as s:
        yield s


def test_served_text_parses_and_has_every_default_counter_with_its_type_and_help(sim):
    families = {f.name: f for f in text_string_to_metric_families(scrape(sim))}
    assert set(families) == set(DEFAULT_COUNTERS)
    for name, (prom_type, help_text) in DEFAULT_COUNTERS.items():
        assert families[name].type == prom_type, name
        assert families[name].documentation == help_text, name
        assert sorted(int(s.labels["gpu"]) for s in families[name].samples) == [0, 1, 2, 3]


def test_families_come_in_the_order_of_default_counters_csv(sim):
    helps = [line.split()[2] for line in scrape(sim).splitlines() if line.startswith("# HELP ")]
    assert helps == list(DEFAULT_COUNTERS)


def test_line_shapes_match_a_real_dcgm_exporter_sample(sim):
    sim.set_gpu(1, xid=79, hpc_jobs=["raysubmit_abc"])
    real_text = REAL_SAMPLE.read_text()
    real, ours = sample_lines(real_text), sample_lines(scrape(sim))
    assert real and ours
    for match in real + ours:
        names = [k for k, _ in LABEL.findall(match["labels"])]
        base = [k for k in names if k in BASE_LABELS]
        assert base == BASE_LABELS, match.group(0)
        # Whatever follows the driver version (k8s pod labels, err_code/err_msg, hpc_job) is sorted by name.
        extras = names[names.index("DCGM_FI_DRIVER_VERSION") + 1 :]
        assert extras == sorted(extras), match.group(0)
        # MIG labels are the only ones allowed between modelName and Hostname.
        middle = names[names.index("modelName") + 1 : names.index("Hostname")]
        assert set(middle) <= MIG_LABELS, match.group(0)
    # Same value formatting as the real exporter: %f for the DCP ratios, integers for temperatures.
    for source in (real, ours):
        by_name = {m["name"]: m["value"] for m in source}
        assert re.fullmatch(r"\d+\.\d{6}", by_name["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
        assert re.fullmatch(r"\d+", by_name["DCGM_FI_DEV_MEMORY_TEMP"])
    # The HELP line the real exporter wrote is the one we write.
    real_help = next(line for line in real_text.splitlines() if line.startswith("# HELP"))
    assert real_help in scrape(sim).splitlines()


def test_labels_identify_the_gpu_like_the_real_exporter(sim):
    text = scrape(sim)
    util = values(text, "DCGM_FI_DEV_GPU_UTIL")
    _, labels = util[2]
    assert labels["UUID"] == stable_gpu_uuid("node-a", 2)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", labels["UUID"])
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9]", labels["pci_bus_id"])
    assert labels["device"] == "nvidia2"
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["Hostname"] == "node-a"
    assert len({lab["UUID"] for _, lab in util.values()}) == 4


def test_uuid_is_stable_per_host_and_index():
    assert stable_gpu_uuid("node-a", 0) == stable_gpu_uuid("node-a", 0)
    assert stable_gpu_uuid("node-a", 0) != stable_gpu_uuid("node-b", 0)
    assert stable_gpu_uuid("node-a", 0) != stable_gpu_uuid("node-a", 1)


def test_set_gpu_in_process_changes_served_values(sim):
    sim.set_gpu(3, util=97, fb_used_mib=70000, temp_c=84, power_w=612.5, xid=79)
    text = scrape(sim)
    assert values(text, "DCGM_FI_DEV_GPU_UTIL")[3][0] == 97
    assert values(text, "DCGM_FI_DEV_GPU_UTIL")[0][0] == 0
    assert values(text, "DCGM_FI_DEV_FB_USED")[3][0] == 70000
    assert values(text, "DCGM_FI_DEV_FB_FREE")[3][0] == 81559 - 70000
    assert values(text, "DCGM_FI_DEV_GPU_TEMP")[3][0] == 84
    assert values(text, "DCGM_FI_DEV_POWER_USAGE")[3][0] == 612.5
    xid_value, xid_labels = values(text, "DCGM_FI_DEV_XID_ERRORS")[3]
    assert xid_value == 79
    assert xid_labels["err_code"] == "79"
    assert xid_labels["err_msg"] == "GPU has fallen off the bus"
    assert values(text, "DCGM_FI_DEV_XID_ERRORS")[0][1]["err_msg"] == "No Error"


def test_set_all_changes_every_gpu(sim):
    sim.set_all(util=55, tensor_active=0.42)
    text = scrape(sim)
    assert {v for v, _ in values(text, "DCGM_FI_DEV_GPU_UTIL").values()} == {55}
    assert {v for v, _ in values(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE").values()} == {0.42}


def test_setting_over_http_changes_served_values(sim):
    one = httpx.post(f"{sim.url}/sim/gpus/1", json={"util": 88, "xid": 48}, timeout=30)
    assert one.status_code == 200, one.text
    assert one.json()["util"] == 88
    every = httpx.post(f"{sim.url}/sim/gpus", json={"temp_c": 71}, timeout=30)
    assert every.status_code == 200, every.text
    text = scrape(sim)
    assert values(text, "DCGM_FI_DEV_GPU_UTIL")[1][0] == 88
    assert values(text, "DCGM_FI_DEV_XID_ERRORS")[1][1]["err_msg"] == "Double Bit ECC Error"
    assert {v for v, _ in values(text, "DCGM_FI_DEV_GPU_TEMP").values()} == {71}
    state = httpx.get(f"{sim.url}/sim/gpus", timeout=30).json()
    assert state["hostname"] == "node-a"
    assert [g["util"] for g in state["gpus"]] == [0, 88, 0, 0]
    assert httpx.get(f"{sim.url}/sim/gpus/1", timeout=30).json()["xid"] == 48


def test_hpc_jobs_repeat_each_line_with_an_hpc_job_label(sim):
    sim.set_gpu(0, hpc_jobs=["raysubmit_1", "raysubmit_2"])
    lines = [
        m
        for m in sample_lines(scrape(sim))
        if m["name"] == "DCGM_FI_DEV_GPU_UTIL" and 'gpu="0"' in m["labels"]
    ]
    assert sorted(dict(LABEL.findall(m["labels"]))["hpc_job"] for m in lines) == [
        "raysubmit_1",
        "raysubmit_2",
    ]
    sim.set_gpu(0, hpc_jobs=[])
    assert "hpc_job" not in scrape(sim)


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"utilization": 5}, "unknown field 'utilization'"),
        ({"index": 3}, "unknown field 'index'"),
        ({"util": "5"}, "field 'util'"),
        ({"util": True}, "field 'util'"),
        ({"util": 50.5}, "field 'util'"),
        ({"util": 101}, "less than or equal to 100"),
        ({"util": -1}, "greater than or equal to 0"),
        ({"xid": -3}, "field 'xid'"),
        ({"tensor_active": 1.5}, "field 'tensor_active'"),
        ({"hpc_jobs": ['a"b']}, "hpc_jobs"),
        ({"fb_used_mib": 90000}, "fb_used_mib=90000"),
    ],
)
def test_invalid_updates_are_refused_in_process_and_over_http(sim, fields, needle):
    with pytest.raises(InputError) as info:
        sim.set_gpu(0, **fields)
    assert needle in str(info.value)
    response = httpx.post(f"{sim.url}/sim/gpus/0", json=fields, timeout=30)
    assert response.status_code == 422
    assert needle in response.json()["error"]
    assert response.json()["hint"]


def test_rejected_set_all_changes_nothing(sim):
    sim.set_gpu(2, pcie_replays=5)
    with pytest.raises(InputError, match="cannot go down"):
        sim.set_all(util=90, pcie_replays=1)
    assert [g["util"] for g in sim.state()["gpus"]] == [0, 0, 0, 0]


def test_http_refuses_bad_bodies_and_paths(sim):
    base = f"{sim.url}/sim/gpus"
    not_json = httpx.post(f"{base}/0", content=b"util=5", timeout=30)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]
    a_list = httpx.post(f"{base}/0", json=[1, 2], timeout=30)
    assert a_list.status_code == 400 and "JSON object" in a_list.json()["error"]
    huge = httpx.post(f"{base}/0", content=b"{" + b" " * MAX_BODY_BYTES + b"}", timeout=30)
    assert huge.status_code == 413 and "limit" in huge.json()["error"]
    no_gpu = httpx.post(f"{base}/9", json={"util": 1}, timeout=30)
    assert no_gpu.status_code == 404 and "GPU 9" in no_gpu.json()["error"]
    not_index = httpx.post(f"{base}/abc", json={"util": 1}, timeout=30)
    assert not_index.status_code == 404
    assert httpx.get(f"{sim.url}/nope", timeout=30).status_code == 404
    assert httpx.put(f"{base}/0", json={}, timeout=30).status_code == 405
    # The server is still healthy after all that.
    assert httpx.get(f"{sim.url}/health", timeout=30).text == "OK"


def test_unknown_gpu_in_process_is_not_found(sim):
    with pytest.raises(NotFound, match="GPU 4"):
        sim.set_gpu(4, util=1)


def test_energy_and_nvlink_counters_grow_with_time_and_never_go_down():
    clock = FakeClock()
    with DcgmExporterSim("node-c", gpus=2, clock=clock) as s:
        s.set_gpu(0, power_w=300.0, nvlink_bytes_per_s=1000)
        first = values(scrape(s), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        clock.t += 10
        second = values(scrape(s), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        assert second[0][0] - first[0][0] == 300.0 * 10 * 1000  # W * s = J; the field is in mJ
        assert second[1][0] - first[1][0] == 70.0 * 10 * 1000  # the idle default power
        clock.t -= 100  # wall clocks step back; counters must not
        third = scrape(s)
        assert values(third, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[0][0] == second[0][0]
        assert values(third, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")[0][0] == 10_000
        s.set_gpu(0, pcie_replays=3)
        with pytest.raises(InputError, match="cannot go down"):
            s.set_gpu(0, pcie_replays=2)
        assert values(scrape(s), "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")[0][0] == 3


def test_jitter_is_deterministic_under_a_seed():
    texts = []
    for seed in (7, 7, 8):
        with DcgmExporterSim("node-j", gpus=8, clock=FakeClock(), jitter=True, seed=seed) as s:
            texts.append(scrape(s))
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]
    temps = values(texts[0], "DCGM_FI_DEV_GPU_TEMP")
    assert all(abs(v - 32) <= 1 for v, _ in temps.values())


def test_lowercase_hostname_label_of_newer_exporters():
    with DcgmExporterSim("node-l", gpus=1, hostname_label="hostname") as s:
        labels = values(scrape(s), "DCGM_FI_DEV_GPU_UTIL")[0][1]
    assert labels["hostname"] == "node-l" and "Hostname" not in labels


def test_constructor_refuses_bad_settings():
    with pytest.raises(ConfigError, match="gpus=0"):
        DcgmExporterSim("n", gpus=0)
    with pytest.raises(ConfigError, match="hostname"):
        DcgmExporterSim('bad"host')
    with pytest.raises(ConfigError, match="hostname_label"):
        DcgmExporterSim("n", hostname_label="host")


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}") as info:
            DcgmExporterSim("n", gpus=1, port=port).start()
    assert info.value.hint


def test_cli_serves_until_sigint_and_exits_cleanly():
    # `argus-stage dcgm-sim`, as the console script runs it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "stage.cli", "dcgm-sim", "--hostname", "cli-node", "--gpus", "2", "--port", "0"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a test run started in the background (`pytest &`) ignores SIGINT, and a child
        # inherits that, so Ctrl-C would never reach it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = proc.stdout.readline()
        match = re.search(r"(http://\S+/metrics)", first)
        assert match, f"no URL in {first!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        response = httpx.get(match[1], timeout=30)
        assert response.status_code == 200
        assert values(response.text, "DCGM_FI_DEV_GPU_UTIL")[1][1]["Hostname"] == "cli-node"
        post = httpx.post(
            match[1].replace("/metrics", "/sim/gpus/0"), content=json.dumps({"util": 12}), timeout=30
        )
        assert post.status_code == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "stopped" in out
