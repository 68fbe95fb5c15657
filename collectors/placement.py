"""Which job holds which GPUs on which node, from Ray's state API; DCGM utilisation through Prometheus.

What holds a GPU in Ray (measured on ray 2.60 with workers advertising GPUs):
- a placement group in state CREATED reserves its bundles' GPUs on the bundles' nodes whether or not
  anything runs in them (`list_placement_groups(detail=True)`: `bundles[i].unit_resources` and
  `bundles[i].node_id`; the owner is `creator_job_id`);
- an ALIVE actor outside a placement group holds `required_resources["GPU"]` on its `node_id` (also an
  actor still in PENDING_CREATION once it has a node: its `__init__` runs on leased resources);
- a RUNNING normal task outside a placement group holds `required_resources["GPU"]` on its `node_id`.
Actors and tasks inside a placement group draw from its reservation (their required_resources name
`GPU_group_<pg id>` instead of `GPU`), so they are not counted again.

What is not knowable from the state API: which GPU indices a worker got. Ray assigns them (a worker sees
them as `ray.get_gpu_ids()` and CUDA_VISIBLE_DEVICES), but neither actors, tasks, workers nor placement
groups report them. So the map is a count per node; it is exact per GPU only when a job holds every GPU of
a node. Job metadata (the owner) comes only with `list_jobs(detail=True)`; without `detail` Ray returns
`metadata=None`.

`GpuPlacementCollector` emits one METRIC signal per job holding GPUs (metric `argus_job_gpus`, value the
GPUs held, subject the job) and one snapshot signal for the cluster (metric `argus_gpu_placement`, with
every node's IP, name and GPU total), so a detector can tell "no job holds GPUs" from "not polled".
A job that is no longer RUNNING can still hold GPUs (a detached actor outlives its job); it is
reported with its status, and exported, since those GPUs are lost to everyone else too.
METRIC rather than JOB_STATE because RayStateCollector already owns the job's state signal; this one is a
measurement about the job, the same one Argus exports to Prometheus as `argus_job_gpus`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from collectors.dcgm import GpuSample
from collectors.prometheus import PrometheusClient
from collectors.ray_api import RayStateApi
from core import signal_keys as keys
from core.names import OWNER_KEYS, clean, job_identity
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

JOB_GPUS_METRIC = keys.JOB_GPUS_METRIC
PLACEMENT_METRIC = keys.PLACEMENT_METRIC
SOURCE = "ray.placement"
DEFAULT_OWNER_KEYS = OWNER_KEYS

# An actor holds its lease from the moment it has a node until it dies; RESTARTING ones hold nothing yet.
_HOLDING_ACTOR_STATES = {"ALIVE", "PENDING_CREATION"}


@dataclass(frozen=True)
class NodeGpus:
    """The GPUs one job holds on one node."""

    node_id: str
    node_ip: str
    node_name: str
    gpus: float
    node_gpus_total: float

    @property
    def whole_node(self) -> bool:
        """True when the job holds every GPU of the node, so the node's GPUs are exactly the job's."""
        return self.node_gpus_total > 0 and self.gpus >= self.node_gpus_total

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "node_name": self.node_name,
            "gpus": self.gpus,
            "node_gpus_total": self.node_gpus_total,
            "whole_node": self.whole_node,
        }


@dataclass(frozen=True)
class JobPlacement:
    """Every GPU one job holds, per node; the job identified as Ray and its users know it."""

    job_id: str
    submission_id: str | None
    status: str | None
    owner: str | None
    entrypoint: str | None
    nodes: tuple[NodeGpus, ...]
    name: str | None = None  # the JobSpec name from the job's metadata (core.names)

    @property
    def key(self) -> str:
        """The submission id users know the job by; the Ray job id for drivers started without Jobs API."""
        return self.submission_id or self.job_id

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    def to_signal(self, observed_at: datetime) -> Signal:
        return Signal(
            kind=SignalKind.METRIC,
            source=SOURCE,
            subject=Subject(kind=SubjectKind.JOB, id=self.key, name=self.name),
            observed_at=observed_at,
            value=self.gpus,
            attrs={
                keys.METRIC: JOB_GPUS_METRIC,
                keys.JOB_ID: self.job_id,
                keys.SUBMISSION_ID: self.submission_id,
                keys.STATUS: self.status,
                keys.OWNER: self.owner,
                keys.JOB_NAME: self.name,
                keys.ENTRYPOINT: self.entrypoint,
                "placement": {n.node_ip: n.gpus for n in self.nodes},
                keys.NODES: [n.as_dict() for n in self.nodes],
                "gpu_indices_known": False,
            },
        )


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _text(value: Any) -> str | None:
    value = getattr(value, "value", value)  # enums in the SDK, strings over REST
    return str(value) if value is not None else None


class GpuPlacementCollector:
    """Maps jobs to the GPUs they hold, per node; implements core.ports.Collector.

    `on_placement` is called with the full list after every successful poll (Argus passes the exporter's
    update function there, so the Prometheus gauges follow the same map the detectors see).
    """

    name = "gpu_placement"

    def __init__(
        self,
        dashboard_url: str,
        *,
        timeout_s: float = 10.0,
        owner_keys: Sequence[str] = DEFAULT_OWNER_KEYS,
        on_placement: Callable[[list[JobPlacement]], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
        state_api: Any = None,
    ) -> None:
        self._ray = RayStateApi(dashboard_url, timeout_s, state_api)
        self.dashboard_url = self._ray.dashboard_url
        self.timeout_s = timeout_s
        self.owner_keys = tuple(owner_keys)
        self._on_placement = on_placement
        self._clock = clock

    def placements(self) -> tuple[list[JobPlacement], list[dict[str, Any]]]:
        """(jobs holding GPUs, every node as {node_id, node_ip, node_name, state, gpus_total})."""
        nodes = self._ray.call("list_nodes", detail=True)
        jobs = self._ray.call("list_jobs", detail=True)
        groups = self._ray.call("list_placement_groups", detail=True)
        actors = self._ray.call("list_actors", detail=True)
        tasks = self._ray.call("list_tasks", detail=True, filters=[("state", "=", "RUNNING")])

        node_info: dict[str, dict[str, Any]] = {
            str(_field(n, "node_id")): {
                "node_id": str(_field(n, "node_id")),
                "node_ip": _field(n, "node_ip") or "",
                "node_name": clean(_field(n, "node_name")) or "",
                "state": _text(_field(n, "state")),
                "gpus_total": float((_field(n, "resources_total") or {}).get("GPU", 0.0)),
            }
            for n in nodes
        }
        alive = {nid for nid, n in node_info.items() if n["state"] == "ALIVE"}
        held: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # job -> node -> GPUs
        reserved_groups: set[str] = set()

        for group in groups:
            if _text(_field(group, "state")) not in {"CREATED", "RESCHEDULING"}:
                continue
            reserved_groups.add(str(_field(group, "placement_group_id")))
            job_id = str(_field(group, "creator_job_id"))
            for bundle in _field(group, "bundles") or []:
                node_id = bundle.get("node_id")
                gpus = float((bundle.get("unit_resources") or {}).get("GPU", 0))
                if node_id in alive and gpus > 0:
                    held[job_id][node_id] += gpus

        def add(job_id: Any, node_id: Any, group_id: Any, resources: Any) -> None:
            if not job_id or node_id not in alive or (group_id and str(group_id) in reserved_groups):
                return
            gpus = float((resources or {}).get("GPU", 0))
            if gpus > 0:
                held[str(job_id)][node_id] += gpus

        for actor in actors:
            if _text(_field(actor, "state")) in _HOLDING_ACTOR_STATES:
                add(_field(actor, "job_id"), _field(actor, "node_id"), _field(actor, "placement_group_id"),
                    _field(actor, "required_resources"))
        for task in tasks:
            # actor creation tasks are counted through their actor; actor method calls carry no resources
            if _text(_field(task, "type")) == "NORMAL_TASK":
                add(_field(task, "job_id"), _field(task, "node_id"), _field(task, "placement_group_id"),
                    _field(task, "required_resources"))

        job_info = {str(_field(j, "job_id")): j for j in jobs if _field(j, "job_id")}
        result = []
        for job_id in sorted(held):
            job = job_info.get(job_id)
            identity = job_identity(_field(job, "metadata") if job is not None else None, self.owner_keys)
            per_node = tuple(
                NodeGpus(
                    node_id=node_id,
                    node_ip=node_info[node_id]["node_ip"],
                    node_name=node_info[node_id]["node_name"],
                    gpus=gpus,
                    node_gpus_total=node_info[node_id]["gpus_total"],
                )
                for node_id, gpus in sorted(held[job_id].items(), key=lambda kv: node_info[kv[0]]["node_ip"])
            )
            result.append(
                JobPlacement(
                    job_id=job_id,
                    submission_id=_field(job, "submission_id") if job is not None else None,
                    status=_text(_field(job, "status")) if job is not None else None,
                    owner=identity.owner,
                    entrypoint=_field(job, "entrypoint") if job is not None else None,
                    nodes=per_node,
                    name=identity.name,
                )
            )
        return result, list(node_info.values())

    def collect(self) -> list[Signal]:
        now = self._clock()
        jobs, nodes = self.placements()
        if self._on_placement is not None:
            self._on_placement(jobs)
        snapshot = Signal(
            kind=SignalKind.METRIC,
            source=SOURCE,
            subject=Subject(kind=SubjectKind.CLUSTER, id=self.dashboard_url, name="ray"),
            observed_at=now,
            value=float(len(jobs)),
            attrs={keys.METRIC: PLACEMENT_METRIC, keys.NODES: nodes, keys.JOBS: [j.key for j in jobs]},
        )
        return [snapshot, *(j.to_signal(now) for j in jobs)]


# -- DCGM through Prometheus -----------------------------------------------------------------------

_UUID_LABELS = ("UUID", "uuid")
_HOSTNAME_LABELS = ("Hostname", "hostname")


class PrometheusGpuCollector:
    """Per-GPU DCGM series read from Prometheus, as the same GPU METRIC signals DcgmScrapeCollector emits.

    The rows keep Prometheus's `instance` label (the exporter's scrape address), which is how a GPU is
    tied to a Ray node when dcgm-exporter's Hostname is not the node's name (see detectors/idle_gpu.py).
    Series without a gpu index and UUID (NVLink-, switch- or CPU-level ones) are skipped.
    """

    name = "dcgm_prometheus"

    def __init__(
        self,
        client: PrometheusClient,
        *,
        queries: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        # metric name the signals carry -> the PromQL that reads it; a query may narrow the series
        # ('DCGM_FI_DEV_GPU_UTIL{job="dcgm"}') or smooth them ('max_over_time(DCGM_FI_DEV_GPU_UTIL[1m])')
        self.queries = dict(queries or {"DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL"})
        self.client = client
        self._clock = clock

    def collect(self) -> list[Signal]:
        signals = []
        for metric, promql in self.queries.items():
            for row in self.client.query(promql):
                signal = self._to_signal(metric, row)
                if signal is not None:
                    signals.append(signal)
        return signals

    def _to_signal(self, metric: str, row: dict[str, Any]) -> Signal | None:
        labels = dict(row.get("metric") or {})
        uuid = next((labels[k] for k in _UUID_LABELS if labels.get(k)), None)
        ts, value = (row.get("value") or [None, None])[:2]
        if uuid is None or value is None or not str(labels.get("gpu", "")).isdigit():
            return None
        sample = GpuSample(
            hostname=next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), ""),
            gpu=int(labels["gpu"]),
            uuid=uuid,
            model_name=labels.get("modelName", ""),
            metric=metric,
            value=float(value),
            labels=labels,
            source=f"prometheus:{self.client.url}",
        )
        at = datetime.fromtimestamp(float(ts), tz=timezone.utc) if ts else self._clock()
        return sample.to_signal(at)
