from datetime import datetime, timedelta, timezone

from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.lost_node import LostNodeDetector
from tests.support import Clock
from tests.support.job_states import ARGUS, job_state, resubmission

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def node(node_id: str, state: str, *, died: datetime | None = None, jobs=(), head=False) -> Signal:
    return Signal(
        kind=SignalKind.NODE_STATE,
        source="ray.state",
        subject=Subject(kind=SubjectKind.NODE, id=node_id, name="10.0.0.7"),
        observed_at=NOW,
        attrs={
            "state": state,
            "node_ip": "10.0.0.7",
            "is_head_node": head,
            "state_message": "Unexpected termination: health check failed due to missing too many heartbeats"
            if state == "DEAD"
            else None,
            "end_time": died.isoformat() if died else None,
            "jobs": list(jobs),
        },
    )


def test_dead_node_names_ip_reason_and_jobs():
    job = {"job_id": "02000000", "submission_id": "raysubmit_abc", "status": "RUNNING", "entrypoint": "python ppo.py"}
    d = LostNodeDetector(clock=lambda: NOW)
    [f] = d.detect([node("n1", "DEAD", died=NOW - timedelta(seconds=2), jobs=[job])])
    assert f.category is Category.NODE_LOST and f.subject.id == "n1"
    assert "10.0.0.7" in f.summary and "missing too many heartbeats" in f.summary and "raysubmit_abc" in f.summary
    assert f.severity is Severity.CRITICAL
    assert f.attrs["jobs"][0]["submission_id"] == "raysubmit_abc"
    assert f.first_seen == NOW - timedelta(seconds=2)
    assert any("raysubmit_abc" in e.text for e in f.evidence)


def test_reported_once_per_node_and_alive_nodes_ignored():
    d = LostNodeDetector(clock=lambda: NOW)
    assert d.detect([node("n0", "ALIVE")]) == []
    assert len(d.detect([node("n1", "DEAD", died=NOW)])) == 1
    assert d.detect([node("n1", "DEAD", died=NOW)]) == []
    assert len(d.detect([node("n2", "DEAD", died=NOW)])) == 1


def test_old_deaths_are_history_and_fingerprint_is_stable():
    d = LostNodeDetector(lookback_s=60, clock=lambda: NOW)
    assert d.detect([node("old", "DEAD", died=NOW - timedelta(hours=2))]) == []
    [a] = LostNodeDetector(clock=lambda: NOW).detect([node("n1", "DEAD", died=NOW)])
    [b] = LostNodeDetector(clock=lambda: NOW + timedelta(minutes=5)).detect([node("n1", "DEAD", died=NOW)])
    assert a.fingerprint == b.fingerprint


def test_idle_node_death_is_a_warning():
    [f] = LostNodeDetector(clock=lambda: NOW).detect([node("n1", "DEAD", died=NOW)])
    assert f.severity is Severity.WARNING and "no jobs" in f.summary


def test_planned_ends_are_not_losses_but_other_preemptions_are():
    def ended(message: str) -> Signal:
        signal = node(f"n-{abs(hash(message))}", "DEAD", died=NOW)
        return signal.model_copy(update={"attrs": {**signal.attrs, "state_message": message}})

    d = LostNodeDetector(clock=lambda: NOW)
    planned = ["Expected termination: received SIGTERM", "Terminated due to idle (no Ray activity)",
               "Terminated due to preemption: argus: xid 79 on gpu 3"]
    assert d.detect([ended(m) for m in planned]) == []
    [spot] = d.detect([ended("Terminated due to preemption: spot instance reclaimed")])
    assert "spot instance reclaimed" in spot.summary


def test_a_host_that_rejoins_as_a_new_node_is_a_recovery_once():
    d = LostNodeDetector(clock=lambda: NOW)
    [lost] = d.detect([node("n1", "DEAD", died=NOW)])
    assert d.recoveries() == []
    d.detect([node("n1", "DEAD", died=NOW), node("n1", "ALIVE")])  # the same id cannot come back: not a rejoin
    assert d.recoveries() == []
    d.detect([node("n1", "DEAD", died=NOW), node("n9", "ALIVE")])  # Ray's new node on the same IP
    [recovery] = d.recoveries()
    assert recovery.fingerprint == lost.fingerprint and recovery.detector == "lost_node"
    assert "10.0.0.7 rejoined" in recovery.reason and "n9" in recovery.reason
    d.detect([node("n1", "DEAD", died=NOW), node("n9", "ALIVE")])
    assert d.recoveries() == []


def test_planned_ends_and_history_are_never_recoveries():
    d = LostNodeDetector(lookback_s=60, clock=lambda: NOW)
    planned = node("n3", "DEAD", died=NOW)
    planned.attrs["state_message"] = "Expected termination: received SIGTERM"
    assert d.detect([planned, node("n4", "DEAD", died=NOW - timedelta(hours=2))]) == []
    d.detect([node("n5", "ALIVE")])
    assert d.recoveries() == []


# --- recovery: the jobs it hit run again -----------------------------------------------------------------


def hit(sid: str, status: str = "RUNNING") -> dict:
    return {"job_id": f"0{len(sid)}000000", "submission_id": sid, "status": status, "entrypoint": "python ppo.py"}


def test_a_lost_node_closes_when_every_job_it_hit_runs_again_as_a_resubmission():
    clock = Clock(NOW)
    d = LostNodeDetector(clock=clock)
    dead = node("n1", "DEAD", died=NOW, jobs=[hit("ppo-a"), hit("ppo-b"), hit("done-c", "SUCCEEDED")])
    [lost] = d.detect([dead, job_state("ppo-a", "RUNNING", metadata=ARGUS), job_state("ppo-b", "RUNNING")])
    assert d.recoveries() == []
    clock.tick(60)  # ppo-a failed and was resubmitted by Argus, which runs; ppo-b failed, nobody resubmitted it yet
    d.detect([dead, job_state("ppo-a", "FAILED", metadata=ARGUS), resubmission("ppo-a", 1, "RUNNING"),
              job_state("ppo-b", "FAILED"), job_state("ppo-b-again", "RUNNING")])  # a person's own new job
    assert d.recoveries() == []
    clock.tick(60)
    d.detect([dead, job_state("ppo-a", "FAILED", metadata=ARGUS), resubmission("ppo-a", 1, "RUNNING"),
              job_state("ppo-b", "FAILED", metadata=ARGUS), resubmission("ppo-b", 1, "RUNNING")])
    [recovery] = d.recoveries()
    assert recovery.fingerprint == lost.fingerprint and recovery.observed_at == clock.now
    assert recovery.reason == (
        "every job that had work on node 10.0.0.7 (n1) runs again: ppo-a was resubmitted as ppo-a-r1, which "
        "reached RUNNING; ppo-b was resubmitted as ppo-b-r1, which reached RUNNING")
    d.detect([dead, resubmission("ppo-a", 1, "RUNNING"), node("n9", "ALIVE")])
    assert d.recoveries() == []  # told once: the host rejoining later closes nothing more


def test_a_job_that_was_pending_runs_and_a_running_one_counts_once_it_outlived_the_collective_timeout():
    clock = Clock(NOW)
    d = LostNodeDetector(job_survives_s=600, clock=clock)
    dead = node("n1", "DEAD", died=NOW, jobs=[hit("waiting", "PENDING"), hit("elastic")])
    [lost] = d.detect([dead, job_state("waiting", "PENDING"), job_state("elastic", "RUNNING")])
    clock.tick(30)
    d.detect([dead, job_state("waiting", "RUNNING"), job_state("elastic", "RUNNING")])
    assert d.recoveries() == []  # "elastic" may be hung on a peer it lost: not yet
    clock.at(599)
    d.detect([dead, job_state("waiting", "RUNNING"), job_state("elastic", "RUNNING")])
    assert d.recoveries() == []
    clock.at(600)
    d.detect([dead, job_state("waiting", "RUNNING"), job_state("elastic", "RUNNING")])
    [recovery] = d.recoveries()
    assert recovery.fingerprint == lost.fingerprint
    assert "waiting was PENDING and is RUNNING; elastic is still RUNNING 600 s after the node died" in recovery.reason


def test_a_node_that_hit_no_job_waits_for_its_host_and_a_failed_job_keeps_it_open():
    clock = Clock(NOW)
    d = LostNodeDetector(job_survives_s=60, clock=clock)
    d.detect([node("idle", "DEAD", died=NOW, jobs=[hit("old", "SUCCEEDED")])])
    [lost] = d.detect([node("n2", "DEAD", died=NOW, jobs=[hit("ppo")])])
    clock.tick(3600)
    d.detect([job_state("old", "SUCCEEDED"), job_state("ppo", "FAILED"), job_state("other", "RUNNING")])
    assert d.recoveries() == []
    assert lost.subject.id == "n2"
