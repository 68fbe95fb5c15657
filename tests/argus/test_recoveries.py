"""A fault that ends closes its incident, through the real loop: the idle-GPU and disk-space detectors tell their
recoveries, the desk resolves the incident over a real SQLite store and the bus announces it with the reason; so do
a metric rule (through the real wiring's `needs`, across a Prometheus outage) and a failed job resubmitted by Argus.
(The stall detector's is in test_incidents.py, the lost node's in test_lost_node_e2e.py.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.pipeline import Pipeline
from argus.store.store import Store
from argus.wiring import build_pipeline
from core.errors import SourceUnavailable
from core.ports import Detector
from core.settings import load_settings
from core.types import Category, IncidentState, Signal, SignalKind, Subject, SubjectKind
from detectors.disk_space import DiskSpaceDetector
from detectors.engine import load_rules
from detectors.idle_gpu import IdleGpuDetector
from detectors.job_failure import JobFailureDetector
from detectors.metric_rules import MetricRuleDetector, load_metric_rules
from tests.support import Clock, RecordingSubscriber
from tests.support.job_states import ARGUS, job_state, resubmission

T0 = datetime.now(timezone.utc)  # the correlator looks back 30 minutes from now
GB = 1e9


class Feed:
    """A collector over signals the test hands it, one batch per tick."""

    name = "feed"

    def __init__(self) -> None:
        self.batches: list[list[Signal]] = []

    def collect(self) -> list[Signal]:
        return self.batches.pop(0) if self.batches else []


def loop(store: Store, detector: Detector, clock: Clock) -> tuple[Pipeline, Feed, RecordingSubscriber]:
    feed, recorder = Feed(), RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    return Pipeline(collectors=[feed], detectors=[detector], incidents=desk, clock=clock), feed, recorder


def placement(sid: str, at: datetime, util: float) -> list[Signal]:
    """A snapshot with one 4-GPU node, job `sid` RUNNING on all of it, and the node's 4 GPUs at `util`%."""
    node = {"node_id": "node-w1", "node_ip": "10.0.0.3", "node_name": "10.0.0.3", "state": "ALIVE", "gpus_total": 4}
    snapshot = Signal(kind=SignalKind.METRIC, source="ray.placement", observed_at=at,
                      subject=Subject(kind=SubjectKind.CLUSTER, id="ray"),
                      attrs={"metric": "argus_gpu_placement", "nodes": [node]})
    job = Signal(kind=SignalKind.METRIC, source="ray.placement", observed_at=at, value=4.0,
                 subject=Subject(kind=SubjectKind.JOB, id=sid),
                 attrs={"metric": "argus_job_gpus", "submission_id": sid, "status": "RUNNING", "owner": "alice",
                        "nodes": [{"node_id": "node-w1", "node_ip": "10.0.0.3", "gpus": 4.0, "node_gpus_total": 4.0,
                                   "whole_node": True}]})
    gpus = [Signal(kind=SignalKind.METRIC, source="http://10.0.0.3:9400/metrics", observed_at=at,
                   value=util if i == 2 else 0.0, subject=Subject(kind=SubjectKind.GPU, id=f"GPU-w1-{i}"),
                   attrs={"metric": "DCGM_FI_DEV_GPU_UTIL", "hostname": "w1", "gpu": i})
            for i in range(4)]
    return [snapshot, job, *gpus]


def test_an_idle_gpu_incident_closes_when_the_job_uses_its_gpus_again(store):
    sid, clock = "raysubmit_idle", Clock(T0)
    detector = IdleGpuDetector(threshold_pct=5, window_s=60, clock=clock)
    pipeline, feed, recorder = loop(store, detector, clock)
    try:
        opened = []
        for n in range(3):  # idle at 0, 30 and 60 s: a whole window
            clock.now = T0 + timedelta(seconds=30 * n)
            feed.batches = [placement(sid, clock.now, util=0.0)]
            opened += pipeline.run_once().opened
        [incident] = opened
        assert incident.category is Category.IDLE_GPU and incident.state is IncidentState.OPEN

        clock.now = T0 + timedelta(seconds=90)
        feed.batches = [placement(sid, clock.now, util=37.0)]
        tick = pipeline.run_once()
        assert [i.id for i in tick.resolved] == [incident.id] and tick.opened == []
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED

        reason = "GPU utilisation back to 37% on 10.0.0.3 GPU 2 (at or over the 5% threshold)"
        assert pipeline.incidents.events.drain(10)
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
        assert recorder.events[1].incident.id == incident.id
        assert recorder.events[1].detail == {"by": "argus:idle_gpu", "reason": reason}

        clock.now = T0 + timedelta(seconds=120)
        feed.batches = [placement(sid, clock.now, util=80.0)]
        assert pipeline.run_once().resolved == []  # told once
    finally:
        pipeline.incidents.events.close()


def storage(avail: float, at: datetime, path: str = "/mnt/shared") -> Signal:
    total = 1000 * GB
    return Signal(kind=SignalKind.METRIC, source=f"statvfs:{path}", observed_at=at, value=avail,
                  subject=Subject(kind=SubjectKind.CLUSTER, id=path, name="shared storage"),
                  attrs={"metric": "storage_free_bytes", "path": path, "total_bytes": total, "avail_bytes": avail,
                         "free_bytes": avail, "used_fraction": 1 - avail / total, "inodes_total": 1_000_000,
                         "inodes_avail": 500_000})


def test_a_disk_full_incident_closes_when_space_is_back_past_the_margin(store):
    clock = Clock(T0)
    pipeline, feed, recorder = loop(store, DiskSpaceDetector(clock=clock), clock)
    # 3% free, then 6% (over the 5% floor, under the 7% line), then cleaned up to 40% free
    frees = [30 * GB, 30 * GB, 60 * GB, 60 * GB, 400 * GB, 400 * GB, 400 * GB]
    try:
        ticks = []
        for minute, avail in enumerate(frees):
            clock.now = T0 + timedelta(minutes=minute)
            feed.batches = [[storage(avail, clock.now)]]
            ticks.append(pipeline.run_once())
        [incident] = ticks[0].opened
        assert incident.category is Category.DISK_FULL
        # nothing closed at 6% (under the line) nor before a judgeable history (5 minutes of samples) said there is
        # no trend to full; then closed once
        assert [bool(t.resolved) for t in ticks] == [False] * 5 + [True, False]
        assert [i.id for i in ticks[5].resolved] == [incident.id]
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED

        assert pipeline.incidents.events.drain(10)
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
        detail = recorder.events[1].detail
        assert detail["by"] == "argus:disk_space"
        assert detail["reason"].startswith("shared storage /mnt/shared has 400.00 GB of 1000.00 GB free (40.0%)")
        assert "over the 7% line; free space not falling over the last 5 min" in detail["reason"]
    finally:
        pipeline.incidents.events.close()


class Outage(Feed):
    """A feed that can be down like a collector whose source is unreachable."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.down = name, False

    def collect(self) -> list[Signal]:
        if self.down:
            raise SourceUnavailable(self.name, "http://127.0.0.1:9", "connection refused")
        return super().collect()


HOT_GPU_RULE = """\
rules:
  - reason: HotGpu
    category: gpu_hardware
    severity: warning
    for: 1m
    expr: DCGM_FI_DEV_GPU_TEMP > 90
    summary: 'GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }} C'
"""


def hot_gpu(at: datetime, temp: float | None) -> list[Signal]:
    """One evaluation of HotGpu as collectors.metric_rules emits it: GPU-1 in it when `temp` is given."""
    marker = Signal(kind=SignalKind.METRIC, source="prometheus:test", observed_at=at,
                    value=0.0 if temp is None else 1.0, subject=Subject(kind=SubjectKind.CLUSTER, id="cluster"),
                    attrs={"rule": "HotGpu", "rule_evaluated": True})
    if temp is None:
        return [marker]
    labels = {"gpu": "1", "UUID": "GPU-1", "Hostname": "n1", "__name__": "DCGM_FI_DEV_GPU_TEMP"}
    return [marker, Signal(kind=SignalKind.METRIC, source="prometheus:test", observed_at=at, value=temp,
                           subject=Subject(kind=SubjectKind.GPU, id="GPU-1", name="n1/gpu1"),
                           attrs={"rule": "HotGpu", "metric": "DCGM_FI_DEV_GPU_TEMP", "labels": labels})]


def test_a_metric_rule_incident_stays_open_through_an_outage_and_closes_after_its_for(store, tmp_path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "hot.yaml").write_text(HOT_GPU_RULE)
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root",
                             prometheus_url="http://127.0.0.1:9", metric_rules_dirs=[tmp_path / "rules"])
    clock, feed, recorder = Clock(T0), Outage("metric_rules"), RecordingSubscriber()
    detector = MetricRuleDetector(load_metric_rules(settings.metric_rules_dirs), clock=clock)
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    pipeline = build_pipeline(settings, desk, collectors=[feed], detectors=[detector])  # the real `needs`

    def tick(seconds: float, temp: float | None, *, down: bool = False):
        clock.now = T0 + timedelta(seconds=seconds)
        feed.down, feed.batches = down, [hot_gpu(clock.now, temp)]
        return pipeline.run_once()

    try:
        assert tick(0, 95).opened == []
        [incident] = tick(60, 95).opened
        assert incident.category is Category.GPU_HARDWARE and incident.summary == "GPU 1 on n1 at 95 C"
        tick(90, None)  # absent from here...
        assert [tick(s, None, down=True).resolved for s in range(120, 600, 30)] == [[]] * 16  # ...Prometheus down
        assert [tick(s, 95).resolved for s in (600, 630)] == [[], []]  # it is back: the same fault goes on
        assert [bool(tick(s, None).resolved) for s in (660, 690, 720)] == [False, False, True]  # 1m absent
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED

        assert pipeline.incidents.events.drain(10)
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
        assert recorder.events[1].detail == {
            "by": "argus:metric_rules",
            "reason": f"metric rule HotGpu no longer holds for n1/gpu1: `DCGM_FI_DEV_GPU_TEMP > 90` returned no series "
                      f"for it since {T0 + timedelta(seconds=660):%Y-%m-%d %H:%M:%S} UTC (for: 1m)"}
    finally:
        pipeline.incidents.events.close()


def test_a_failed_jobs_incident_closes_when_argus_resubmission_of_it_runs(store):
    sid, clock = "grpo-20261122T084034Z-eff5", Clock(T0)
    detector = JobFailureDetector(load_rules(), clock=clock)
    pipeline, feed, recorder = loop(store, detector, clock)
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"

    def tick(seconds: float, *signals: Signal):
        clock.now = T0 + timedelta(seconds=seconds)
        feed.batches = [[job_state(sid, "FAILED", metadata=ARGUS, message=oom, at=T0), *signals]]
        return pipeline.run_once()

    try:
        [incident] = tick(0).opened
        assert incident.category is Category.GPU_OOM and incident.subject.id == sid
        # a person's own job under a look-alike id, and Argus's resubmission still PENDING: nothing closes
        look_alike = job_state(f"{sid}-r2", "RUNNING", at=clock.now)  # `ray job submit`: no Argus metadata
        assert tick(30, look_alike, resubmission(sid, 1, "PENDING", at=clock.now)).resolved == []
        [closed] = tick(60, resubmission(sid, 1, "RUNNING", at=clock.now)).resolved
        assert closed.id == incident.id and closed.state is IncidentState.RESOLVED
        assert tick(90, resubmission(sid, 1, "RUNNING", at=clock.now)).resolved == []

        assert pipeline.incidents.events.drain(10)
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
        assert recorder.events[1].detail == {
            "by": "argus:job_failure", "reason": f"job {sid} was resubmitted as {sid}-r1, which reached RUNNING"}
    finally:
        pipeline.incidents.events.close()
