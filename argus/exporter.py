"""The metrics Argus itself exports on `/metrics`, for Prometheus and Grafana.

- `argus_job_gpus{submission_id, job_id, node_ip, node_id, owner[, entrypoint]}`: GPUs a job holds on a
  node, from collectors/placement.py. Joined to DCGM series on the node's address, it answers "whose GPUs
  are these" in PromQL, e.g.
  `avg by (submission_id, owner) (DCGM_FI_DEV_GPU_UTIL * on(node_ip) group_left(submission_id, owner)
  argus_job_gpus)` once the DCGM target's instance is relabelled to a `node_ip` label.
- `argus_findings_total{category}`, `argus_incidents_open{category}` (open or mitigating),
  `argus_collector_up{collector}` (1 reachable, 0 not; absent until first polled) and
  `argus_detection_latency_seconds{category}` (finding's detected_at minus the fault's first_seen).

Everything lives in one CollectorRegistry per ArgusMetrics, not prometheus_client's global one, so two
instances (tests, an embedded daemon) never clash. The entrypoint label is off by default: command lines
are long, unbounded in number, and sometimes carry secrets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from argus.pipeline import SourceStatus, TickResult
from collectors.placement import JobPlacement
from core.types import Category, Finding, IncidentState

# From a few seconds (log rules, lost nodes) to past the idle-GPU window (10 min by default).
LATENCY_BUCKETS = (1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 660, 900, 1800, 3600)
_JOB_LABELS = ("submission_id", "job_id", "node_ip", "node_id", "owner")
_PAGE = 1000  # the store's largest page


class ArgusMetrics:
    """Argus's own gauges and counters; the pipeline and collectors call the update methods."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        include_entrypoint: bool = False,
        entrypoint_max_chars: int = 120,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.include_entrypoint = include_entrypoint
        self.entrypoint_max_chars = entrypoint_max_chars
        job_labels = _JOB_LABELS + (("entrypoint",) if include_entrypoint else ())
        self.job_gpus = Gauge(
            "argus_job_gpus", "GPUs a Ray job holds on a node (actors, tasks, placement group bundles)",
            job_labels, registry=self.registry,
        )
        self.findings = Counter(
            "argus_findings", "Findings made by Argus's detectors", ("category",), registry=self.registry
        )
        self.incidents_open = Gauge(
            "argus_incidents_open", "Incidents open or being mitigated", ("category",), registry=self.registry
        )
        self.collector_up = Gauge(
            "argus_collector_up", "Whether a collector reached its source on its last poll (1) or not (0)",
            ("collector",), registry=self.registry,
        )
        self.detection_latency = Histogram(
            "argus_detection_latency_seconds", "From the fault's first evidence to Argus's finding",
            ("category",), buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        for category in Category:  # every category present from the start, so rate() and absent() behave
            self.findings.labels(category.value)
            self.incidents_open.labels(category.value).set(0)

    # -- updates -----------------------------------------------------------------------------------

    def set_job_gpus(self, placements: Iterable[JobPlacement]) -> None:
        """Replace the whole job -> node -> GPUs map: jobs that released their GPUs disappear."""
        rows: dict[tuple[str, ...], float] = {}
        for job in placements:
            for node in job.nodes:
                labels = (job.submission_id or "", job.job_id, node.node_ip, node.node_id, job.owner or "")
                if self.include_entrypoint:
                    labels += ((job.entrypoint or "")[: self.entrypoint_max_chars],)
                rows[labels] = rows.get(labels, 0.0) + node.gpus
        self.job_gpus.clear()
        for labels, gpus in rows.items():
            self.job_gpus.labels(*labels).set(gpus)

    def finding_recorded(self, finding: Finding) -> None:
        category = finding.category.value
        self.findings.labels(category).inc()
        latency = (finding.detected_at - finding.first_seen).total_seconds()
        self.detection_latency.labels(category).observe(max(0.0, latency))

    def set_incidents_open(self, counts: Mapping[Category | str, int]) -> None:
        """Open incidents per category; categories not named are 0."""
        by_value = {Category(k).value: int(v) for k, v in counts.items()}
        for category in Category:
            self.incidents_open.labels(category.value).set(by_value.get(category.value, 0))

    def set_collector_up(self, collector: str, up: bool | None) -> None:
        """None (not polled yet) removes the series rather than claiming up or down."""
        if up is None:
            try:
                self.collector_up.remove(collector)
            except KeyError:
                pass
            return
        self.collector_up.labels(collector).set(1 if up else 0)

    def observe_tick(self, tick: TickResult, sources: Mapping[str, SourceStatus]) -> None:
        """After `Pipeline.run_once()`: `observe_tick(result, pipeline.sources)`."""
        for finding in tick.findings:
            self.finding_recorded(finding)
        for name, status in sources.items():
            self.set_collector_up(name, status.ok)

    def refresh_incidents(self, store: Any) -> None:
        """Count not-resolved incidents per category from the store (paged; cheap for normal counts)."""
        counts: dict[str, int] = {}
        for state in (IncidentState.OPEN, IncidentState.MITIGATING):
            offset = 0
            while True:
                page = store.list_incidents(state=state, limit=_PAGE, offset=offset)
                for incident in page:
                    counts[incident.category.value] = counts.get(incident.category.value, 0) + 1
                if len(page) < _PAGE:
                    break
                offset += _PAGE
        self.set_incidents_open(counts)

    # -- exposition --------------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)


def metrics_router(metrics: ArgusMetrics) -> APIRouter:
    """A router serving `GET /metrics` in Prometheus's text format; mount with `app.include_router(...)`."""
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", response_class=Response, include_in_schema=False)
    def get_metrics() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
