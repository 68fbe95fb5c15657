"""Argus's own /metrics: served by a real uvicorn server on a loopback port, read over HTTP with httpx and
parsed with prometheus_client's parser, as Prometheus would scrape it.

Real: the HTTP server, the SQLite incident store, a pipeline tick against a dcgm-exporter SIMULATOR
(real HTTP) and an unreachable Ray address. Job placements and findings are built as values.
Argus's health metrics move through the objects `argus serve` wires (wiring.build_pipeline, build_dispatcher,
build_remediator): a real notification receiver, the real store and remediation runner; the job's state and log
lines are fed as signals, the values the Ray collectors would produce.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from argus.exporter import (
    ACTION_OUTCOMES,
    MAX_OPEN_INCIDENT_SERIES,
    ArgusMetrics,
    exported_series_names,
    metrics_router,
)
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind, IncidentEvent
from argus.pipeline import Pipeline
from argus.store.store import Store
from argus.wiring import build_control, build_dispatcher, build_incidents, build_pipeline, build_remediator
from collectors.dcgm import DcgmScrapeCollector
from collectors.placement import GpuPlacementCollector, JobPlacement, NodeGpus
from collectors.ray_state import RayStateCollector
from core.settings import load_settings
from core.types import (
    ActionState,
    Category,
    Finding,
    IncidentState,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
)
from detectors.idle_gpu import IdleGpuDetector
from detectors.stall import StallDetector
from remediation.actions import STEPS
from remediation.runner import FINAL_STATES
from stage.localstack.ports import free_port
from stage.localstack.webhook_receiver import Reply, WebhookReceiver
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import served_app
from tests.support import Clock

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def served() -> Iterator[tuple[ArgusMetrics, str]]:
    """ArgusMetrics behind a real HTTP server: the router mounted in a FastAPI app under uvicorn."""
    metrics = ArgusMetrics()
    app = FastAPI()
    app.include_router(metrics_router(metrics))
    with served_app(app) as url:
        yield metrics, url


def scrape(base: str) -> dict[str, list]:
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def placement(sid: str | None, job_id: str, owner: str | None, *nodes: tuple[str, str, float]):
    return JobPlacement(job_id, sid, "RUNNING", owner, "python train.py --lr 3e-4",
                        tuple(NodeGpus(nid, ip, ip, gpus, 8) for nid, ip, gpus in nodes))


def finding(category: Category, latency_s: float, subject_id: str = "job-x") -> Finding:
    return Finding(category=category, reason="Test", subject=Subject(kind=SubjectKind.JOB, id=subject_id),
                   summary="a finding", first_seen=T0, detected_at=T0 + timedelta(seconds=latency_s))


def test_job_gpus_are_served_and_replaced_as_a_whole(served):
    metrics, base = served
    metrics.set_job_gpus([
        placement("raysubmit_a", "02000000", "alice", ("n1", "10.0.0.1", 8), ("n2", "10.0.0.2", 2)),
        placement(None, "03000000", None, ("n2", "10.0.0.2", 0.5)),
    ])
    rows = {(s.labels["job_id"], s.labels["node_ip"]): s for s in scrape(base)["argus_job_gpus"]}
    assert {k: s.value for k, s in rows.items()} == {
        ("02000000", "10.0.0.1"): 8, ("02000000", "10.0.0.2"): 2, ("03000000", "10.0.0.2"): 0.5}
    assert rows[("02000000", "10.0.0.1")].labels == {
        "submission_id": "raysubmit_a", "job_id": "02000000", "node_ip": "10.0.0.1", "node_id": "n1",
        "owner": "alice"}
    # a driver started without the Jobs API has no submission id
    assert rows[("03000000", "10.0.0.2")].labels["submission_id"] == ""

    metrics.set_job_gpus([placement("raysubmit_b", "04000000", "bob", ("n1", "10.0.0.1", 4))])
    rows = scrape(base)["argus_job_gpus"]
    assert [(s.labels["submission_id"], s.value) for s in rows] == [("raysubmit_b", 4)]


def test_entrypoint_label_is_opt_in_and_truncated():
    metrics = ArgusMetrics(include_entrypoint=True, entrypoint_max_chars=12)
    metrics.set_job_gpus([placement("s", "02000000", "alice", ("n1", "10.0.0.1", 1))])
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    [sample] = families["argus_job_gpus"].samples
    assert sample.labels["entrypoint"] == "python train"


def test_findings_latency_incidents_and_collectors(served, tmp_path):
    metrics, base = served
    before = scrape(base)
    assert {s.labels["category"] for s in before["argus_findings"] if s.name == "argus_findings_total"} == {
        c.value for c in Category}
    assert all(s.value == 0 for s in before["argus_incidents_open"])
    assert "argus_collector_up" not in before or before["argus_collector_up"] == []

    metrics.finding_recorded(finding(Category.IDLE_GPU, 630))
    metrics.finding_recorded(finding(Category.NODE_LOST, 2))

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        store.record_finding(finding(Category.IDLE_GPU, 600, "job-1"))
        store.record_finding(finding(Category.IDLE_GPU, 600, "job-2"))
        store.record_finding(finding(Category.NODE_LOST, 1, "node-1"))
        metrics.refresh_incidents(store)
    finally:
        store.close()

    with DcgmExporterSim("gpu-node-1", gpus=2) as sim:
        pipeline = Pipeline(
            collectors=[DcgmScrapeCollector([sim.metrics_url]),
                        GpuPlacementCollector("http://127.0.0.1:9", timeout_s=1)],
            detectors=[IdleGpuDetector()],
            incidents=IncidentDesk(store=None),  # no findings without placement, so nothing is filed
        )
        metrics.observe_tick(pipeline.run_once(), pipeline.sources)

    after = scrape(base)
    totals = {s.labels["category"]: s.value for s in after["argus_findings"]
              if s.name == "argus_findings_total"}
    assert totals["idle_gpu"] == 1 and totals["node_lost"] == 1 and totals["gpu_oom"] == 0
    open_ = {s.labels["category"]: s.value for s in after["argus_incidents_open"]}
    assert open_["idle_gpu"] == 2 and open_["node_lost"] == 1 and open_["host_oom"] == 0
    up = {s.labels["collector"]: s.value for s in after["argus_collector_up"]}
    assert up == {"dcgm": 1, "gpu_placement": 0}

    hist = after["argus_detection_latency_seconds"]
    count = {s.labels["category"]: s.value for s in hist if s.name.endswith("_count")}
    assert count == {"idle_gpu": 1, "node_lost": 1}
    buckets = {(s.labels["category"], s.labels["le"]): s.value for s in hist if s.name.endswith("_bucket")}
    assert buckets[("idle_gpu", "600.0")] == 0 and buckets[("idle_gpu", "660.0")] == 1
    assert buckets[("node_lost", "2.5")] == 1


# -- Argus's own health: the loop, collectors, incidents, notifications, remediation, job progress ---------


class Feed:
    """A collector over a list the test fills: the job's state and log lines as the Ray collectors give them."""

    name = "feed"

    def __init__(self) -> None:
        self.signals: list[Signal] = []

    def collect(self) -> list[Signal]:
        out, self.signals = self.signals, []
        return out


def job_state(sid: str, status: str) -> Signal:
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", subject=Subject(kind=SubjectKind.JOB, id=sid),
                  attrs={"status": status})


def log_line(sid: str, text: str, at: datetime, n: int) -> Signal:
    return Signal(kind=SignalKind.LOG_LINE, source=f"/shared/jobs/{sid}/logs/driver.log", line=n, text=text,
                  observed_at=at, subject=Subject(kind=SubjectKind.JOB, id=sid), attrs={"stream": "job-logs"})


def samples_of(families: dict[str, list], family: str, sample: str | None = None) -> dict[tuple, float]:
    """{label values in name order: value} of one family's samples named `sample` (default: the family)."""
    return {tuple(s.labels.values()): s.value for s in families.get(family, []) if s.name == (sample or family)}


def test_the_loop_reports_ticks_collector_errors_openings_annotations_and_job_steps(served, tmp_path):
    """One real pipeline from wiring.build_pipeline (its after-tick hook is what `argus serve` runs): a job
    prints steps, stalls, an incident opens, the incident is resolved, the job finishes; a Ray collector
    pointed at a closed port fails every tick."""
    metrics, base = served
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root")
    store = Store(settings.effective_database_url)
    clock, feed = Clock(T0), Feed()
    stall = StallDetector(min_stall_s=30, factor=3, clock=clock)
    dead = RayStateCollector(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    desk = build_incidents(settings, store, metrics=metrics)
    pipeline = build_pipeline(settings, desk, metrics=metrics, collectors=[feed, dead], detectors=[stall], stall=stall)
    try:
        before = scrape(base)
        assert before["argus_loop_last_tick_timestamp_seconds"][0].value == 0  # never ticked
        assert set(samples_of(before, "argus_incidents_opened", "argus_incidents_opened_total")) == {
            (c.value,) for c in Category}
        assert samples_of(before, "argus_job_step") == {}

        sid = "raysubmit_steps"
        feed.signals = [job_state(sid, "RUNNING")] + [
            log_line(sid, f"step:{n} - loss:0.5", T0 + timedelta(seconds=10 * n), n) for n in range(1, 6)]
        clock.now = T0 + timedelta(seconds=55)
        started = time.time()
        first = pipeline.run_once()
        assert first.errors.keys() == {"ray_state"} and first.opened == []
        after = scrape(base)
        assert started <= after["argus_loop_last_tick_timestamp_seconds"][0].value <= time.time()
        assert samples_of(after, "argus_loop_tick_duration_seconds", "argus_loop_tick_duration_seconds_count") == {
            (): 1}
        assert samples_of(after, "argus_collector_errors", "argus_collector_errors_total") == {
            ("feed",): 0, ("ray_state",): 1}
        assert samples_of(after, "argus_job_step") == {(sid,): 5}
        assert samples_of(after, "argus_job_step_interval_seconds") == {(sid,): 10}

        clock.now = T0 + timedelta(seconds=50 + 25)  # 25 s without a step: under 3 x 10 s it is not a stall
        assert pipeline.run_once().opened == []
        clock.now = T0 + timedelta(seconds=50 + 200)  # now it is: the job's rhythm was one step every 10 s
        opened = pipeline.run_once().opened
        assert [i.category for i in opened] == [Category.NCCL_HANG]
        assert desk.events.drain(30)  # the metrics subscriber counts it off the loop's thread
        after = scrape(base)
        assert samples_of(after, "argus_incidents_opened", "argus_incidents_opened_total")[("nccl_hang",)] == 1
        assert sum(samples_of(after, "argus_incidents_opened", "argus_incidents_opened_total").values()) == 1
        assert samples_of(after, "argus_collector_errors", "argus_collector_errors_total")[("ray_state",)] == 3
        [annotation] = after["argus_incident_opened_timestamp_seconds"]
        assert annotation.labels == {"incident_id": opened[0].id, "category": "nccl_hang", "submission_id": sid,
                                     "node": ""}
        assert annotation.value == opened[0].detected_at.timestamp()
        assert samples_of(after, "argus_loop_tick_duration_seconds", "argus_loop_tick_duration_seconds_count") == {
            (): 3}

        store.set_state(opened[0].id, IncidentState.RESOLVED)
        feed.signals = [job_state(sid, "SUCCEEDED")]
        pipeline.run_once()
        after = scrape(base)
        assert after.get("argus_incident_opened_timestamp_seconds", []) == []
        assert samples_of(after, "argus_job_step") == {} and samples_of(after, "argus_job_step_interval_seconds") == {}
    finally:
        desk.events.close()
        store.close()


def test_annotation_series_name_the_node_are_bounded_and_cut_hostile_labels(tmp_path):
    metrics = ArgusMetrics()
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        node = Subject(kind=SubjectKind.NODE, id="f" * 56, name="10.0.0.7")
        lost, _ = store.record_finding(Finding(
            category=Category.NODE_LOST, reason="RayNodeDead", subject=node, summary="node died", first_seen=T0,
            detected_at=T0 + timedelta(seconds=5)))
        # An Alertmanager alert's labels end up in attrs: a 4 kB "ip" must not become a 4 kB label value.
        alert, _ = store.record_finding(Finding(
            category=Category.GPU_OOM, reason="GpuMemoryNearlyFull", subject=Subject(kind=SubjectKind.GPU, id="g"),
            summary="s", first_seen=T0, detected_at=T0 + timedelta(seconds=6),
            attrs={"node_ip": "1" * 4000, "submission_id": "raysubmit_x"}))
        store.set_state(alert.id, IncidentState.MITIGATING)  # mitigating is still open
        metrics.refresh_incidents(store)
        families = {f.name: f.samples for f in text_string_to_metric_families(metrics.render().decode())}
        rows = {s.labels["incident_id"]: s for s in families["argus_incident_opened_timestamp_seconds"]}
        assert rows[lost.id].labels["node"] == "10.0.0.7" and rows[lost.id].labels["submission_id"] == ""
        assert rows[alert.id].labels["node"] == "1" * 200 and rows[alert.id].labels["submission_id"] == "raysubmit_x"

        for n in range(MAX_OPEN_INCIDENT_SERIES + 20):
            store.record_finding(finding(Category.IDLE_GPU, 1, f"job-{n}"))
        metrics.refresh_incidents(store)
        families = {f.name: f.samples for f in text_string_to_metric_families(metrics.render().decode())}
        assert len(families["argus_incident_opened_timestamp_seconds"]) == MAX_OPEN_INCIDENT_SERIES
        assert samples_of(families, "argus_incidents_open")[("idle_gpu",)] == MAX_OPEN_INCIDENT_SERIES + 20
    finally:
        store.close()


def test_notification_outcomes_are_counted_per_configured_channel(tmp_path):
    """The dispatcher wiring builds for `argus serve`, posting to a real receiver that accepts, then refuses."""
    metrics = ArgusMetrics()
    with WebhookReceiver() as receiver:
        settings = load_settings(data_dir=tmp_path, im_first_message_wait_s=0, notify_channels=[  # each told at once
            {"kind": "webhook", "url": f"{receiver.url}/hook", "secret": "argus-secret", "name": "ops-agent"}])
        store = Store(settings.effective_database_url)
        dispatcher = build_dispatcher(settings, store, metrics=metrics)
        assert dispatcher is not None
        try:
            declared = samples_of(_families(metrics), "argus_notifications", "argus_notifications_total")
            assert declared == {("ops-agent", "sent"): 0, ("ops-agent", "failed"): 0}
            incident, _ = store.record_finding(finding(Category.GPU_OOM, 3, "raysubmit_n"))
            assert dispatcher.notify(incident, "opened") is True
            receiver.set_reply(lambda post: Reply(status=403, body={"error": "bad signature"}))
            mitigating = store.set_state(incident.id, IncidentState.MITIGATING)
            assert dispatcher.notify(mitigating, "updated") is False  # 403: given up at once, not retried
        finally:
            dispatcher.close()
            store.close()
        assert len(receiver.received) == 2
    counted = samples_of(_families(metrics), "argus_notifications", "argus_notifications_total")
    assert counted == {("ops-agent", "sent"): 1, ("ops-agent", "failed"): 1}
    assert "127.0.0.1" not in metrics.render().decode()  # channels are named, never by their URL


def test_remediation_steps_are_counted_when_they_reach_a_final_state(tmp_path):
    """The runner wiring builds, in approval mode over a Ray address nobody listens on: one step rejected, the
    others approved and run to whatever end they reach; the counts match the store's record exactly, and each
    step's end asks for the incident's report to be refreshed and is announced (STEP_FINISHED, for IM and webhooks)."""
    metrics = ArgusMetrics()
    refreshed: list[str] = []
    announced: list[IncidentEvent] = []

    class Events:
        def publish(self, event: IncidentEvent) -> None:
            announced.append(event)

    class Reports:
        def refresh(self, incident_id: str) -> None:
            refreshed.append(incident_id)

    (tmp_path / "shared" / "jobs").mkdir(parents=True)
    dead = f"http://127.0.0.1:{free_port()}"
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "shared", remediation_mode="approval",
                             ray_dashboard_url=dead, request_timeout_s=2)
    store = Store(settings.effective_database_url)
    try:
        remediator = build_remediator(settings, store, build_control(settings, store), metrics=metrics,
                                      reports=Reports(), events=Events())  # type: ignore[arg-type]
        declared = samples_of(_families(metrics), "argus_actions", "argus_actions_total")
        assert set(declared) == {(k, o) for k in STEPS for o in ACTION_OUTCOMES} and set(declared.values()) == {0}
        incident, _ = store.record_finding(Finding(
            category=Category.NODE_LOST, reason="RayNodeDead", subject=Subject(kind=SubjectKind.NODE, id="n1",
                                                                               name="10.0.0.9"),
            summary="node died", severity=Severity.CRITICAL, first_seen=T0, attrs={"node_ip": "10.0.0.9"}))
        keep, drain, resubmit = remediator.plan(incident)
        remediator.reject(drain.id, who="ops", reason="not this node")
        remediator.approve(keep.id, who="ops")
        remediator.approve(resubmit.id, who="ops")
        for _ in range(2):  # steps run in order: one pass per step
            remediator.run_pending()
    finally:
        store.close()
    final = {a.kind: a.state for a in store_actions(settings)}
    # the scene is kept from what can be reached; no job ran on the node, so there is nothing to resubmit
    assert final == {"keep_scene": ActionState.SUCCEEDED, "drain_node": ActionState.REJECTED,
                     "resubmit_job": ActionState.SKIPPED}
    counted = {k: v for k, v in samples_of(_families(metrics), "argus_actions", "argus_actions_total").items() if v}
    assert counted == {(kind, state.value): 1 for kind, state in final.items()}
    assert refreshed == [incident.id] * 3
    assert {(e.kind, e.incident.id) for e in announced} == {(EventKind.STEP_FINISHED, incident.id)}
    assert [(e.actions[0].kind, e.actions[0].state) for e in announced] == [
        ("drain_node", ActionState.REJECTED), ("keep_scene", ActionState.SUCCEEDED),
        ("resubmit_job", ActionState.SKIPPED)]  # in the order they ended, each once
    assert set(ACTION_OUTCOMES) == {s.value for s in FINAL_STATES}


def store_actions(settings) -> list:
    store = Store(settings.effective_database_url)
    try:
        return store.list_actions()
    finally:
        store.close()


def _families(metrics: ArgusMetrics) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(metrics.render().decode())}


def test_bad_outcomes_are_refused_and_series_names_cover_every_family():
    metrics = ArgusMetrics()
    with pytest.raises(ValueError, match="not one of"):
        metrics.notification_delivered("ops", "https://hooks.example/secret")
    with pytest.raises(ValueError, match="final state"):
        metrics.action_finished("drain_node", "running")
    names = exported_series_names(metrics.registry)
    assert {"argus_notifications_total", "argus_loop_tick_duration_seconds_bucket",
            "argus_loop_last_tick_timestamp_seconds", "argus_collector_up", "argus_job_step"} <= names
    assert "argus_notifications" not in names  # a counter is exposed with _total only


def test_the_job_queue_is_exported_by_pool_with_waits_and_what_left_it():
    from control.queue import TickOutcome

    metrics = ArgusMetrics()
    metrics.observe_queue(TickOutcome(started=["a", "b"], expired=["c"], waited_s={"a": 3.0, "b": 700.0},
                                      waiting_by_pool={"h20": 2, "": 1}))
    families = _families(metrics)
    assert samples_of(families, "argus_jobs_queued") == {("h20",): 2, ("",): 1}
    assert samples_of(families, "argus_job_queue_wait_seconds", "argus_job_queue_wait_seconds_count") == {(): 2}
    assert samples_of(families, "argus_job_queue_left", "argus_job_queue_left_total") == {("expired",): 1,
                                                                                         ("failed",): 0}
    metrics.observe_queue(TickOutcome(waiting_by_pool={}))  # the queue emptied: its series go
    assert samples_of(_families(metrics), "argus_jobs_queued") == {}


def test_training_metrics_are_exported_per_job_and_replaced_as_a_whole():
    metrics = ArgusMetrics()
    metrics.set_train_metrics({"grpo-1": {"loss": 0.5, "grad_norm": float("nan")}, "sft-2": {"lr": 2e-05}})
    got = samples_of(_families(metrics), "argus_job_train_metric")  # labels as exposed: metric, submission_id
    assert got[("loss", "grpo-1")] == 0.5 and math.isnan(got[("grad_norm", "grpo-1")])
    assert got[("lr", "sft-2")] == 2e-05
    metrics.set_train_metrics({"sft-2": {"lr": 1e-05}})  # grpo-1's series are gone with it
    assert samples_of(_families(metrics), "argus_job_train_metric") == {("lr", "sft-2"): 1e-05}


def test_job_info_names_the_running_jobs_and_their_wandb_runs():
    from control.jobs import JobRecord

    metrics = ArgusMetrics()
    metrics.set_job_info([
        JobRecord("grpo-1", "RUNNING", None, name="grpo", owner="alice", workload="grpo", wandb_project="qwen",
                  wandb_url="https://wandb.ai/team/qwen/runs/grpo-1"),
        JobRecord("sft-2", "SUCCEEDED", None, name="sft", owner="bob", workload="sft"),
    ])
    assert samples_of(_families(metrics), "argus_job_info") == {  # labels as exposed, in name order
        ("grpo", "alice", "grpo-1", "qwen", "https://wandb.ai/team/qwen/runs/grpo-1", "grpo"): 1}
