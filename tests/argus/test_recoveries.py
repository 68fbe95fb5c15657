"""A fault that ends closes its incident, through the real loop: the idle-GPU and disk-space detectors tell their
recoveries, the desk resolves the incident over a real SQLite store and the bus announces it with the reason.
(The stall detector's is in test_incidents.py, the lost node's in test_lost_node_e2e.py.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.pipeline import Pipeline
from argus.store.store import Store
from core.ports import Detector
from core.types import Category, IncidentState, Signal, SignalKind, Subject, SubjectKind
from detectors.disk_space import DiskSpaceDetector
from detectors.idle_gpu import IdleGpuDetector
from tests.support import Clock, RecordingSubscriber

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
