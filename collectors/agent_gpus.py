"""GPU readings node agents take through NVML on their own nodes (argus/agents), as dcgm-exporter's METRIC signals.

On a GPU node without dcgm-exporter, the node's agent reads its GPUs with collectors.nvml.NvmlCollector (the
names, units and labels are dcgm-exporter's) and sends the latest reading of each GPU with its next batch, one
object per GPU (`reading_json`). The central keeps only each node's newest report (a reading is a state, not an
event: a newer one replaces one not yet read, and an Xid stays in DCGM_FI_DEV_XID_ERRORS until the agent
restarts, as dcgm-exporter's gauge keeps it) and `AgentGpuCollector` turns it into the signals a Prometheus or
direct scrape of dcgm-exporter would give, so the detectors cannot tell the paths apart:
- the Hostname label is the node's own hostname, as dcgm-exporter writes it;
- the instance label is the node's Ray IP, as when Prometheus scrapes an exporter on the node, so the idle-GPU
  detector's "instance" match finds the node;
- observed_at is when the central received the report (no trust in the node's clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from collectors.dcgm import GpuSample
from collectors.nvml import XID_METRIC
from core.types import Signal

PER_GPU_LABELS = ("pci_bus_id", "device", "DCGM_FI_DRIVER_VERSION")  # what dcgm-exporter puts on every series


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values from one NVML read: DCGM field name -> value."""

    gpu: int
    uuid: str
    model_name: str
    values: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentGpuReport:
    """A node's newest GPU readings, as the central received them."""

    node_id: str
    node_ip: str
    hostname: str
    received_at: datetime
    gpus: list[GpuReading]


class GpuFeed(Protocol):
    """The GPU reports node agents sent since the last poll (argus.agents.inbox.AgentInbox)."""

    def take_gpus(self) -> list[AgentGpuReport]: ...


def readings_of(samples: Iterable[GpuSample]) -> list[GpuReading]:
    """An NVML collect's samples, one reading per GPU (the agent's side)."""
    by_gpu: dict[int, GpuReading] = {}
    for sample in samples:
        reading = by_gpu.get(sample.gpu)
        if reading is None:
            labels = {k: str(sample.labels[k]) for k in PER_GPU_LABELS if k in sample.labels}
            reading = by_gpu[sample.gpu] = GpuReading(sample.gpu, sample.uuid, sample.model_name, {}, labels)
        reading.values[sample.metric] = sample.value
    return [by_gpu[index] for index in sorted(by_gpu)]


def reading_json(reading: GpuReading) -> dict[str, Any]:
    """A reading as the batch route takes it (argus/api/agents.py)."""
    return {"gpu": reading.gpu, "uuid": reading.uuid, "model_name": reading.model_name,
            "values": reading.values, "labels": reading.labels}


def instance_of(node_ip: str) -> str:
    """The instance label of an exporter scraped at this IP (an IPv6 address in brackets, as Prometheus writes it)."""
    return f"[{node_ip}]" if ":" in node_ip else node_ip


class AgentGpuCollector:
    """METRIC signals from the GPU readings node agents sent; implements core.ports.Collector."""

    name = "agent_gpus"

    def __init__(self, feed: GpuFeed) -> None:
        self.feed = feed

    def collect(self) -> list[Signal]:
        signals: list[Signal] = []
        for report in self.feed.take_gpus():
            signals += [sample.to_signal(report.received_at) for sample in samples_of(report)]
        return signals


def samples_of(report: AgentGpuReport) -> list[GpuSample]:
    """A report's values as the samples a scrape of dcgm-exporter on that node would give (non-finite values left
    out: the route refuses them, and a caller building reports by hand gets the same)."""
    source = f"agent://{report.node_ip}/nvml"
    samples: list[GpuSample] = []
    for reading in report.gpus:
        labels = {**reading.labels, "gpu": str(reading.gpu), "UUID": reading.uuid, "modelName": reading.model_name,
                  "Hostname": report.hostname, "instance": instance_of(report.node_ip)}
        for metric, value in reading.values.items():
            if not math.isfinite(value):
                continue
            extra = {"err_code": str(int(value))} if metric == XID_METRIC else {}
            samples.append(GpuSample(hostname=report.hostname, gpu=reading.gpu, uuid=reading.uuid,
                                     model_name=reading.model_name, metric=metric, value=float(value),
                                     labels={**labels, **extra}, source=source))
    return samples
