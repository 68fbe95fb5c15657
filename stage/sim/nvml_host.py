"""A stand-in for the pynvml module on a host with GPUs, for hosts (and tests) without one.

`StandInGpuHost` answers the NVML calls collectors.nvml.NvmlCollector makes with the values of its `StandInGpu`s,
and raises NVML's own error classes (borrowed from the real pynvml) where a real driver would: before nvmlInit, for
a GPU that fell off the bus, for a function a GPU does not support. It is a simulator, as stage/sim/dcgm_exporter.py
is: no GPU is read. The node agent's tests and the NVML collector's tests use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

MIB = 1024 * 1024
DRIVER = "535.129.03"
MODEL = "NVIDIA H100 80GB HBM3"


@dataclass
class StandInGpu:
    index: int
    uuid: str
    bus_id: bytes
    util: int = 0
    mem_util: int = 0
    total_mib: int = 81559
    reserved_mib: int = 527
    used_mib: int = 0
    temp_c: int = 32
    power_mw: int = 70250
    sm_mhz: int = 345
    mem_mhz: int = 2619
    energy_mj: int = 123456789
    pcie_replays: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    unsupported: set[str] = field(default_factory=set)  # NVML functions this GPU answers NotSupported
    lost: bool = False  # fell off the bus: every call answers GpuIsLost
    refuses_events: bool = False
    odd_bytes: int = 0  # NVML counts bytes: this many move from used to free, off a whole MiB


@dataclass(frozen=True)
class Handle:
    index: int


class StandInGpuHost:
    """Stands in for the pynvml module on a host with GPUs: fixed values, NVML's own error classes.

    Only the calls NvmlCollector makes are here; each checks it is called after nvmlInit, as NVML does.
    """

    def __init__(self, gpus: list[StandInGpu], *, init_error: type[Exception] | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.events: list[tuple[int, int]] = []  # (gpu index, xid) queued in the event set
        self.registered: set[int] = set()
        self.event_sets_freed = 0
        self.wait_timeouts: list[int] = []

    def _gpu(self, handle: Handle, function: str) -> StandInGpu:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if function in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._gpu(handle, "nvmlDeviceGetName")
        return MODEL

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        free = (gpu.total_mib - gpu.reserved_mib - gpu.used_mib) * MIB + gpu.odd_bytes
        if version is None:  # v1: the driver's reservation counts as used
            return SimpleNamespace(total=gpu.total_mib * MIB, free=free,
                                   used=(gpu.used_mib + gpu.reserved_mib) * MIB - gpu.odd_bytes)
        assert version == pynvml.nvmlMemory_v2
        return SimpleNamespace(total=gpu.total_mib * MIB, reserved=gpu.reserved_mib * MIB, free=free,
                               used=gpu.used_mib * MIB - gpu.odd_bytes)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: gpu.sm_mhz, pynvml.NVML_CLOCK_MEM: gpu.mem_mhz}[clock]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        assert counter == pynvml.NVML_VOLATILE_ECC
        return gpu.ecc_dbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else gpu.ecc_sbe

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: str) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        if gpu.refuses_events:
            raise pynvml.NVMLError_NotSupported()
        self.registered.add(handle.index)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self.wait_timeouts.append(timeout_ms)
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        index, xid = self.events.pop(0)
        return SimpleNamespace(device=Handle(index), eventType=pynvml.nvmlEventTypeXidCriticalError,
                               eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.event_sets_freed += 1


def two_gpus() -> list[StandInGpu]:
    return [
        StandInGpu(0, "GPU-0a1b2c3d-0000-4000-8000-000000000000", b"00000000:18:00.0",
                   util=87, mem_util=41, used_mib=70123, temp_c=61, power_mw=512345, sm_mhz=1980,
                   mem_mhz=2619, pcie_replays=3, remapped=(2, 1, 1, 0), ecc_sbe=5, ecc_dbe=1),
        StandInGpu(1, "GPU-0a1b2c3d-0000-4000-8000-000000000001", b"00000000:2A:00.0"),
    ]
