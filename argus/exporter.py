"""The metrics Argus itself exports on `/metrics`, for Prometheus and Grafana.

- `argus_job_gpus{submission_id, job_id, node_ip, node_id, owner[, entrypoint]}`: GPUs a job holds on a
  node, from collectors/placement.py. Joined to DCGM series on the node's address, it answers "whose GPUs
  are these" in PromQL, e.g.
  `avg by (submission_id, owner) (DCGM_FI_DEV_GPU_UTIL * on(node_ip) group_left(submission_id, owner)
  argus_job_gpus)` once the DCGM target's instance is relabelled to a `node_ip` label.
- `argus_findings_total{category}`, `argus_incidents_open{category}` (open or mitigating),
  `argus_collector_up{collector}` (1 reachable, 0 not; absent until first polled) and
  `argus_detection_latency_seconds{category}` (finding's detected_at minus the fault's first_seen).
- Argus's own health, for alert_rules/argus-health.rules.yml and the Argus dashboard:
  `argus_loop_last_tick_timestamp_seconds` (0 until the first tick), `argus_loop_tick_duration_seconds`,
  `argus_collector_errors_total{collector}` (failed polls), `argus_incidents_opened_total{category}` (by the
  loop), `argus_notifications_total{channel, outcome}` (one per message or digest: sent, or failed after its
  retries; channel is the configured name, never a URL) and `argus_actions_total{kind, outcome}` (remediation
  steps reaching a final state).
- `argus_incident_opened_timestamp_seconds{incident_id, category, submission_id, node}`: one series per
  incident open or mitigating (the newest MAX_OPEN_INCIDENT_SERIES), valued at its opening time in unix
  seconds, for Grafana annotations; `node` is the node's IP where the incident names one, "" otherwise.
- `argus_job_step{submission_id}` and `argus_job_step_interval_seconds{submission_id}`: the highest step the
  stall detector has seen of each RUNNING job and the step interval it learnt.

Everything lives in one CollectorRegistry per ArgusMetrics, not prometheus_client's global one, so two
instances (tests, an embedded daemon) never clash. The entrypoint label is off by default: command lines
are long, unbounded in number, and sometimes carry secrets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import timedelta
from typing import Protocol

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
from control.jobs import JobRecord
from control.queue import TickOutcome
from core.refs import refs_of
from core.types import ActionState, Category, Finding, Incident, IncidentState
from detectors.stall import JobProgress


class IncidentLister(Protocol):
    """What refresh_incidents reads: counts per category and the newest incidents in some states
    (argus.store.store.Store has both)."""

    def count_incidents(self, states: Collection[IncidentState]) -> dict[str, int]: ...  # pragma: no cover

    def list_incidents(
        self, *, states: Collection[IncidentState] | None = None, limit: int = 100, offset: int = 0
    ) -> list[Incident]: ...  # pragma: no cover


# From a few seconds (log rules, lost nodes) to past the idle-GPU window (10 min by default).
LATENCY_BUCKETS = (1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 660, 900, 1800, 3600)
# A tick is normally well under a second; its collectors' timeouts (10 s each by default) make the slow tail.
TICK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
# a queue wait: none, a replacement node joining (minutes), a busy cluster (hours)
MAX_JOB_INFO_SERIES = 1000  # jobs running at once with an info series; more are left out (the newest listed first)
QUEUE_WAIT_BUCKETS = (1, 5, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
NOTIFICATION_OUTCOMES = ("sent", "failed")
ACTION_OUTCOMES = tuple(s.value for s in (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.SKIPPED,
                                          ActionState.REJECTED))
# Annotation series per open incident: enough for any real backlog, bounded for a storm of thousands.
MAX_OPEN_INCIDENT_SERIES = 500
_LABEL_MAX_CHARS = 200  # incident attrs can come from alert labels: a hostile one must not bloat every scrape
_JOB_LABELS = ("submission_id", "job_id", "node_ip", "node_id", "owner")


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
        self.agent_up = Gauge(
            "argus_agent_up", "Whether a node's Argus agent was heard from lately (1) or the central poller reads the "
            "node instead (0)", ("node",), registry=self.registry,
        )
        self.collector_up = Gauge(
            "argus_collector_up", "Whether a collector reached its source on its last poll (1) or not (0)",
            ("collector",), registry=self.registry,
        )
        self.detection_latency = Histogram(
            "argus_detection_latency_seconds", "From the fault's first evidence to Argus's finding",
            ("category",), buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.last_tick = Gauge(
            "argus_loop_last_tick_timestamp_seconds", "Unix time the detection loop last finished a tick",
            registry=self.registry,
        )
        self.tick_duration = Histogram(
            "argus_loop_tick_duration_seconds", "How long one tick of the detection loop took",
            buckets=TICK_BUCKETS, registry=self.registry,
        )
        self.collector_errors = Counter(
            "argus_collector_errors", "Polls of a collector that failed (source unreachable or an error)",
            ("collector",), registry=self.registry,
        )
        self.incidents_opened = Counter(
            "argus_incidents_opened", "Incidents opened (by the loop or Alertmanager)", ("category",),
            registry=self.registry,
        )
        self.incident_opened_at = Gauge(
            "argus_incident_opened_timestamp_seconds",
            "Unix time an incident still open or mitigating was opened (for Grafana annotations)",
            ("incident_id", "category", "submission_id", "node"), registry=self.registry,
        )
        self.notifications = Counter(
            "argus_notifications", "Notification deliveries (a message or a digest) by outcome: sent or failed",
            ("channel", "outcome"), registry=self.registry,
        )
        self.actions = Counter(
            "argus_actions", "Remediation steps that reached a final state", ("kind", "outcome"),
            registry=self.registry,
        )
        self.job_step = Gauge(
            "argus_job_step", "Highest training step seen in a RUNNING job's logs", ("submission_id",),
            registry=self.registry,
        )
        self.job_step_interval = Gauge(
            "argus_job_step_interval_seconds", "The step interval Argus learnt for a RUNNING job",
            ("submission_id",), registry=self.registry,
        )
        self.train_metric = Gauge(
            "argus_job_train_metric", "A job's latest training metric from its step lines (loss, grad_norm, lr, "
            "step_time, score, entropy, ...: the allow-list of detectors/training.yaml)",
            ("submission_id", "metric"), registry=self.registry,
        )
        self.job_info = Gauge(
            "argus_job_info", "1 for each job Argus submitted that Ray has not ended: its name, owner, workload and "
            "W&B project and run URL (empty when none)",
            ("submission_id", "name", "owner", "workload", "wandb_project", "wandb_url"), registry=self.registry,
        )
        self.jobs_queued = Gauge(
            "argus_jobs_queued", "Jobs waiting in Argus's job queue for their gang to fit, by pool (\"\": any node)",
            ("pool",), registry=self.registry,
        )
        self.queue_wait = Histogram(
            "argus_job_queue_wait_seconds", "How long a job waited in the queue before it started",
            buckets=QUEUE_WAIT_BUCKETS, registry=self.registry,
        )
        self.queue_left = Counter(
            "argus_job_queue_left", "Jobs that left the queue without starting, by why: expired or failed",
            ("outcome",), registry=self.registry,
        )
        for outcome in ("expired", "failed"):
            self.queue_left.labels(outcome)
        for category in Category:  # every category present from the start, so rate() and absent() behave
            self.findings.labels(category.value)
            self.incidents_opened.labels(category.value)
            self.incidents_open.labels(category.value).set(0)

    # -- updates -----------------------------------------------------------------------------------

    def set_job_gpus(self, placements: Iterable[JobPlacement]) -> None:
        """Replace the whole job -> node -> GPUs map: jobs that released their GPUs disappear."""
        rows: dict[tuple[str, ...], float] = {}
        for job in placements:
            for node in job.nodes:
                labels: tuple[str, ...] = (job.submission_id or "", job.job_id, node.node_ip, node.node_id,
                                           job.owner or "")
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

    def set_agent_up(self, node: str, up: bool) -> None:
        self.agent_up.labels(node=node).set(1 if up else 0)

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
            errors = self.collector_errors.labels(name)  # present at 0 from the first tick, so increase() works
            if name in tick.errors:
                errors.inc()
        self.tick_duration.observe(max(0.0, tick.duration_s))
        finished = tick.finished_at or tick.started_at + timedelta(seconds=tick.duration_s)
        self.last_tick.set(finished.timestamp())

    def incident_opened(self, incident: Incident) -> None:
        """An incident opened, from the loop or from Alertmanager (the metrics subscriber calls this)."""
        self.incidents_opened.labels(incident.category.value).inc()

    def declare_channels(self, channels: Iterable[str]) -> None:
        """Start each configured channel's counters at 0: a first failure then shows in increase()."""
        for channel in channels:
            for outcome in NOTIFICATION_OUTCOMES:
                self.notifications.labels(channel, outcome)

    def notification_delivered(self, channel: str, outcome: str) -> None:
        """The dispatcher's `on_delivery` hook: one message or digest to `channel` was sent or failed."""
        if outcome not in NOTIFICATION_OUTCOMES:
            raise ValueError(f"notification outcome {outcome!r} is not one of {NOTIFICATION_OUTCOMES}")
        self.notifications.labels(channel, outcome).inc()

    def declare_actions(self, kinds: Iterable[str]) -> None:
        """Start every (step kind, final outcome) at 0, like declare_channels."""
        for kind in kinds:
            for outcome in ACTION_OUTCOMES:
                self.actions.labels(kind, outcome)

    def action_finished(self, kind: str, outcome: str) -> None:
        """The remediation runner's `on_step_final` hook."""
        if outcome not in ACTION_OUTCOMES:
            raise ValueError(f"action outcome {outcome!r} is not a final state ({', '.join(ACTION_OUTCOMES)})")
        self.actions.labels(kind, outcome).inc()

    def set_job_progress(self, progress: Mapping[str, JobProgress]) -> None:
        """Replace the step gauges with the stall detector's `progress()`: jobs no longer RUNNING disappear."""
        self.job_step.clear()
        self.job_step_interval.clear()
        for submission_id, job in progress.items():
            self.job_step.labels(submission_id).set(job.step)
            if job.interval_s is not None:
                self.job_step_interval.labels(submission_id).set(job.interval_s)

    def set_train_metrics(self, series: Mapping[str, Mapping[str, float]]) -> None:
        """Replace every job's training-metric series (the detector bounds jobs and series per job)."""
        self.train_metric.clear()
        for job_id, values in series.items():
            for name, value in values.items():
                self.train_metric.labels(_label(job_id), name).set(value)

    def set_job_info(self, records: Iterable[JobRecord]) -> None:
        """Replace the info series with the jobs not yet ended (at most MAX_JOB_INFO_SERIES)."""
        self.job_info.clear()
        live = [r for r in records if not r.ended][:MAX_JOB_INFO_SERIES]
        for r in live:
            self.job_info.labels(_label(r.submission_id), _label(r.name or ""), _label(r.owner or ""),
                                 _label(r.workload or ""), _label(r.wandb_project or ""),
                                 _label(r.wandb_url or "")).set(1)

    def observe_queue(self, outcome: TickOutcome) -> None:
        """One tick of the job queue: the jobs still waiting by pool, the waits of those it started, what left it."""
        self.jobs_queued.clear()
        for pool, count in outcome.waiting_by_pool.items():
            self.jobs_queued.labels(_label(pool)).set(count)
        for waited in outcome.waited_s.values():
            self.queue_wait.observe(waited)
        self.queue_left.labels("expired").inc(len(outcome.expired))
        self.queue_left.labels("failed").inc(len(outcome.failed))

    def refresh_incidents(self, store: IncidentLister) -> None:
        """Count not-resolved incidents per category in the store (one GROUP BY: an alert storm's thousands of open
        incidents are not read one by one on every event) and replace the annotation series with the newest of
        them: resolved incidents disappear."""
        still_open = (IncidentState.OPEN, IncidentState.MITIGATING)
        self.set_incidents_open(store.count_incidents(still_open))
        self.set_open_incidents(store.list_incidents(states=still_open, limit=MAX_OPEN_INCIDENT_SERIES))

    def set_open_incidents(self, incidents: Iterable[Incident]) -> None:
        """One annotation series per incident given (the caller keeps it to the open ones)."""
        self.incident_opened_at.clear()
        for incident in incidents:
            self.incident_opened_at.labels(
                incident.id, incident.category.value, _label(_submission_of(incident)), _label(_node_of(incident)),
            ).set(incident.detected_at.timestamp())

    # -- exposition --------------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)


def exported_series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can expose (a counter's `_total`, a histogram's `_bucket`/`_sum`/
    `_count`...), whether or not it has samples yet: what a PromQL rule on Argus may name."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
                "stateset": ("",), "enum": ("",)}
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def _submission_of(incident: Incident) -> str:
    return refs_of(incident).submission_id or ""


def _node_of(incident: Incident) -> str:
    """The node's IP, the way argus_job_gpus and the dashboards name nodes."""
    return refs_of(incident).node_ip or ""


def _label(value: str) -> str:
    return value[:_LABEL_MAX_CHARS]


def metrics_router(metrics: ArgusMetrics) -> APIRouter:
    """A router serving `GET /metrics` in Prometheus's text format; mount with `app.include_router(...)`."""
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", response_class=Response, include_in_schema=False)
    def get_metrics() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
