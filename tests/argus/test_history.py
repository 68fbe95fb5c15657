"""History is not news, through the real loop: JobLogsCollector over real files, the built-in log rules, the desk
over a real SQLite store. A first start on an old log opens nothing and the next fault opens one incident; an
error line of a job that SUCCEEDED ends as a warning, resolved with its reason and announced with the severity it
had."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.types import Category, IncidentState, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector
from remediation.policy import load_policy
from tests.support import RecordingSubscriber

UTC = timezone.utc
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
SID = "raysubmit_history"


class States:
    """Ray's job states the test sets, as RayStateCollector reports them (a collector over what the test says)."""

    name = "ray_state"

    def __init__(self) -> None:
        self.status: str | None = None

    def collect(self) -> list[Signal]:
        if self.status is None:
            return []
        return [Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", subject=Subject(kind=SubjectKind.JOB, id=SID),
                       attrs={keys.STATUS: self.status, keys.SUBMISSION_ID: SID})]


def loop(store: Store, root: Path) -> tuple[Pipeline, States, RecordingSubscriber]:
    states, recorder = States(), RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    logs = JobLogsCollector(root, OffsetStore(root / "offsets.json"), history_window_s=900, log_zone=UTC)
    pipeline = Pipeline(collectors=[states, logs], detectors=[LogRuleDetector(load_rules())], incidents=desk)
    return pipeline, states, recorder


def job_log(root: Path) -> Path:
    folder = root / "jobs" / SID / "logs"
    folder.mkdir(parents=True)
    return folder / "train.log"


def logged(at: datetime, text: str) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S},000 ERROR {text}\n"


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_first_start_on_an_old_oom_opens_nothing_and_the_next_oom_opens_one_incident(store: Store,
                                                                                    tmp_path: Path) -> None:
    log = job_log(tmp_path)
    two_days_ago = datetime.now(UTC) - timedelta(days=2)
    log.write_text(logged(two_days_ago, "Traceback (most recent call last):") + '  File "train.py", line 9\n'
                   + OOM + "\n")
    os.utime(log, (two_days_ago.timestamp(), two_days_ago.timestamp()))
    pipeline, states, _ = loop(store, tmp_path)
    for _ in range(3):
        assert pipeline.run_once().opened == []
    assert store.list_incidents() == []

    append(log, logged(datetime.now(UTC), OOM))
    [incident] = pipeline.run_once().opened
    assert incident.category is Category.GPU_OOM and incident.severity is Severity.CRITICAL
    assert incident.subject.id == SID and pipeline.run_once().opened == []
    assert len(store.list_incidents()) == 1


def test_a_job_that_succeeded_after_an_oom_closes_it_as_a_warning(store: Store, tmp_path: Path) -> None:
    log = job_log(tmp_path)
    pipeline, states, recorder = loop(store, tmp_path)
    states.status = "RUNNING"
    log.write_text("step 1\n" + OOM + "\nretrying with a smaller micro-batch\nstep 2\n")
    [incident] = pipeline.run_once().opened
    assert incident.severity is Severity.CRITICAL

    states.status = "SUCCEEDED"
    tick = pipeline.run_once()
    assert [i.id for i in tick.resolved] == [incident.id]
    closed = store.get_incident(incident.id)
    assert closed.state is IncidentState.RESOLVED and closed.severity is Severity.WARNING
    reason = f"job {SID} SUCCEEDED: the error at {log}:2 did not end it"
    [change] = closed.attrs["severity_changes"]
    assert (change["from"], change["to"], change["reason"]) == ("critical", "warning", reason)

    assert pipeline.incidents.events.drain()
    resolved = [e for e in recorder.events if e.kind is EventKind.RESOLVED]
    assert [e.incident.id for e in resolved] == [incident.id]
    assert resolved[0].incident.severity is Severity.WARNING
    assert resolved[0].detail == {"by": "argus:log_rules", "reason": reason, "severity_was": "critical"}
    assert pipeline.run_once().resolved == []


def test_an_oom_of_a_job_already_succeeded_is_a_warning_resolved_at_once(store: Store, tmp_path: Path) -> None:
    log = job_log(tmp_path)
    pipeline, states, recorder = loop(store, tmp_path)
    states.status = "SUCCEEDED"
    log.write_text(OOM + "\nstep 2\n")
    tick = pipeline.run_once()
    [incident] = tick.opened
    assert incident.severity is Severity.WARNING and [i.id for i in tick.resolved] == [incident.id]
    assert store.get_incident(incident.id).state is IncidentState.RESOLVED
    assert pipeline.incidents.events.drain()
    assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
    assert "severity_was" not in recorder.events[1].detail  # it never was more than a warning

    # What remediation would do with it: the default policy keeps the scene of a gpu_oom at any severity and
    # nothing else (no resubmit, no drain), so a job that SUCCEEDED is never restarted for it.
    rule = load_policy().rule_for(store.get_incident(incident.id))
    assert rule is not None and [s.action for s in rule.steps] == ["keep_scene"]


def test_wiring_gives_both_log_collectors_the_window_from_settings(tmp_path: Path) -> None:
    from argus.exporter import ArgusMetrics
    from argus.wiring import build_collectors
    from collectors.ray_logs import RayLogsCollector
    from core.settings import load_settings
    from detectors.metric_rules import load_metric_rules

    (tmp_path / "jobs").mkdir()
    settings = load_settings(data_dir=tmp_path / "data", shared_root=tmp_path, history_window_s=60)
    collectors = build_collectors(settings, load_metric_rules(settings.metric_rules_dirs), ArgusMetrics())
    try:
        [ray_logs] = [c for c in collectors if isinstance(c, RayLogsCollector)]
        [job_logs] = [c for c in collectors if isinstance(c, JobLogsCollector)]
        assert job_logs.tailer.history is not None
        assert ray_logs.history.window == job_logs.tailer.history.window == timedelta(seconds=60)
    finally:
        for collector in collectors:
            close = getattr(collector, "close", None)
            if close is not None:
                close()
