"""NvmlCollector: the real NVML library on this host, a stand-in GPU host, and a real GPU where there is one.

What is real: the pynvml package (nvidia-ml-py) and, on this GPU-less machine, its real failure to load
libnvidia-ml; NVML's error classes and constants, which the stand-in borrows from pynvml; dcgm-exporter's
text format (stage.sim renders it) and collectors.dcgm's parser. What is simulated: `StandInGpuHost`
(stage/sim/nvml_host.py) stands in for a host with GPUs, answering the handful of NVML calls the collector
makes with fixed values. The last test reads a real GPU and runs only where NVML initialises.
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from collectors.dcgm import parse_dcgm_metrics
from collectors.nvml import NO_DRIVER_HINT, NvmlCollector
from core.errors import SourceUnavailable
from core.types import SignalKind, SubjectKind
from stage.sim.dcgm_exporter import SimGpu, SimNode, render_metrics
from stage.sim.nvml_host import DRIVER, MODEL, Handle, StandInGpuHost, two_gpus

AT = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def by_metric(collector: NvmlCollector, gpu: int) -> dict[str, Any]:
    return {s.attrs["metric"]: s for s in collector.collect() if s.attrs["gpu"] == gpu}


# --- the real library, no GPU ------------------------------------------------------------------------


def test_real_nvml_on_a_host_without_gpu_is_source_unavailable() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has a working NVIDIA driver; the no-driver path cannot be shown here")
    collector = NvmlCollector(hostname="worker-7")
    for _ in range(2):  # every collect says so again, and nothing is left half-started
        with pytest.raises(SourceUnavailable) as caught:
            collector.collect()
        assert caught.value.thing == "NVML"
        assert caught.value.address == "worker-7"
        assert "cannot reach NVML at worker-7" in caught.value.message
        assert caught.value.hint == NO_DRIVER_HINT
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    collector.shutdown()  # never started: nothing to release, and no error


# --- a stand-in GPU host ------------------------------------------------------------------------------


def test_names_units_and_labels_are_dcgm_exporters() -> None:
    gpus = two_gpus()
    gpus[0].odd_bytes = 4096
    host = StandInGpuHost(gpus)
    collector = NvmlCollector(hostname="gpu-node-3", nvml=host, clock=lambda: AT)
    gpu0 = by_metric(collector, 0)

    values = {name: s.value for name, s in gpu0.items()}
    assert values == {
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,
        "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_GPU_TEMP": 61.0,
        "DCGM_FI_DEV_POWER_USAGE": 512.345,  # mW -> W
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789.0,  # mJ, as NVML and DCGM both count it
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3.0,
        "DCGM_FI_DEV_GPU_UTIL": 87.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
        "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "DCGM_FI_DEV_FB_FREE": 81559.0 - 527 - 70123,  # bytes -> whole MiB, rounded down as DCGM does
        "DCGM_FI_DEV_FB_USED": 70122.0,
        "DCGM_FI_DEV_FB_RESERVED": 527.0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1.0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2.0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 5.0,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0,
    }
    util = gpu0["DCGM_FI_DEV_GPU_UTIL"]
    assert util.kind is SignalKind.METRIC and util.observed_at == AT
    assert util.source == "nvml@gpu-node-3"
    assert util.subject.kind is SubjectKind.GPU
    assert util.subject.id == "GPU-0a1b2c3d-0000-4000-8000-000000000000"
    assert util.subject.name == "gpu-node-3/gpu0"
    labels = util.attrs["labels"]
    assert list(labels.items()) == [  # dcgm-exporter's names, values and order
        ("gpu", "0"),
        ("UUID", "GPU-0a1b2c3d-0000-4000-8000-000000000000"),
        ("pci_bus_id", "00000000:18:00.0"),
        ("device", "nvidia0"),
        ("modelName", MODEL),
        ("Hostname", "gpu-node-3"),
        ("DCGM_FI_DRIVER_VERSION", DRIVER),
    ]
    assert gpu0["DCGM_FI_DEV_XID_ERRORS"].attrs["labels"]["err_code"] == "0"
    assert by_metric(collector, 1)["DCGM_FI_DEV_GPU_UTIL"].attrs["labels"]["device"] == "nvidia1"
    assert collector.last_errors == {}
    assert host.init_calls == 1  # initialised once, on the first collect only


def test_a_field_the_gpu_does_not_support_is_left_out_without_error() -> None:
    gpus = two_gpus()
    gpus[1].unsupported = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors",
                           "nvmlDeviceGetPcieReplayCounter"}
    collector = NvmlCollector(hostname="n", nvml=StandInGpuHost(gpus))
    gpu0, gpu1 = by_metric(collector, 0), by_metric(collector, 1)
    left_out = {
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    }
    assert set(gpu0) - set(gpu1) == left_out
    assert "DCGM_FI_DEV_GPU_UTIL" in gpu1 and "DCGM_FI_DEV_FB_USED" in gpu1
    assert collector.last_errors == {}


def test_memory_info_falls_back_to_v1_where_the_driver_has_no_v2() -> None:
    gpus = two_gpus()
    host = StandInGpuHost(gpus)
    v1_only = host.nvmlDeviceGetMemoryInfo

    def memory_info(handle: Handle, version: int | None = None) -> SimpleNamespace:
        if version is not None:
            raise pynvml.NVMLError_FunctionNotFound()
        return v1_only(handle)

    host.nvmlDeviceGetMemoryInfo = memory_info
    gpu0 = by_metric(NvmlCollector(hostname="n", nvml=host), 0)
    assert gpu0["DCGM_FI_DEV_FB_USED"].value == 70123 + 527  # v1 counts the reservation as used
    assert "DCGM_FI_DEV_FB_RESERVED" not in gpu0


def test_a_lost_gpu_is_reported_in_last_errors_and_the_others_still_read() -> None:
    gpus = two_gpus()
    host = StandInGpuHost(gpus)
    collector = NvmlCollector(hostname="n", nvml=host)
    collector.collect()
    gpus[1].lost = True
    signals = collector.collect()
    read = {s.attrs["gpu"] for s in signals if s.attrs["metric"] != "DCGM_FI_DEV_XID_ERRORS"}
    assert read == {0}  # GPU 1's last Xid still comes from events: a lost GPU's Xid 79 must not vanish
    assert collector.last_errors
    assert all(key.startswith("gpu1.") for key in collector.last_errors)
    assert all("GPU is lost" in text and "GPU 1" in text for text in collector.last_errors.values())
    gpus[1].lost = False  # back after a reset: reported again, errors cleared
    assert {s.attrs["gpu"] for s in collector.collect()} == {0, 1}
    assert collector.last_errors == {}


def test_xid_events_set_the_last_xid_of_their_gpu() -> None:
    host = StandInGpuHost(two_gpus())
    collector = NvmlCollector(hostname="n", nvml=host)
    assert by_metric(collector, 1)["DCGM_FI_DEV_XID_ERRORS"].value == 0
    assert host.registered == {0, 1}

    host.events += [(1, 48), (1, 79)]
    gpu0, gpu1 = by_metric(collector, 0), by_metric(collector, 1)
    assert gpu1["DCGM_FI_DEV_XID_ERRORS"].value == 79  # the last of the drained events
    assert gpu1["DCGM_FI_DEV_XID_ERRORS"].attrs["labels"]["err_code"] == "79"
    assert gpu0["DCGM_FI_DEV_XID_ERRORS"].value == 0
    assert host.events == [] and set(host.wait_timeouts) == {0}  # drained, never waiting

    assert by_metric(collector, 1)["DCGM_FI_DEV_XID_ERRORS"].value == 79  # kept, as DCGM keeps it
    host.events.append((1, 13))
    assert by_metric(collector, 1)["DCGM_FI_DEV_XID_ERRORS"].value == 13


def test_a_gpu_that_refuses_xid_events_has_no_xid_series() -> None:
    gpus = two_gpus()
    gpus[1].refuses_events = True
    collector = NvmlCollector(hostname="n", nvml=StandInGpuHost(gpus))
    assert "DCGM_FI_DEV_XID_ERRORS" in by_metric(collector, 0)
    gpu1 = by_metric(collector, 1)
    assert "DCGM_FI_DEV_XID_ERRORS" not in gpu1  # unwatched is not "no Xid"
    assert "DCGM_FI_DEV_GPU_UTIL" in gpu1


@pytest.mark.parametrize(
    ("error", "hint_part"),
    [
        (pynvml.NVMLError_LibraryNotFound, "no NVIDIA driver"),
        (pynvml.NVMLError_DriverNotLoaded, "no NVIDIA driver"),
        (pynvml.NVMLError_NoPermission, "nvidia-smi"),
    ],
)
def test_nvml_that_cannot_start_is_source_unavailable(error: type[Exception], hint_part: str) -> None:
    host = StandInGpuHost(two_gpus(), init_error=error)
    collector = NvmlCollector(hostname="gpu-node-3", nvml=host)
    with pytest.raises(SourceUnavailable) as caught:
        collector.collect()
    assert caught.value.thing == "NVML" and caught.value.address == "gpu-node-3"
    assert hint_part in (caught.value.hint or "")
    host.init_error = None  # the driver came back: the next collect starts NVML
    assert collector.collect()


def test_shutdown_releases_nvml_and_a_later_collect_starts_again() -> None:
    host = StandInGpuHost(two_gpus())
    collector = NvmlCollector(hostname="n", nvml=host)
    collector.collect()
    collector.shutdown()
    assert host.shutdown_calls == 1 and host.event_sets_freed == 1 and not host.initialised
    collector.shutdown()
    assert host.shutdown_calls == 1
    with collector:
        assert collector.collect()
        assert host.init_calls == 2
    assert host.shutdown_calls == 2


def test_samples_convert_to_signals_exactly_as_dcgm_exporter_samples_do() -> None:
    """The same GPU state, read through NVML and through dcgm-exporter's text, gives the same signals."""
    gpus = two_gpus()
    nvml_signals = NvmlCollector(hostname="gpu-node-3", nvml=StandInGpuHost(gpus), clock=lambda: AT).collect()

    sim_gpus = [
        SimGpu(index=g.index, uuid=g.uuid, pci_bus_id=g.bus_id.decode(), model_name=MODEL,
               fb_total_mib=g.total_mib, fb_reserved_mib=g.reserved_mib, util=g.util,
               mem_copy_util=g.mem_util, fb_used_mib=g.used_mib, temp_c=g.temp_c, power_w=g.power_mw / 1000,
               sm_clock_mhz=g.sm_mhz, mem_clock_mhz=g.mem_mhz, pcie_replays=g.pcie_replays,
               energy_mj=g.energy_mj, correctable_remapped_rows=g.remapped[0],
               uncorrectable_remapped_rows=g.remapped[1], row_remap_failure=g.remapped[3])
        for g in gpus
    ]
    text = render_metrics(SimNode(hostname="gpu-node-3", gpus=sim_gpus), driver_version=DRIVER)
    dcgm_signals = [s.to_signal(AT) for s in parse_dcgm_metrics(text, source="nvml@gpu-node-3")]

    def comparable(signals: list[Any]) -> dict[tuple[str, int], Any]:
        out = {}
        for s in signals:
            data = s.model_dump()
            data["attrs"]["labels"].pop("err_msg", None)  # the label NVML cannot fill (collectors/nvml.py)
            out[(s.attrs["metric"], s.attrs["gpu"])] = data
        return out

    from_nvml, from_dcgm = comparable(nvml_signals), comparable(dcgm_signals)
    common = set(from_nvml) & set(from_dcgm)
    assert {metric for metric, _ in common} == {  # every default counter NVML can read
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    }
    assert len(common) == 2 * 15
    for key in sorted(common):
        assert from_nvml[key] == from_dcgm[key], key


# --- a real GPU ---------------------------------------------------------------------------------------


def test_real_gpus_report_utilisation_and_memory() -> None:
    """Runs only where NVML starts (a host with an NVIDIA driver and GPU); reads the real GPUs."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVIDIA GPU here (nvmlInit: {exc})")
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML starts but sees no GPU")
    with NvmlCollector() as collector:
        signals = collector.collect()
        signals += collector.collect()  # a second collect drains events and reads again
    for index in range(count):
        metrics = {s.attrs["metric"]: s for s in signals if s.attrs["gpu"] == index}
        assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"} <= set(metrics), index
        util = metrics["DCGM_FI_DEV_GPU_UTIL"]
        assert 0 <= util.value <= 100
        assert metrics["DCGM_FI_DEV_FB_USED"].value >= 0
        assert util.subject.id.startswith(("GPU-", "MIG-"))
        assert util.attrs["labels"]["pci_bus_id"].count(":") == 2
    assert collector.last_errors == {}, collector.last_errors
