"""GPU and node metrics around an incident, from Prometheus, summarised per node (a bundle carries a few
numbers per series, not the series).

Which nodes: the incident's own node IP, else the nodes `argus_job_gpus{submission_id=...}` placed the
job's GPUs on at the time. DCGM series are matched by the exporter's `instance` (`<ip>:<port>`), Ray's
node series by their `ip` label. Per node: GPU utilisation (mean over its GPUs), framebuffer used,
temperature and power (max), the last Xid, and host memory used against total.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from core.types import Incident, SubjectKind, utcnow
from rca.evidence import MetricSummary

if TYPE_CHECKING:
    from collectors.prometheus import PrometheusClient

_IP = re.compile(r"^[0-9A-Fa-f:.]{2,45}$")
MAX_NODES = 8

# (name in the bundle, unit, PromQL with {ip} and {re_ip})
QUERIES: tuple[tuple[str, str, str], ...] = (
    ("gpu_util_mean", "%", 'avg by (instance) (DCGM_FI_DEV_GPU_UTIL{{instance=~"{re_ip}:.*"}})'),
    ("gpu_fb_used_max", "MiB", 'max by (instance) (DCGM_FI_DEV_FB_USED{{instance=~"{re_ip}:.*"}})'),
    ("gpu_temp_max", "C", 'max by (instance) (DCGM_FI_DEV_GPU_TEMP{{instance=~"{re_ip}:.*"}})'),
    ("gpu_power_max", "W", 'max by (instance) (DCGM_FI_DEV_POWER_USAGE{{instance=~"{re_ip}:.*"}})'),
    ("gpu_last_xid", "", 'max by (instance) (DCGM_FI_DEV_XID_ERRORS{{instance=~"{re_ip}:.*"}})'),
    ("host_mem_used_ratio", "", 'max(ray_node_mem_used{{ip="{ip}"}}) / max(ray_node_mem_total{{ip="{ip}"}})'),
)


# A straggler suspect (steps slowing down, detectors/training_health.py StepSlowdown): each of the job's GPUs is
# compared with the job's others over the same window, and one that stands out is named. (name, unit, DCGM field,
# which way is bad, the share of the job's median past which it stands out)
STRAGGLER_REASONS = frozenset({"StepSlowdown"})
GPU_READINGS: tuple[tuple[str, str, str, str, float], ...] = (
    ("sm_clock", "MHz", "DCGM_FI_DEV_SM_CLOCK", "low", 0.8),  # a throttled GPU runs its SMs slower
    ("gpu_util", "%", "DCGM_FI_DEV_GPU_UTIL", "low", 0.7),
    ("power", "W", "DCGM_FI_DEV_POWER_USAGE", "low", 0.7),
    ("temp", "C", "DCGM_FI_DEV_GPU_TEMP", "high", 1.15),
)
MIN_GPUS_COMPARED = 3  # with fewer there is no "the others" to stand out from


class PrometheusMetricsReader:
    """A MetricsReader (see rca/evidence.py) over a PrometheusClient."""

    def __init__(self, client: PrometheusClient, *, before_s: float = 900, after_s: float = 120, step_s: float = 15,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.client = client
        self.before = timedelta(seconds=before_s)
        self.after = timedelta(seconds=after_s)
        self.step_s = step_s
        self.clock = clock

    def __call__(self, incident: Incident) -> list[MetricSummary]:
        at = incident.first_seen
        start, end = at - self.before, min(self.clock(), at + self.after)
        summaries: list[MetricSummary] = []
        for ip in self.node_ips(incident):
            for name, unit, template in QUERIES:
                # A regex inside a PromQL string: its backslashes are escaped once more for the string.
                promql = template.format(ip=ip, re_ip=re.escape(ip).replace("\\", "\\\\"))
                for series in self.client.query_range(promql, start, end, self.step_s):
                    summary = _summarise(name, unit, {"node_ip": ip, **series.get("metric", {})}, series)
                    if summary is not None:
                        summaries.append(summary)
        if incident.reason in STRAGGLER_REASONS:
            summaries += self.stragglers(self.node_ips(incident), start, end)
        return summaries

    def stragglers(self, ips: list[str], start: datetime, end: datetime) -> list[MetricSummary]:
        """The job's GPUs (on `ips`) whose mean reading over the window stands out from the job's median, as
        `straggler_<reading>` summaries labelled with the GPU and the job's median."""
        if not ips:
            return []
        re_ips = "|".join(re.escape(ip).replace("\\", "\\\\") for ip in ips)
        found: list[MetricSummary] = []
        for name, unit, field, way, share in GPU_READINGS:
            means: list[tuple[str, str, float]] = []
            for series in self.client.query_range(f'{field}{{instance=~"({re_ips}):.*"}}', start, end, self.step_s):
                labels = series.get("metric", {})
                values = [float(v) for _, v in series.get("values") or [] if _number(v)]
                if values:
                    ip = str(labels.get("instance", "")).rsplit(":", 1)[0]
                    means.append((ip, str(labels.get("gpu", "?")), sum(values) / len(values)))
            if len(means) < MIN_GPUS_COMPARED:
                continue
            median = statistics.median(v for _, _, v in means)
            for ip, gpu, mean in means:
                if (way == "low" and mean < share * median) or (way == "high" and mean > share * median):
                    found.append(MetricSummary(
                        name=f"straggler_{name}", unit=unit, points=1, min=round(mean, 3), max=round(mean, 3),
                        last=round(mean, 3), labels={"node_ip": ip, "gpu": gpu, "job_median": f"{median:.4g}"},
                        first_at=start, last_at=end))
        return found

    def node_ips(self, incident: Incident) -> list[str]:
        own = incident.attrs.get("node_ip")
        if isinstance(own, str) and _IP.match(own):
            return [own]
        if incident.subject.kind is SubjectKind.NODE and incident.subject.name and _IP.match(incident.subject.name):
            return [incident.subject.name]
        sid = incident.attrs.get("submission_id") or (
            incident.subject.id if incident.subject.kind is SubjectKind.JOB else None)
        if not isinstance(sid, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", sid):
            return []
        promql = f'max by (node_ip) (max_over_time(argus_job_gpus{{submission_id="{sid}"}}[1h]))'
        ips = {s.get("metric", {}).get("node_ip") for s in self.client.query(promql)}
        return sorted(ip for ip in ips if isinstance(ip, str) and _IP.match(ip))[:MAX_NODES]


def _number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _summarise(name: str, unit: str, labels: dict[str, str], series: dict[str, Any]) -> MetricSummary | None:
    points = []
    for ts, value in series.get("values") or []:
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if number == number:  # NaN (a ratio over a missing total) says nothing
            points.append((float(ts), number))
    if not points:
        return None
    values = [v for _, v in points]
    keep = {k: str(v) for k, v in labels.items() if k in {"node_ip", "instance", "Hostname"}}
    return MetricSummary(
        name=name, labels=keep, unit=unit, points=len(points), min=round(min(values), 3), max=round(max(values), 3),
        last=round(values[-1], 3), first_at=datetime.fromtimestamp(points[0][0], tz=timezone.utc),
        last_at=datetime.fromtimestamp(points[-1][0], tz=timezone.utc),
    )
