"""History is not news, on the real local Ray cluster with Argus's own pipeline built from Settings.

Real: the Ray cluster (session fixture: head + 2 workers on loopback), every collector and detector that
argus.wiring builds from Settings (Ray state, placement, Ray's logs read through each node's agent, job logs on a
shared root in tmp_path), the desk over a real SQLite store, and a job submitted through the Jobs API.

1. A job folder whose log holds a CUDA OOM stamped two days ago (the file's mtime too), and a worker log on the
   head holding an unstamped OOM, last written two days ago: Argus's first ticks open nothing for either (the
   worker log dated by the mtime the node's agent sends), and the Ray logs it meets for the first time are dated
   by their own stamps; then an OOM line written now in the job's log opens exactly one incident.
2. A Ray job prints a CUDA OOM and goes on to succeed: a critical incident while it runs, resolved at warning with
   the reason once it SUCCEEDED, the resolve event saying what the severity was.
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from argus.exporter import ArgusMetrics
from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.store.store import Store
from argus.wiring import build_collectors, build_pipeline
from collectors.ray_logs import RayLogsCollector
from core import signal_keys as keys
from core.settings import load_settings
from core.types import Category, IncidentState, Severity, Signal
from detectors.metric_rules import load_metric_rules
from tests.helpers import wait_until
from tests.support import RecordingSubscriber

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"
OLD_JOB = "raysubmit_history_" + uuid.uuid4().hex[:8]

# Prints an OOM the way a retried step does, then waits for the test to say Argus has seen it, and exits 0.
RETRIED_OOM_JOB = f"""
import os, sys, time
print({OOM!r}, flush=True)
print("retrying the step with a smaller micro-batch", flush=True)
deadline = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
print("step 2 done", flush=True)
"""


class Recording:
    """A collector that hands on what the real one collects and keeps it, to look at what Argus read."""

    def __init__(self, inner: RayLogsCollector) -> None:
        self.inner, self.name, self.seen = inner, inner.name, []

    def collect(self) -> list[Signal]:
        signals = self.inner.collect()
        self.seen += signals
        return signals


def logged(at: datetime, text: str) -> str:
    """A Python-logging line stamped at `at` on this host's wall clock (how the cluster's logs are written)."""
    return f"{at.astimezone():%Y-%m-%d %H:%M:%S},000 ERROR {text}\n"


def test_first_start_opens_nothing_for_history_and_a_retried_oom_ends_as_a_warning(ray_cluster, tmp_path: Path):
    from ray.job_submission import JobSubmissionClient

    root = tmp_path / "shared"
    log = root / "jobs" / OLD_JOB / "logs" / "train.log"
    log.parent.mkdir(parents=True)
    two_days_ago = datetime.now(timezone.utc) - timedelta(days=2)
    log.write_text(logged(two_days_ago, "Traceback (most recent call last):") + '  File "train.py", line 88\n'
                   + OOM + "\n")
    os.utime(log, (two_days_ago.timestamp(), two_days_ago.timestamp()))
    head_logs = ray_cluster.nodes[0].log_dir()
    assert head_logs is not None
    old_worker_log = head_logs / f"worker-{uuid.uuid4().hex[:40]}-ffffffff-4242.out"  # a worker no job claimed
    old_worker_log.write_text(OOM + "\n")
    os.utime(old_worker_log, (two_days_ago.timestamp(), two_days_ago.timestamp()))

    settings = load_settings(data_dir=tmp_path / "data", shared_root=root, ray_dashboard_url=ray_cluster.dashboard_url,
                             history_window_s=900)
    store = Store(settings.effective_database_url)
    recorder = RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    collectors = build_collectors(settings, load_metric_rules(settings.metric_rules_dirs), ArgusMetrics())
    [ray_logs] = [c for c in collectors if isinstance(c, RayLogsCollector)]
    recording = Recording(ray_logs)
    collectors[collectors.index(ray_logs)] = recording
    pipeline = build_pipeline(settings, desk, collectors=collectors)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    sid = None
    try:
        # 1. first start: the old OOM is history
        for _ in range(3):
            tick = pipeline.run_once()
            assert "job_logs" not in tick.errors and "ray_logs" not in tick.errors, tick.errors
        assert store.list_incidents(subject_id=OLD_JOB) == []
        dated = [s for s in recording.seen if keys.LINE_TIME in s.attrs]
        assert dated, "Ray's logs met for the first time were not dated"
        started = min(datetime.fromisoformat(s.attrs[keys.LINE_TIME]) for s in dated
                      if s.attrs[keys.FILE] == "raylet.out")
        assert datetime.now(timezone.utc) - timedelta(days=1) < started <= datetime.now(timezone.utc)
        [old_oom] = [s for s in recording.seen if s.attrs[keys.FILE] == old_worker_log.name]
        assert old_oom.attrs[keys.HISTORY] is True
        assert abs(datetime.fromisoformat(old_oom.attrs[keys.LINE_TIME]) - two_days_ago) < timedelta(seconds=2)
        assert not any(old_worker_log.name in i.summary for i in store.list_incidents())

        with open(log, "a") as f:
            f.write(logged(datetime.now(timezone.utc), OOM))

        def opened_for(subject: str):
            pipeline.run_once()
            return store.list_incidents(subject_id=subject)

        [incident] = wait_until("an incident for the new OOM line", lambda: opened_for(OLD_JOB), timeout=30)
        assert incident.category is Category.GPU_OOM and incident.severity is Severity.CRITICAL
        pipeline.run_once()
        assert len(store.list_incidents(subject_id=OLD_JOB)) == 1

        # 2. a job whose OOM did not end it
        flag = tmp_path / "argus-saw-it"
        script = tmp_path / "retried_oom.py"
        script.write_text(RETRIED_OOM_JOB)
        sid = client.submit_job(entrypoint=f"{sys.executable} {script} {flag}")
        [running] = wait_until("a critical incident while the job runs", lambda: opened_for(sid), timeout=90)
        assert running.category is Category.GPU_OOM and running.severity is Severity.CRITICAL
        assert running.state is IncidentState.OPEN
        flag.touch()

        def resolved():
            pipeline.run_once()
            return store.get_incident(running.id).state is IncidentState.RESOLVED

        wait_until("the incident to close once the job SUCCEEDED", resolved, timeout=90)
        assert str(client.get_job_status(sid)) in ("SUCCEEDED", "JobStatus.SUCCEEDED")
        closed = store.get_incident(running.id)
        assert closed.severity is Severity.WARNING
        assert closed.attrs["severity_changes"][-1]["reason"].startswith(f"job {sid} SUCCEEDED: the error at ")
        assert desk.events.drain()
        [event] = [e for e in recorder.events if e.kind is EventKind.RESOLVED and e.incident.id == running.id]
        assert event.detail["severity_was"] == "critical" and event.incident.severity is Severity.WARNING
        assert event.detail["reason"].endswith("did not end it")
    finally:
        old_worker_log.unlink(missing_ok=True)
        for collector in collectors:
            close = getattr(getattr(collector, "inner", collector), "close", None)
            if close is not None:
                close()
        store.close()
        if sid is not None:
            try:
                client.stop_job(sid)
            except Exception:
                pass  # it ended on its own
