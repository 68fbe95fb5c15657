"""Reads the GPUs of this host through NVML and reports them as dcgm-exporter would.

For hosts with a GPU but no dcgm-exporter: the metric names, units and labels (gpu, UUID, pci_bus_id,
device, modelName, Hostname, DCGM_FI_DRIVER_VERSION) are dcgm-exporter's, and the samples are the same
`GpuSample`s collectors/dcgm.py builds, so every detector that reads DCGM signals reads these unchanged.

NVML call -> DCGM field (units as dcgm-exporter writes them):
- nvmlDeviceGetClockInfo SM/MEM -> DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK (MHz)
- nvmlDeviceGetTemperature GPU -> DCGM_FI_DEV_GPU_TEMP (C)
- nvmlDeviceGetPowerUsage (mW) -> DCGM_FI_DEV_POWER_USAGE (W)
- nvmlDeviceGetTotalEnergyConsumption -> DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since the driver loaded)
- nvmlDeviceGetPcieReplayCounter -> DCGM_FI_DEV_PCIE_REPLAY_COUNTER
- nvmlDeviceGetUtilizationRates -> DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL (%)
- nvmlDeviceGetMemoryInfo (bytes; v2 where the driver has it) -> DCGM_FI_DEV_FB_FREE, _FB_USED,
  _FB_RESERVED (MiB)
- nvmlDeviceGetRemappedRows -> DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, _UNCORRECTABLE_REMAPPED_ROWS,
  DCGM_FI_DEV_ROW_REMAP_FAILURE, DCGM_FI_DEV_ROW_REMAP_PENDING
- nvmlDeviceGetTotalEccErrors volatile -> DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
- Xid events -> DCGM_FI_DEV_XID_ERRORS (the last Xid, 0 for none, with an err_code label)

A field a GPU does not support (NVMLError_NotSupported, e.g. row remapping before Ampere, ECC with ECC
off) is left out, as dcgm-exporter leaves it blank. Any other failure of one field or one GPU (a GPU that
fell off the bus answers NVMLError_GpuIsLost) is logged once and kept in `last_errors`, and the other
GPUs are still reported. No NVML on the host (no driver, library not found) is SourceUnavailable.

Xid coverage. NVML has no "last Xid" getter, so the collector registers every GPU for
nvmlEventTypeXidCriticalError on its first collect and drains the queued events, without waiting, on
every collect. Covered: every Xid NVML delivers as an event from that first collect on, attributed to
its GPU by UUID; the last one stays until the collector restarts (as dcgm-exporter's gauge keeps its
last value). Not covered: Xids from before the first collect or while Argus was down (the kernel log
has them: the Xid log rules read `NVRM: Xid` lines), the err_msg label (detectors/xid.py names codes),
and GPUs whose registration the driver refuses (some vGPU and MIG setups): those GPUs get no
DCGM_FI_DEV_XID_ERRORS series at all, so a missing series means "not watched", never "no Xid".
Also not read: DCGM_FI_PROF_* (profiling counters need DCGM), DCGM_FI_DEV_MEMORY_TEMP, encoder/decoder
utilisation, NVLink counters, and per-MIG-instance series.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import ModuleType
from typing import Any

import pynvml
from loguru import logger

from collectors.dcgm import GpuSample
from core.errors import SourceUnavailable
from core.types import Signal, utcnow

NO_DRIVER_HINT = "no NVIDIA driver on this host: run dcgm-exporter or leave NVML off"
_OTHER_HINT = "check that `nvidia-smi` works on this host and that Argus's user may open /dev/nvidia*"
_MIB = 1024 * 1024
_MAX_EVENTS_PER_COLLECT = 4096  # a GPU spewing Xids must not keep one collect busy forever
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model_name: str
    labels: dict[str, str]


class NvmlCollector:
    """Per-GPU DCGM-named METRIC signals read through NVML on this host; implements core.ports.Collector.

    NVML is initialised on the first `collect()`; `shutdown()` releases it (a later collect starts again).
    `nvml` is the pynvml module (nvidia-ml-py), or a module with the same functions for a host without GPUs.
    """

    name = "nvml"

    def __init__(
        self,
        *,
        hostname: str | None = None,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.hostname = hostname or socket.gethostname()
        self.source = f"nvml@{self.hostname}"
        self._nv = nvml if nvml is not None else pynvml
        self._clock = clock
        self._started = False
        self._driver_version = ""
        self._count = 0
        self._gpus: dict[int, _Gpu] = {}
        self._event_set: Any = None
        self._xid_watched: set[int] = set()
        self._last_xid: dict[int, int] = {}
        self._reported: set[str] = set()  # failures already logged, so a broken field warns once
        self.last_errors: dict[str, str] = {}

    def collect(self) -> list[Signal]:
        observed_at = self._clock()
        return [s.to_signal(observed_at) for s in self.samples()]

    def samples(self) -> list[GpuSample]:
        """One collect's samples; SourceUnavailable naming NVML if NVML cannot be used on this host."""
        if not self._started:
            self._start()
        self.last_errors = {}
        for index in range(self._count):
            if index not in self._gpus:
                self._identify(index)
        self._drain_xid_events()
        samples: list[GpuSample] = []
        for gpu in self._gpus.values():
            samples.extend(self._read_gpu(gpu))
        return samples

    @property
    def xid_watched(self) -> frozenset[int]:
        """The indices of the GPUs whose Xid events NVML delivers to this collector."""
        return frozenset(self._xid_watched)

    def shutdown(self) -> None:
        if not self._started:
            return
        nv = self._nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            logger.warning("NVML shutdown on {} failed: {}", self.hostname, exc)
        self._started = False
        self._event_set = None
        self._gpus.clear()
        self._xid_watched.clear()
        self._last_xid.clear()

    def __enter__(self) -> NvmlCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- starting -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise self._unavailable(exc) from None
        try:
            self._count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass  # the count already failed; that is the error worth reporting
            raise self._unavailable(exc) from None
        self._started = True
        version = self._optional(lambda: _text(nv.nvmlSystemGetDriverVersion()), "driver version")
        self._driver_version = version or ""
        self._event_set = self._create_event_set()
        logger.info("NVML on {}: {} GPU(s), driver {}", self.hostname, self._count,
                    self._driver_version or "?")

    def _unavailable(self, exc: Exception) -> SourceUnavailable:
        nv = self._nv
        missing = (nv.NVMLError_LibraryNotFound, nv.NVMLError_DriverNotLoaded)
        hint = NO_DRIVER_HINT if isinstance(exc, missing) else _OTHER_HINT
        return SourceUnavailable("NVML", self.hostname, str(exc) or type(exc).__name__, hint=hint)

    def _create_event_set(self) -> Any:
        nv = self._nv
        if not hasattr(nv, "nvmlEventSetCreate") or not hasattr(nv, "nvmlEventTypeXidCriticalError"):
            logger.warning("this pynvml has no event API: Xids on {} are not watched", self.hostname)
            return None
        try:
            return nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            logger.warning("NVML cannot create an event set on {} ({}): Xids are not watched",
                           self.hostname, exc)
            return None

    def _identify(self, index: int) -> None:
        nv = self._nv
        key = f"gpu{index}"
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            model_name = _text(nv.nvmlDeviceGetName(handle))
            bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
        except nv.NVMLError as exc:
            self._fail(key, f"GPU {index} on {self.hostname} cannot be identified: {exc}")
            return
        labels = {
            "gpu": str(index),
            "UUID": uuid,
            "pci_bus_id": bus_id,
            "device": f"nvidia{index}",
            "modelName": model_name,
            "Hostname": self.hostname,
        }
        if self._driver_version:
            labels["DCGM_FI_DRIVER_VERSION"] = self._driver_version
        gpu = _Gpu(index=index, handle=handle, uuid=uuid, model_name=model_name, labels=labels)
        self._gpus[index] = gpu
        self._watch_xids(gpu)

    def _watch_xids(self, gpu: _Gpu) -> None:
        nv = self._nv
        if self._event_set is None:
            return
        try:
            nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
        except nv.NVMLError as exc:
            logger.warning("GPU {} on {} refuses Xid events ({}): its Xids are not watched through NVML",
                           gpu.index, self.hostname, exc)
            return
        self._xid_watched.add(gpu.index)

    # -- reading ------------------------------------------------------------------------------------------

    def _drain_xid_events(self) -> None:
        nv = self._nv
        if self._event_set is None or not self._xid_watched:
            return
        by_uuid = {g.uuid: g.index for g in self._gpus.values()}
        for _ in range(_MAX_EVENTS_PER_COLLECT):
            try:
                event = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError_Timeout:
                return  # the queue is empty
            except nv.NVMLError as exc:
                self._fail("xid_events", f"reading NVML Xid events on {self.hostname} failed: {exc}")
                return
            if not int(event.eventType) & nv.nvmlEventTypeXidCriticalError:
                continue
            code = int(event.eventData)
            try:
                index = by_uuid.get(_text(nv.nvmlDeviceGetUUID(event.device)))
            except nv.NVMLError:
                index = None
            if index is None:
                self._fail("xid_events", f"Xid {code} on {self.hostname} came from a GPU NVML cannot name")
                continue
            logger.warning("GPU {} on {} reported Xid {}", index, self.hostname, code)
            self._last_xid[index] = code

    def _read_gpu(self, gpu: _Gpu) -> list[GpuSample]:
        nv = self._nv
        h = gpu.handle
        values: list[tuple[str, float, dict[str, str]]] = []

        def read(what: str, fn: Callable[[], Any]) -> Any:
            return self._optional(fn, what, gpu)

        def put(metric: str, value: float | None, extra: dict[str, str] | None = None) -> None:
            if value is not None:
                values.append((metric, float(value), extra or {}))

        sensor = nv.NVML_TEMPERATURE_GPU
        sm, mem = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM
        put("DCGM_FI_DEV_SM_CLOCK", read("SM clock", lambda: nv.nvmlDeviceGetClockInfo(h, sm)))
        put("DCGM_FI_DEV_MEM_CLOCK", read("memory clock", lambda: nv.nvmlDeviceGetClockInfo(h, mem)))
        put("DCGM_FI_DEV_GPU_TEMP", read("temperature", lambda: nv.nvmlDeviceGetTemperature(h, sensor)))
        power_mw = read("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        put("DCGM_FI_DEV_POWER_USAGE", None if power_mw is None else power_mw / 1000.0)
        energy_mj = read("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        put("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy_mj)
        replays = read("PCIe replays", lambda: nv.nvmlDeviceGetPcieReplayCounter(h))
        put("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", replays)
        util = read("utilisation", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            put("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            put("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        if gpu.index in self._xid_watched:
            code = self._last_xid.get(gpu.index, 0)
            put(XID_METRIC, code, {"err_code": str(code)})
        memory = read("memory", lambda: self._memory_info(h))
        if memory is not None:
            put("DCGM_FI_DEV_FB_FREE", memory.free // _MIB)
            put("DCGM_FI_DEV_FB_USED", memory.used // _MIB)
            reserved = getattr(memory, "reserved", None)
            put("DCGM_FI_DEV_FB_RESERVED", None if reserved is None else reserved // _MIB)
        rows = read("remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            correctable, uncorrectable, pending, failure = rows
            put("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", uncorrectable)
            put("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", correctable)
            put("DCGM_FI_DEV_ROW_REMAP_FAILURE", failure)
            put("DCGM_FI_DEV_ROW_REMAP_PENDING", pending)
        volatile = nv.NVML_VOLATILE_ECC
        for metric, kind, what in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected ECC"),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected ECC"),
        ):
            count = read(what, partial(nv.nvmlDeviceGetTotalEccErrors, h, kind, volatile))
            put(metric, count)

        return [
            GpuSample(
                hostname=self.hostname,
                gpu=gpu.index,
                uuid=gpu.uuid,
                model_name=gpu.model_name,
                metric=metric,
                value=value,
                labels={**gpu.labels, **extra},
                source=self.source,
            )
            for metric, value, extra in values
        ]

    def _memory_info(self, handle: Any) -> Any:
        # v2 splits the driver's reservation out of "used", as DCGM does; old drivers only have v1.
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (nv.NVMLError_FunctionNotFound, nv.NVMLError_NotSupported,
                    nv.NVMLError_ArgumentVersionMismatch):
                pass
        return nv.nvmlDeviceGetMemoryInfo(handle)

    def _optional(self, fn: Callable[[], Any], what: str, gpu: _Gpu | None = None) -> Any:
        """fn()'s value; None if the GPU does not support it, or (logged once, kept) if it failed."""
        nv = self._nv
        try:
            return fn()
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError as exc:
            where = f"GPU {gpu.index} ({gpu.uuid})" if gpu else "NVML"
            key = f"gpu{gpu.index}.{what}" if gpu else what
            self._fail(key, f"{where} on {self.hostname}: {what}: {exc}")
            return None

    def _fail(self, key: str, message: str) -> None:
        self.last_errors[key] = message
        if message not in self._reported:
            self._reported.add(message)
            logger.warning("{}", message)


def _text(value: str | bytes) -> str:
    # pynvml returns str on Python 3 for most getters, bytes for raw struct fields such as busId.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
