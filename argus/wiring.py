"""The one place that builds objects from Settings and wires them together.

Registered in explicit lists: adding a collector, detector or incident subscriber is one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger

from argus.agents.fleet import FleetSupervisor, agent_token
from argus.agents.inbox import AgentInbox
from argus.approval_links import ApprovalLinks, load_secret
from argus.control_plane import ControlPlane, job_queue
from argus.exporter import ArgusMetrics
from argus.incidents.bus import EventBus, EventSink, Subscriber
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import IncidentEvent
from argus.incidents.subscribers import (
    ImSubscriber,
    MetricsSubscriber,
    NotifierSubscriber,
    RemediationSubscriber,
    ReportSubscriber,
)
from argus.metric_queries import MetricQueries
from argus.notify.dispatcher import Dispatcher
from argus.notify.registry import build_channels
from argus.notify.webhook import WebhookNotifier
from argus.pipeline import Pipeline, TickResult
from argus.reports import ReportService
from collectors.agent_gpus import AgentGpuCollector, GpuFeed
from collectors.dcgm import DcgmScrapeCollector
from collectors.kernel_log import KernelLogCollector, pick_source, primary_ip
from collectors.logs import JobLogsCollector
from collectors.metric_rules import MetricRuleCollector
from collectors.nvml import NvmlCollector
from collectors.offsets import OffsetStore
from collectors.placement import GpuPlacementCollector, PrometheusGpuCollector
from collectors.prometheus import PrometheusClient, PrometheusTargetsCollector
from collectors.rank_stacks import RankStackSampler
from collectors.ray_logs import AgentFeed, RayLogsCollector
from collectors.ray_state import RayStateCollector
from collectors.storage import SharedStorageCollector
from control.jobs import JobController
from control.local import LocalRunner
from control.node_manager import NodeManager
from core.jobfolder import JobFolders
from core.ports import Collector, Detector, DetectorMemory
from core.readers import Readers
from core.settings import Settings
from core.types import Action
from detectors.disk_space import DiskSpaceDetector
from detectors.engine import load_rules
from detectors.idle_gpu import IdleGpuDetector
from detectors.job_failure import JobFailureDetector
from detectors.log_rules import LogRuleDetector
from detectors.lost_node import LostNodeDetector
from detectors.metric_rules import MetricRuleDetector, MetricRuleSet, load_metric_rules
from detectors.stall import StallDetector
from detectors.training_health import TrainingHealthDetector, load_training_rules
from detectors.waiting import WaitingJobDetector
from rca.engine import RcaEngine
from rca.metrics import PrometheusMetricsReader
from rca.redact import Redactor
from remediation.actions import STEPS
from remediation.actions import Context as ActionContext
from remediation.policy import load_policy
from remediation.runner import Remediator

if TYPE_CHECKING:
    from argus.store.store import Store
    from rca.llm import LlmWriter


class NodeAgentFeed(AgentFeed, GpuFeed, Protocol):
    """What node agents sent: lines for the Ray log collector, GPU readings (argus.agents.inbox.AgentInbox)."""


def build_collectors(settings: Settings, metric_rules: MetricRuleSet, metrics: ArgusMetrics,
                     agents: NodeAgentFeed | None = None) -> list[Collector]:
    offsets = settings.data_dir / "offsets"
    collectors: list[Collector] = [
        RayStateCollector(settings.ray_dashboard_url, timeout_s=settings.request_timeout_s),
        GpuPlacementCollector(
            settings.ray_dashboard_url, timeout_s=settings.request_timeout_s, on_placement=metrics.set_job_gpus
        ),
        RayLogsCollector(
            settings.ray_dashboard_url, OffsetStore(offsets / "ray_logs.json"), timeout_s=settings.request_timeout_s,
            history_window_s=settings.history_window_s, agents=agents,
        ),
    ]
    jobs_dir = JobFolders(settings.shared_root).jobs_dir
    if jobs_dir.is_dir():
        collectors.append(JobLogsCollector(settings.shared_root, OffsetStore(offsets / "job_logs.json"),
                                           history_window_s=settings.history_window_s))
        collectors.append(SharedStorageCollector([settings.shared_root], timeout_s=settings.request_timeout_s))
    else:
        logger.info("no {} folder: job log files on shared storage will not be read", jobs_dir)
    if settings.prometheus_url:
        client = PrometheusClient(settings.prometheus_url, timeout_s=settings.request_timeout_s)
        collectors.append(PrometheusTargetsCollector(client))
        collectors.append(MetricRuleCollector(client, metric_rules))
        collectors.append(PrometheusGpuCollector(client))
    elif settings.dcgm_targets:
        collectors.append(DcgmScrapeCollector(settings.dcgm_targets, timeout_s=settings.request_timeout_s))
    elif settings.nvml:  # Argus on a GPU host without dcgm-exporter
        collectors.append(NvmlCollector(hostname=settings.nvml_hostname))
    if agents is not None and settings.agents_read_gpus:  # GPU nodes without dcgm-exporter, read by their agents
        collectors.append(AgentGpuCollector(agents))
    if settings.kernel_log != "off":
        kernel_offsets = OffsetStore(offsets / "kernel_log.json")
        choice = pick_source(settings.kernel_log, kernel_offsets, history_window_s=settings.history_window_s)
        if choice.source is None:
            logger.warning("kernel_log={}: no kernel log this process may read ({}); set kernel_log to a file's path "
                           "or run Argus where /dev/kmsg or journalctl -k is readable", settings.kernel_log,
                           "; ".join(choice.tried))
        else:
            node_ip = settings.kernel_log_node_ip or primary_ip()
            logger.info("reading this host's kernel log from {} (node {})", choice.source.name, node_ip)
            collectors.append(KernelLogCollector(choice.source, kernel_offsets, node_id=node_ip, node_ip=node_ip))
    return collectors


def build_detectors(settings: Settings, metric_rules: MetricRuleSet, stall: StallDetector | None = None,
                    memory: DetectorMemory | None = None,
                    training: TrainingHealthDetector | None = None) -> list[Detector]:
    """`stall`: the stall detector to use (wiring keeps it to export each job's progress); a new one if None.
    `memory`: where the stateful detectors (stall, idle GPU, metric rules, log rules, waiting jobs) keep their state
    across restarts, normally the store's `detector_state`; None keeps it in this process only."""
    log_rules = load_rules(settings.rules_dirs)
    detectors: list[Detector] = [
        LostNodeDetector(lookback_s=settings.lost_node_lookback_s),
        LogRuleDetector(log_rules.signatures(), memory=memory),  # generic rules read failed jobs only
        JobFailureDetector(log_rules),
        stall or build_stall_detector(settings, memory),
        IdleGpuDetector(threshold_pct=settings.idle_gpu_threshold_pct, window_s=settings.idle_gpu_window_s,
                        memory=memory),
        DiskSpaceDetector(),
        WaitingJobDetector(alert_s=settings.pending_alert_s, memory=memory),
        training or build_training_detector(settings),
    ]
    if settings.prometheus_url:
        detectors.append(MetricRuleDetector(metric_rules, memory=memory))
    return detectors


def build_training_detector(settings: Settings) -> TrainingHealthDetector:
    """Step metrics as series and the training-health rules (detectors/training.yaml, or settings.training_rules)."""
    rules = load_training_rules(settings.training_rules) if settings.training_rules else load_training_rules()
    return TrainingHealthDetector(rules, max_series_per_job=settings.train_metric_series_per_job)


def build_stall_detector(settings: Settings, memory: DetectorMemory | None = None) -> StallDetector:
    """The stall detector; with `memory` it loads each job's rhythm from it now and keeps it there."""
    return StallDetector(min_stall_s=settings.stall_min_s, factor=settings.stall_factor,
                         suspect_min_s=settings.stall_suspect_s, memory=memory)


def build_subscribers(
    settings: Settings, store: Any, events: EventSink, *, public_url: str | None = None,
    metrics: ArgusMetrics | None = None, reports: ReportService | None = None, remediator: Remediator | None = None,
    dispatcher: Dispatcher | None = None, links: ApprovalLinks | None = None,
) -> list[Subscriber]:
    """Everyone told of incident events, in one list: metrics, reports, remediation, IM, and each webhook."""
    subscribers: list[Subscriber] = []
    if metrics is not None:
        subscribers.append(MetricsSubscriber(metrics, store))
    if reports is not None:
        subscribers.append(ReportSubscriber(reports))
    if remediator is not None:
        subscribers.append(RemediationSubscriber(remediator, events))
    if dispatcher is not None:
        awaits = {"report_ready"} if reports is not None else set()
        awaits |= {"planned"} if remediator is not None else set()
        subscribers.append(ImSubscriber(dispatcher, links, awaits=frozenset(awaits)))
    for n, url in enumerate(settings.webhook_urls, start=1):
        webhook = WebhookNotifier(url, timeout_s=settings.request_timeout_s, public_url=public_url)
        subscribers.append(NotifierSubscriber(webhook, name=f"webhook-{n}"))
    return subscribers


def build_incidents(settings: Settings, store: Any, *, events: EventBus | None = None,
                    **subscribers: Any) -> IncidentDesk:
    """The incident desk with its bus started on `build_subscribers(settings, store, **subscribers)`. Pass the
    bus as `events` when something built before the desk (the report service) publishes on it too."""
    bus = events or EventBus()
    bus.start(build_subscribers(settings, store, bus, **subscribers))
    return IncidentDesk(store, events=bus, correlator=Correlator(store), reopen_window_s=settings.reopen_window_s)


def build_dispatcher(settings: Settings, store: Any, *, public_url: str | None = None,
                     metrics: ArgusMetrics | None = None) -> Dispatcher | None:
    """The IM dispatcher for notify_channels (started: it flushes digests), or None without channels. With
    `metrics`, each delivery's outcome is counted in argus_notifications_total."""
    if not settings.notify_channels:
        return None
    channels = build_channels(settings.notify_channels)
    if metrics is not None:
        metrics.declare_channels(c.name for c in channels)
    dispatcher = Dispatcher(channels, store, public_url=public_url, timeout_s=settings.request_timeout_s,
                            renotify_interval_s=settings.renotify_interval_s,
                            first_message_wait_s=settings.im_first_message_wait_s,
                            on_delivery=metrics.notification_delivered if metrics is not None else None)
    return dispatcher.start()


def build_approval_links(settings: Settings, public_url: str) -> ApprovalLinks:
    return ApprovalLinks(load_secret(settings.data_dir / "approval-link.secret"), public_url,
                         ttl_s=settings.approval_link_ttl_s)


def open_store(settings: Settings) -> Store:
    from argus.store.store import Store  # SQLAlchemy and Alembic load only for commands that use the store

    return Store(settings.effective_database_url)


def build_redactor(settings: Settings) -> Callable[[], Redactor]:
    """A factory: each report gets a fresh Redactor, so pseudonyms (ip-1, user-1) are stable within it."""
    Redactor(settings.redact_patterns)  # a bad pattern stops start-up, not the first report

    def make() -> Redactor:
        return Redactor(settings.redact_patterns, mask_ips=settings.redact_ips,
                        mask_users=bool(settings.redact_users), users=settings.redact_users)

    return make


def build_llm(settings: Settings) -> LlmWriter | None:
    """The LLM writer when llm_base_url is set (langchain loads only then), else None."""
    if not settings.llm_base_url:
        return None
    from rca.llm import LlmWriter

    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return LlmWriter(settings.llm_base_url, settings.llm_model, api_key=key, timeout_s=settings.llm_timeout_s,
                     max_retries=settings.llm_max_retries, method=settings.llm_method)


def build_metric_queries(settings: Settings) -> MetricQueries | None:
    """Series read through Argus (the API's /v1/metrics, MCP's metric tools); None without a Prometheus."""
    if not settings.prometheus_url:
        return None
    client = PrometheusClient(settings.prometheus_url, timeout_s=settings.request_timeout_s)
    return MetricQueries(client, PrometheusMetricsReader(client))


def build_reports(settings: Settings, store: Any, *, events: EventSink | None = None,
                  writer: Any = None, readers: Readers | None = None) -> ReportService:
    """Reports for incidents (not started: call .start()); each one written is announced on `events`. `writer`:
    the LLM writer to use instead of the one settings describe. `readers`: the API's requests, given way to."""
    metrics_reader = None
    if settings.prometheus_url:
        metrics_reader = PrometheusMetricsReader(PrometheusClient(settings.prometheus_url,
                                                                  timeout_s=settings.request_timeout_s))
    engine = RcaEngine(load_rules(settings.rules_dirs), build_redactor(settings),
                       writer=writer if writer is not None else build_llm(settings), metrics=metrics_reader,
                       token_budget=settings.rca_token_budget)
    return ReportService(store, engine, settings.shared_root, events=events, readers=readers)


def build_remediator(settings: Settings, store: Any, control: ControlPlane, *,
                     metrics: ArgusMetrics | None = None, reports: ReportService | None = None,
                     readers: Readers | None = None, events: EventSink | None = None) -> Remediator:
    """The remediation runner over the control plane, with the policy from settings (checked at start). Each step
    reaching a final state is counted in argus_actions_total (with `metrics`), refreshes its incident's report's
    "What Argus did" (with `reports`: cheap, no LLM call) and, unless it was a dry run, is announced as STEP_FINISHED
    (with `events`: IM and the webhooks tell it)."""
    policy = load_policy(settings.remediation_policy, mode=settings.remediation_mode)
    ctx = ActionContext(jobs=control.jobs, registry=control.registry, nodes=control.manager,
                        dashboard_url=settings.ray_dashboard_url, gcs_address=settings.ray_gcs_address,
                        local=LocalRunner(), store=store, request_timeout_s=settings.request_timeout_s,
                        queue=control.queue)
    logger.info("remediation policy {} in mode {}", policy.source, policy.mode.value)
    if metrics is not None:
        metrics.declare_actions(STEPS)

    def step_final(action: Action) -> None:
        if metrics is not None:
            metrics.action_finished(action.kind, action.state.value)
        if reports is not None and action.incident_id is not None:
            reports.refresh(action.incident_id)
        # a step that acted (a dry run's "would" is in the plan's own event already: told again per step, a storm of
        # incidents in dry-run would tell the ops agent each of them once more per step)
        if events is not None and action.incident_id is not None and not action.dry_run:
            events.publish(IncidentEvent.step_finished(store.get_incident(action.incident_id), action))

    return Remediator(store, policy, ctx, on_step_final=step_final, readers=readers)


def build_pipeline(settings: Settings, incidents: IncidentDesk, *, metrics: ArgusMetrics | None = None,
                   collectors: list[Collector] | None = None, detectors: list[Detector] | None = None,
                   stall: StallDetector | None = None, memory: DetectorMemory | None = None,
                   agents: NodeAgentFeed | None = None) -> Pipeline:
    """The loop, filing what it finds through `incidents`. `metrics` (also mounted at /metrics by the API) is kept
    up to date after every tick, with each job's progress from `stall` (the stall detector among `detectors`).
    `collectors` / `detectors` / `stall`: instead of the ones settings describe. `memory`: where the detectors
    built here keep their state across restarts (`argus serve` passes the store's `detector_state`). `agents`: what
    node agents sent (argus/agents): lines for the Ray log collector, GPU readings for AgentGpuCollector."""
    metric_rules = load_metric_rules(settings.metric_rules_dirs)
    metrics = metrics or ArgusMetrics()
    stall = stall or build_stall_detector(settings, memory)
    training = next((d for d in detectors or [] if isinstance(d, TrainingHealthDetector)), None) \
        or build_training_detector(settings)
    pipeline: Pipeline

    def after_tick(result: TickResult) -> None:
        metrics.observe_tick(result, pipeline.sources)
        metrics.set_job_progress(stall.progress())
        metrics.set_train_metrics(training.series())
        metrics.refresh_incidents(incidents.store)  # also catches what changed without an event (merged echoes)

    if collectors is None:
        collectors = build_collectors(settings, metric_rules, metrics, agents)
        if settings.hang_stacks:  # what confirms a suspected hang at once, or holds the call back during silent work
            collectors.append(RankStackSampler(settings.ray_dashboard_url, stall.stack_requests,
                                               timeout_s=settings.request_timeout_s))
    pipeline = Pipeline(
        collectors=collectors,
        detectors=detectors or build_detectors(settings, metric_rules, stall, memory, training),
        incidents=incidents,
        # no new log lines because the log collectors are down is not a stalled job; a rule Prometheus could not
        # evaluate has not stopped holding; a job status Ray did not report this tick is not a job running again
        needs={"stall": {"ray_logs", "job_logs"}, "idle_gpu": {"gpu_placement"}, "metric_rules": {"metric_rules"},
               "job_failure": {"ray_state"}, "lost_node": {"ray_state"}, "waiting": {"ray_state"}},
        on_tick=after_tick,
        collect_timeout_s=settings.collect_timeout_s,
    )
    return pipeline


def build_node_agents(settings: Settings, store: Store, control: ControlPlane,
                      metrics: ArgusMetrics) -> tuple[AgentInbox, FleetSupervisor]:
    """The inbox node agents send to and the supervisor that keeps their fleet job running (argus/agents)."""
    inbox = AgentInbox(stale_after_s=max(30.0, 10 * settings.node_agent_interval_s))
    url = settings.node_agent_url or f"http://{primary_ip()}:{settings.api_port}"
    fleet = FleetSupervisor(lambda: control.jobs.client, central_url=url, token=agent_token(store, settings.data_dir),
                            inbox=inbox, metrics=metrics, interval_s=settings.node_agent_interval_s,
                            kernel_log=settings.node_agent_kernel_log, history_window_s=settings.history_window_s,
                            nvml=settings.agents_read_gpus)
    return inbox, fleet


def build_control(settings: Settings, store: Store, *, metrics: ArgusMetrics | None = None) -> ControlPlane:
    """The control plane the API acts through: jobs over the Jobs SDK, nodes over SSH (when the GCS address
    is set) with their registry in the store."""
    jobs = JobController(
        settings.ray_dashboard_url,
        settings.shared_root,
        request_timeout_s=settings.request_timeout_s,
        code_roots=settings.effective_code_roots,
    )
    registry = store.nodes()
    manager = None
    if settings.ray_gcs_address:
        manager = NodeManager(registry, gcs_address=settings.ray_gcs_address, dashboard_url=settings.ray_dashboard_url)
    else:
        logger.info("no ray_gcs_address: nodes can be registered and listed but not joined, drained or taken offline")
    queue = job_queue(store.job_queue, jobs, registry, timeout_s=settings.request_timeout_s,
                      default_timeout_s=settings.job_queue_timeout_s, user_limit=settings.user_gpu_limit_of,
                      observe=metrics.observe_queue if metrics is not None else None)
    return ControlPlane(jobs=jobs, registry=registry, manager=manager, queue=queue,
                        ssh_key_dirs=tuple(settings.effective_ssh_key_dirs))
