"""One fault, one incident: shared storage that fills up is first a trend warning, then a threshold breach; through
the real loop and store both are the same incident, whose severity rises to critical, each claim kept as a finding;
space coming back closes it once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.pipeline import Pipeline
from core.types import Category, IncidentState, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.disk_space import DiskSpaceDetector
from tests.support import Clock, Feed, RecordingSubscriber

T0 = datetime.now(timezone.utc)  # the correlator looks back from now
GB = 1e9
TB = 1e12


def storage(avail: float, at: datetime) -> Signal:
    """What collectors/storage.py emits for /mnt/shared."""
    return Signal(kind=SignalKind.METRIC, source="statvfs:/mnt/shared", observed_at=at, value=avail,
                  subject=Subject(kind=SubjectKind.CLUSTER, id="/mnt/shared", name="shared storage"),
                  attrs={"metric": "storage_free_bytes", "path": "/mnt/shared", "total_bytes": TB,
                         "free_bytes": avail, "avail_bytes": avail, "used_fraction": 1 - avail / TB,
                         "inodes_total": 10_000_000, "inodes_free": 5_000_000, "inodes_avail": 5_000_000})



def test_trend_then_threshold_is_one_incident_whose_severity_rises(store):
    clock, feed, recorder = Clock(T0), Feed(), RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    pipeline = Pipeline(collectors=[feed], detectors=[DiskSpaceDetector(clock=clock)], incidents=desk, clock=clock)
    # 80 GB free losing 2 GB a minute: a trend after 5 minutes, under the 5% floor (50 GB) after 16; then cleaned up
    frees = [80 * GB - i * 2 * GB for i in range(31)] + [400 * GB] * 8
    try:
        ticks = []
        for minute, avail in enumerate(frees):
            clock.now = T0 + timedelta(minutes=minute)
            feed.batch = [storage(avail, clock.now)]
            ticks.append(pipeline.run_once())
        opened = [i for t in ticks for i in t.opened]
        [incident] = opened
        filed = [(n, f.reason, f.severity) for n, t in enumerate(ticks) for f in t.findings]
        assert [r for _, r, _ in filed] == ["StorageFillingUp", "StorageNearlyFull"]
        assert ticks[filed[0][0]].opened and not ticks[filed[1][0]].opened  # the breach folded into the trend's

        kept = store.findings_for(incident.id)
        assert [f.reason for f in kept] == ["StorageFillingUp", "StorageNearlyFull"]
        assert incident.severity is Severity.WARNING and incident.category is Category.DISK_FULL

        resolved = [i for t in ticks for i in t.resolved]
        assert [i.id for i in resolved] == [incident.id]  # closed once, though two claims had held
        final = store.get_incident(incident.id)
        assert final.severity is Severity.CRITICAL and final.state is IncidentState.RESOLVED
        assert final.occurrences == 2
        assert len(store.list_incidents(category=Category.DISK_FULL)) == 1

        assert desk.events.drain(10)
        # the rise is told once, as an update with why; the resolve after it
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.UPDATED, EventKind.RESOLVED]
        raised = recorder.events[1]
        assert raised.incident.severity is Severity.CRITICAL and raised.incident.state is IncidentState.OPEN
        assert raised.detail["reason"].startswith("severity raised to critical: ")
        assert recorder.events[2].incident.severity is Severity.CRITICAL
        [change] = final.attrs["severity_changes"]
        assert (change["from"], change["to"]) == ("warning", "critical") and "StorageNearlyFull" in change["reason"]
    finally:
        desk.events.close()
