"""One host OOM, one incident: Ray's OOM killer on one worker is seen by the job (its driver's exception, its FAILED
message), by the GCS on the head (which reports every worker exit anywhere) and by the node's own raylet (its
advice). Through the real log-rule and job-failure detectors with the shipped rules, the real desk and correlator
and a real SQLite store, in either order of arrival, those are one incident, about the job, naming the node.

The lines are those the soak (bench/soak.py) recorded for one kill on worker 2 (127.0.0.4); before this, they
opened three incidents, one of them about the head."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from core.refs import refs_of
from core.types import Category, IncidentState, Signal, SignalKind, Subject, SubjectKind
from detectors.engine import load_rules
from detectors.job_failure import JobFailureDetector
from detectors.log_rules import LogRuleDetector
from tests.support import Clock, Feed, RecordingSubscriber
from tests.support.job_states import job_state

T0 = datetime.now(timezone.utc)  # the correlator looks back from now
WORKER2 = "99417ec8d7b1e36e562b13b943ed85a5055c6e79cd586bb99034beb5"
WORKER3 = "5b0c1f2e9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f"
HEAD = "3d17a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5"
KILLED_WORKER = "6a28c3f1e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7"
JOB = "dataprep-20261125T095512Z-3c1a"

HEAD_NODE = Subject(kind=SubjectKind.NODE, id=HEAD, name="127.0.0.2")


def kill_text(node: str, ip: str) -> str:
    return (f"1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: {ip}, ID: {node}) "
            "was 2.99GB used / 23.54GB limit (0.126893)")


def driver_line(node: str = WORKER2, ip: str = "127.0.0.4", job: str = JOB, n: int = 41) -> Signal:
    """The job's driver log (written on the head, where the driver runs)."""
    return log_line(f"ray.exceptions.OutOfMemoryError: {kill_text(node, ip)}", Subject(kind=SubjectKind.JOB, id=job),
                    stream="job-logs", source=f"ray://127.0.0.2/job-driver-{job}.log", n=n)


def gcs_line(node: str = WORKER2, ip: str = "127.0.0.4", n: int = 5120) -> Signal:
    """The head's gcs_server.out reporting the kill on another node."""
    text = (f"[2026-11-25 09:57:18,089 W 30488 30488] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, "
            f"worker id = {KILLED_WORKER}, node id = {node}, address = {ip}, exit_type = NODE_OUT_OF_MEMORY, "
            f"exit_detail = {kill_text(node, ip)}")
    return log_line(text, HEAD_NODE, stream="gcs", source="ray://127.0.0.2/gcs_server.out", n=n)


def raylet_advice(node: str = WORKER2, ip: str = "127.0.0.4", n: int = 880) -> Signal:
    """The raylet of the node the kill happened on, its advice (no node named)."""
    text = (" suggestions: Refer to the documentation on how to address the out of memory issue: "
            "https://docs.ray.io/en/latest/ray-observability/user-guides/debug-apps/debug-memory.html. Consider "
            "provisioning more memory on this node or reducing task parallelism by requesting more CPUs per task.")
    return log_line(text, Subject(kind=SubjectKind.NODE, id=node, name=ip), stream="raylet",
                    source=f"ray://{ip}/raylet.out", n=n)


def log_line(text: str, subject: Subject, *, stream: str, source: str, n: int) -> Signal:
    writer = (HEAD, "127.0.0.2") if subject.kind is SubjectKind.JOB else (subject.id, subject.name)
    return Signal(kind=SignalKind.LOG_LINE, source=source, subject=subject, text=text, line=n, observed_at=T0,
                  attrs={"stream": stream, "file": source, "node_id": writer[0], "node_ip": writer[1]})


def failed(job: str = JOB, node: str = WORKER2, first_line: str | None = None) -> Signal:
    message = first_line or f"ray.exceptions.OutOfMemoryError: {kill_text(node, '127.0.0.4')}"
    return job_state(job, "FAILED", at=T0, message=f"Job entrypoint command failed with exit code 1\n{message}")



@pytest.fixture
def loop(store):
    clock, feed, recorder = Clock(T0), Feed(), RecordingSubscriber()
    rules = load_rules()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store),
                        reopen_window_s=600)
    pipeline = Pipeline(collectors=[feed], incidents=desk, clock=clock,
                        detectors=[LogRuleDetector(rules, clock=clock), JobFailureDetector(rules, clock=clock)])

    def tick(*signals: Signal):
        clock.tick(5)
        feed.batch = list(signals)
        return pipeline.run_once()

    yield tick, store
    desk.events.close()


def open_incidents(store):
    return store.list_incidents(state=IncidentState.OPEN)


def assert_one_job_incident(store, *, reasons: set[str]) -> None:
    [incident] = open_incidents(store)
    assert (incident.subject.kind, incident.subject.id) == (SubjectKind.JOB, JOB)
    assert incident.category is Category.HOST_OOM
    refs = refs_of(incident)
    assert (refs.affected_node_id, refs.affected_node_ip) == (WORKER2, "127.0.0.4")
    # node_id says where the driver's line was written (the head), or nothing for Ray's job message: never overwritten
    assert refs.node_id in (HEAD, None)
    kept = store.findings_for(incident.id)
    assert {f.reason for f in kept} >= reasons
    # the node's claim is kept, about the node the kill happened on, never the head that wrote the GCS line
    assert {f.subject.id for f in kept if f.subject.kind is SubjectKind.NODE} == {WORKER2}
    merged = [i for i in store.list_incidents(state=IncidentState.RESOLVED) if i.attrs.get("merged_into")]
    assert all(i.attrs["merged_into"] == incident.id for i in merged)


def test_job_first_then_the_gcs_and_the_node(loop):
    tick, store = loop
    assert len(tick(driver_line()).opened) == 1
    assert tick(gcs_line()).opened == []
    assert tick(raylet_advice()).opened == []
    assert tick(failed()).opened == []
    assert_one_job_incident(store, reasons={"RayOomKillerKilledTask"})
    assert len(store.list_incidents()) == 1  # nothing opened and merged away: the node's claims went straight in


def test_node_first_then_the_job_absorbs_the_nodes_incident(loop):
    tick, store = loop
    [node_incident] = tick(gcs_line()).opened
    assert node_incident.subject.id == WORKER2 and node_incident.subject.name == "127.0.0.4"
    [job_incident] = tick(driver_line()).opened
    assert store.get_incident(node_incident.id).attrs["merged_into"] == job_incident.id
    assert tick(raylet_advice(), failed()).opened == []  # the node's fingerprint follows its incident
    assert_one_job_incident(store, reasons={"RayOomKillerKilledTask"})


def test_the_nodes_own_advice_first_then_the_job_then_the_gcs(loop):
    """The raylet's advice names no node: it is filed under the node that wrote it, which is the node the kill
    happened on, so it shares the GCS line's fingerprint and follows it into the job's incident."""
    tick, store = loop
    [node_incident] = tick(raylet_advice()).opened
    assert node_incident.reason == "RayOomKillerAdvice" and node_incident.subject.id == WORKER2
    [job_incident] = tick(failed()).opened
    assert store.get_incident(node_incident.id).attrs["merged_into"] == job_incident.id
    assert tick(gcs_line(), driver_line()).opened == []
    assert_one_job_incident(store, reasons={"RayOomKillerKilledTask", "RayOomKillerAdvice"})


def test_one_tick_with_every_line_is_one_incident(loop):
    tick, store = loop
    tick(raylet_advice(), gcs_line(), driver_line(), failed())
    assert_one_job_incident(store, reasons={"RayOomKillerKilledTask"})


def test_a_job_line_without_the_node_is_joined_when_the_failed_message_names_it(loop):
    """Ray's older exception puts "Memory on the node (IP, ID)" on the line after the one that matches: the
    job's incident learns the node from its FAILED message, folded in later, and then absorbs the node's."""
    tick, store = loop
    bare = log_line("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
                    Subject(kind=SubjectKind.JOB, id=JOB), stream="job-logs", source="ray://127.0.0.2/driver.log", n=7)
    [job_incident] = tick(bare).opened
    [node_incident] = tick(gcs_line()).opened  # nothing links them yet
    assert tick(failed()).opened == []
    assert store.get_incident(node_incident.id).attrs["merged_into"] == job_incident.id
    assert tick(raylet_advice()).opened == []
    [left] = open_incidents(store)
    assert left.id == job_incident.id


def test_an_oom_on_another_node_stays_its_own_incident(loop):
    tick, store = loop
    tick(driver_line())
    [other] = tick(gcs_line(node=WORKER3, ip="127.0.0.5")).opened
    assert other.subject.id == WORKER3
    assert len(open_incidents(store)) == 2


def test_a_node_oom_with_no_job_incident_stays_open_on_its_own(loop):
    tick, store = loop
    [incident] = tick(gcs_line()).opened
    assert tick(raylet_advice()).opened == []  # the node's own line: the same (node, category), told once
    [left] = open_incidents(store)
    assert left.id == incident.id and left.subject.kind is SubjectKind.NODE
    assert "merged_into" not in left.attrs


def test_another_jobs_oom_on_the_same_node_is_not_merged_into_the_first_job(loop):
    tick, store = loop
    tick(driver_line())
    [second] = tick(driver_line(job="other-20261125T100000Z-aaaa")).opened
    assert second.subject.id == "other-20261125T100000Z-aaaa"
    assert len(open_incidents(store)) == 2


def test_a_reopened_job_incident_absorbs_the_nodes_new_incident(store):
    """The desk's reopen path: the job's incident, resolved, comes back within the window; the node's incident
    that opened in between (its fingerprint's old incident was merged, so it is never reopened itself) joins it."""
    clock, recorder = Clock(T0), RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store), reopen_window_s=600)
    try:
        rules = load_rules()
        logs = LogRuleDetector(rules, clock=clock)
        [job_finding] = logs.detect([driver_line()])
        [node_finding] = LogRuleDetector(rules, clock=clock).detect([gcs_line()])
        job_incident = desk.file(job_finding).incident
        assert desk.file(node_finding).outcome.value == "echo"
        desk.resolve(job_incident.id, by="alice", reason="restarted by hand")
        node_again = desk.file(node_finding)
        assert node_again.outcome.value == "opened" and node_again.incident.subject.id == WORKER2
        again = desk.file(job_finding)
        assert again.outcome.value == "reopened" and again.incident.id == job_incident.id
        assert store.get_incident(node_again.incident.id).attrs["merged_into"] == job_incident.id
        assert [i.id for i in open_incidents(store)] == [job_incident.id]
    finally:
        desk.events.close()


def test_an_old_job_incident_outside_the_window_does_not_absorb(store):
    now = {"t": T0}
    desk = IncidentDesk(store, events=EventBus().start([]),
                        correlator=Correlator(store, window_s=600, clock=lambda: now["t"]))
    try:
        rules = load_rules()
        [job_finding] = LogRuleDetector(rules).detect([driver_line()])
        [node_finding] = LogRuleDetector(rules).detect([gcs_line()])
        desk.file(job_finding)
        now["t"] = T0 + timedelta(hours=2)
        assert desk.file(node_finding).outcome.value == "opened"
    finally:
        desk.events.close()
