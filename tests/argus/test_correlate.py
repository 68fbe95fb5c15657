"""A root cause suppresses its echoes: real SQLite store, the real pipeline, detectors replaying findings."""

from datetime import datetime, timedelta, timezone

import pytest

from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from core.types import Category, Evidence, Finding, IncidentState, Recovery, Subject, SubjectKind

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class Replay:
    """A detector that emits the findings it is given, one batch per tick."""

    name = "replay"

    def __init__(self):
        self.batches: list[list[Finding]] = []

    def detect(self, signals):
        return self.batches.pop(0) if self.batches else []


def job_finding(category: Category, job: str, reason: str, at: datetime = T0) -> Finding:
    return Finding(
        category=category,
        reason=reason,
        subject=Subject(kind=SubjectKind.JOB, id=job),
        summary=f"{reason} in {job}",
        evidence=(Evidence(source=f"jobs/{job}/logs/rank1.log", line=10, text=reason),),
        first_seen=at,
        detected_at=at,
    )


def node_lost(node: str, jobs: list[str], at: datetime = T0) -> Finding:
    return Finding(
        category=Category.NODE_LOST,
        reason="RayNodeDead",
        subject=Subject(kind=SubjectKind.NODE, id=node, name="10.0.0.9"),
        summary=f"node {node} died",
        first_seen=at,
        detected_at=at,
        attrs={"jobs": [{"submission_id": j, "job_id": "03000000"} for j in jobs]},
    )


@pytest.fixture
def setup(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    replay = Replay()
    now = {"t": T0 + timedelta(seconds=5)}
    pipeline = Pipeline(
        collectors=[], detectors=[replay],
        incidents=IncidentDesk(store, correlator=Correlator(store, window_s=1800, clock=lambda: now["t"])),
    )
    yield store, replay, pipeline, now
    store.close()


def test_echo_after_root_cause_joins_its_incident(setup):
    store, replay, pipeline, _ = setup
    replay.batches = [[node_lost("n1", ["job-a"])], [job_finding(Category.NCCL_ERROR, "job-a", "NcclRemoteError")]]
    [root] = pipeline.run_once().opened
    assert pipeline.run_once().opened == []
    assert [i.id for i in store.list_incidents()] == [root.id]
    assert {f.reason for f in store.findings_for(root.id)} == {"RayNodeDead", "NcclRemoteError"}
    assert store.get_incident(root.id).category is Category.NODE_LOST


def test_root_cause_after_echo_absorbs_the_echo_incident(setup):
    store, replay, pipeline, _ = setup
    replay.batches = [
        [job_finding(Category.NCCL_HANG, "job-b", "NcclWatchdogTimeout")],
        [job_finding(Category.GPU_OOM, "job-b", "CudaOutOfMemory")],
    ]
    [echo] = pipeline.run_once().opened
    [root] = pipeline.run_once().opened
    assert root.category is Category.GPU_OOM
    merged = store.get_incident(echo.id)
    assert merged.state is IncidentState.RESOLVED and merged.attrs["merged_into"] == root.id
    assert {f.reason for f in store.findings_for(root.id)} == {"CudaOutOfMemory", "NcclWatchdogTimeout"}
    assert [i.id for i in store.list_incidents(state=IncidentState.OPEN)] == [root.id]


def test_same_tick_root_cause_wins_whatever_the_order(setup):
    store, replay, pipeline, _ = setup
    replay.batches = [[job_finding(Category.NCCL_ERROR, "job-c", "NcclSystemError"),
                       job_finding(Category.GPU_OOM, "job-c", "CudaOutOfMemory")]]
    [only] = pipeline.run_once().opened
    assert only.category is Category.GPU_OOM
    assert len(store.list_incidents()) == 1


def test_unrelated_jobs_and_old_roots_do_not_absorb(setup):
    store, replay, pipeline, now = setup
    replay.batches = [[node_lost("n2", ["job-d"])], [job_finding(Category.NCCL_ERROR, "job-e", "NcclSystemError")]]
    pipeline.run_once()
    assert len(pipeline.run_once().opened) == 1  # another job: its own incident
    now["t"] = T0 + timedelta(hours=3)
    replay.batches = [[job_finding(Category.NCCL_HANG, "job-d", "NcclWatchdogTimeout", at=now["t"])]]
    assert len(pipeline.run_once().opened) == 1  # the node died hours ago: not this hang's cause


def test_merge_refuses_itself(setup):
    store, replay, pipeline, _ = setup
    replay.batches = [[node_lost("n3", ["job-f"])]]
    [root] = pipeline.run_once().opened
    with pytest.raises(Exception, match="itself"):
        store.merge_into(root.id, root.id)


def test_one_fault_seen_by_state_and_by_log_is_one_incident(setup):
    store, replay, pipeline, _ = setup
    replay.batches = [
        [job_finding(Category.NODE_LOST, "job-g", "RayletTerminatedUnexpectedly")],
        [node_lost("n4", ["job-g"])],
        [node_lost("n5", ["job-h"])],
    ]
    [first] = pipeline.run_once().opened
    assert pipeline.run_once().opened == []
    assert {f.reason for f in store.findings_for(first.id)} == {"RayletTerminatedUnexpectedly", "RayNodeDead"}
    assert len(pipeline.run_once().opened) == 1  # another node, another job: its own incident


def test_a_node_incident_from_the_gcs_log_joins_once_the_jobs_are_known(setup):
    store, replay, pipeline, _ = setup
    gcs_line = Finding(
        category=Category.NODE_LOST, reason="NodeHealthCheckFailed",
        subject=Subject(kind=SubjectKind.NODE, id="n6"), summary="GCS: node n6 is dead", first_seen=T0,
    )
    replay.batches = [
        [job_finding(Category.NODE_LOST, "job-i", "RayletTerminatedUnexpectedly"), gcs_line],
        [node_lost("n6", ["job-i"])],  # same fingerprint as the GCS line's incident, and names the job
    ]
    opened = pipeline.run_once().opened
    assert len(opened) == 2  # nothing yet links the node to the job
    pipeline.run_once()
    [left] = store.list_incidents(state=IncidentState.OPEN)
    assert {f.reason for f in store.findings_for(left.id)} == {
        "RayletTerminatedUnexpectedly", "NodeHealthCheckFailed", "RayNodeDead"}


def test_a_fingerprint_once_absorbed_stays_with_its_incident(setup):
    """Ray's verdict on node n7 joins the job's incident; a GCS line about n7 with no job named (same
    fingerprint as Ray's verdict) must follow it there, not open a node incident of its own."""
    store, replay, pipeline, _ = setup
    gcs_line = Finding(
        category=Category.NODE_LOST, reason="NodeHealthCheckFailed",
        subject=Subject(kind=SubjectKind.NODE, id="n7"), summary="GCS: node n7 is dead", first_seen=T0,
    )
    replay.batches = [
        [job_finding(Category.NODE_LOST, "job-j", "RayletTerminatedUnexpectedly")],
        [node_lost("n7", ["job-j"]), gcs_line],
    ]
    [only] = pipeline.run_once().opened
    assert pipeline.run_once().opened == []
    assert [i.id for i in store.list_incidents(state=IncidentState.OPEN)] == [only.id]
    assert {f.reason for f in store.findings_for(only.id)} == {
        "RayletTerminatedUnexpectedly", "RayNodeDead", "NodeHealthCheckFailed"}


def test_a_fault_seen_first_in_a_job_log_closes_when_the_node_state_says_it_ended(setup):
    """The job's driver prints "(raylet) Raylet is terminated" a second before Ray marks the node DEAD: one
    incident under the job's line, the node's finding filed into it. When the lost-node detector says the node's
    fault ended (its jobs run again), that incident closes; an echo of another category ending closes nothing."""
    store, replay, pipeline, _ = setup
    replay.batches = [
        [job_finding(Category.NODE_LOST, "job-e", "RayletTerminatedUnexpectedly")],
        [node_lost("n4", ["job-e"])],
        [job_finding(Category.NCCL_ERROR, "job-e", "NcclRemoteError")],
    ]
    [incident] = pipeline.run_once().opened
    pipeline.run_once()
    pipeline.run_once()
    assert [i.id for i in store.list_incidents()] == [incident.id]
    nccl = next(f for f in store.findings_for(incident.id) if f.reason == "NcclRemoteError")
    node = next(f for f in store.findings_for(incident.id) if f.reason == "RayNodeDead")

    assert pipeline.incidents.recover(Recovery(fingerprint=nccl.fingerprint, detector="x", reason="quiet")) is None
    assert store.get_incident(incident.id).state is IncidentState.OPEN
    closed = pipeline.incidents.recover(Recovery(fingerprint=node.fingerprint, detector="lost_node",
                                                 reason="job-e is RUNNING again"))
    assert closed is not None and closed.id == incident.id and closed.state is IncidentState.RESOLVED
    assert closed.resolution == "by argus:lost_node: job-e is RUNNING again"


def test_a_late_line_of_an_ended_job_joins_the_incident_that_told_its_failure_without_reopening_it(setup):
    """Recorded in a soak: job r2 FAILED when its node died; its FAILED message was filed under the node's incident,
    which closed when the resubmission ran. Then Ray listed r2's driver log and its line, same fault and
    fingerprint, was read: evidence for that incident, not a new one, and no reopening (an ended job cannot fail
    again). The same finding from a job still running would reopen it, as a fault that came back."""
    store, replay, pipeline, _ = setup
    failed = job_finding(Category.NODE_LOST, "job-r2", "ActorDiedNodeDied")
    replay.batches = [[node_lost("n6", ["job-r1", "job-r2"])], [failed]]
    [incident] = pipeline.run_once().opened
    pipeline.run_once()
    assert failed.fingerprint in store.get_incident(incident.id).attrs["echoes"]
    pipeline.incidents.recover(Recovery(fingerprint=failed.fingerprint, detector="job_failure", reason="r3 runs"))
    assert store.get_incident(incident.id).state is IncidentState.RESOLVED

    late = job_finding(Category.NODE_LOST, "job-r2", "ActorDiedNodeDied", at=T0 + timedelta(seconds=15))
    late = late.model_copy(update={"attrs": {"job_ended": "FAILED"}})
    before = store.get_incident(incident.id).occurrences
    filed = pipeline.incidents.file(late)
    assert filed.incident.id == incident.id and filed.incident.state is IncidentState.RESOLVED
    assert [i.id for i in store.list_incidents()] == [incident.id]
    assert filed.incident.occurrences == before + 1  # counted; the same line's evidence is kept once

    running = late.model_copy(update={"attrs": {}})
    assert pipeline.incidents.file(running).incident.id != incident.id  # not marked: filed as before


def test_an_incident_merged_into_its_root_is_announced_resolved_with_the_reason(tmp_path):
    """Webhooks and IM heard the echo's incident open: they hear it end, as merged into the root's."""
    from argus.incidents.bus import EventBus
    from argus.incidents.events import EventKind
    from tests.support import RecordingSubscriber

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    recorder, bus = RecordingSubscriber(), EventBus()
    bus.start([recorder])
    desk = IncidentDesk(store, events=bus, correlator=Correlator(store, window_s=1800, clock=lambda: T0))
    try:
        echo = desk.file(job_finding(Category.NCCL_HANG, "job-m", "NcclWatchdogTimeout")).incident
        root = desk.file(job_finding(Category.GPU_OOM, "job-m", "CudaOutOfMemory")).incident
        assert bus.drain(10)
        ended = [e for e in recorder.events if e.kind is EventKind.RESOLVED]
        assert [e.incident.id for e in ended] == [echo.id]
        assert ended[0].incident.attrs["merged_into"] == root.id
        assert ended[0].incident.resolution == f"by argus: merged into {root.id}: the same fault, told there"
        assert [e.kind for e in recorder.events if e.incident.id == root.id] == [EventKind.OPENED]
    finally:
        bus.close()
        store.close()


def test_a_ray_node_dies_once_a_late_line_about_its_death_joins_its_closed_incident(setup):
    """Recorded in a soak: the job's line and Ray's node state made one incident, closed 6 s later when the job ran
    again; then the GCS's log line about the same node's failed health checks was read. A Ray node id is one
    raylet's life: that line is the same death, evidence for the closed incident, which is not reopened."""
    store, replay, pipeline, _ = setup
    replay.batches = [[job_finding(Category.NODE_LOST, "job-k", "RayletTerminatedUnexpectedly")],
                      [node_lost("n7", ["job-k"])]]
    [incident] = pipeline.run_once().opened
    pipeline.run_once()
    node = next(f for f in store.findings_for(incident.id) if f.reason == "RayNodeDead")
    pipeline.incidents.recover(Recovery(fingerprint=node.fingerprint, detector="lost_node", reason="job-k runs"))

    gcs = node_lost("n7", [], at=T0 + timedelta(seconds=11)).model_copy(update={"reason": "NodeHealthCheckFailed"})
    filed = pipeline.incidents.file(gcs)
    assert filed.incident.id == incident.id and filed.incident.state is IncidentState.RESOLVED
    assert [i.id for i in store.list_incidents()] == [incident.id]


def test_a_node_incident_opened_on_the_gcs_line_knows_its_jobs_once_the_node_state_folds_in(setup):
    """Recorded in a soak: the GCS's line about the node's failed health checks opened the node's incident (no jobs
    in it); Ray's node state, listing the job, folded in after. The job's FAILED finding and its driver's line came
    next: they belong to that incident, not to one of their own that nothing closes."""
    store, replay, pipeline, _ = setup
    gcs = node_lost("n8", []).model_copy(update={"reason": "NodeHealthCheckFailed", "attrs": {}})
    replay.batches = [[gcs], [node_lost("n8", ["job-p"])],
                      [job_finding(Category.UNKNOWN, "job-p", "JobFailed")],
                      [job_finding(Category.NODE_LOST, "job-p", "RayletTerminatedUnexpectedly")]]
    [incident] = pipeline.run_once().opened
    for _ in range(3):
        assert pipeline.run_once().opened == []
    assert [i.id for i in store.list_incidents()] == [incident.id]
    assert {f.reason for f in store.findings_for(incident.id)} == {
        "NodeHealthCheckFailed", "RayNodeDead", "JobFailed", "RayletTerminatedUnexpectedly"}


def test_a_late_line_of_an_ended_job_joins_the_incident_that_told_its_end_under_another_category(setup):
    """Recorded in a soak: job r5's FAILED message matched no signature (unknown), filed under the lost node's
    incident, which closed when r6 ran; then r5's driver line "Raylet is terminated" (node_lost) was read."""
    store, replay, pipeline, _ = setup
    replay.batches = [[node_lost("n9", ["job-r5"])], [job_finding(Category.UNKNOWN, "job-r5", "JobFailed")]]
    [incident] = pipeline.run_once().opened
    pipeline.run_once()
    pipeline.incidents.resolve(incident.id, by="argus:lost_node", reason="job-r5 was resubmitted as job-r6")
    late = job_finding(Category.NODE_LOST, "job-r5", "RayletTerminatedUnexpectedly", at=T0 + timedelta(seconds=3))
    filed = pipeline.incidents.file(late.model_copy(update={"attrs": {"job_ended": "FAILED"}}))
    assert filed.incident.id == incident.id and filed.incident.state is IncidentState.RESOLVED
    assert [i.id for i in store.list_incidents()] == [incident.id]
