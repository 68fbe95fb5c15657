"""Which jobs a resubmit step brings back. A lost node names every job that ever had work there; the demo
showed Argus resubmitting jobs that had failed, or been stopped, a minute before the node died."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from control.jobs import JobRecord
from core.jobfolder import JobFolder
from core.types import Category, Incident, Subject, SubjectKind
from remediation.actions import _ended_apart
from tests.support import make_incident

FAULT = datetime(2026, 11, 22, 8, 19, 50, tzinfo=timezone.utc)
SID = "grpo-20261122T081944Z-71d9"


def incident(incident_id: str = "inc-c3d630c2db4d") -> Incident:
    return make_incident(id=incident_id, category=Category.NODE_LOST,
                         subject=Subject(kind=SubjectKind.NODE, id="n1", name="127.0.0.3"), summary="node died",
                         reason="RayNodeDead", first_seen=FAULT, detected_at=FAULT + timedelta(seconds=1))


def record(status: str, ended: datetime | None, mark: str | None = None) -> JobRecord:
    return JobRecord(submission_id=SID, status=status, job_dir=None, ended_at=ended, mark=mark)


def folder(shared: Path) -> JobFolder:
    return JobFolder(shared, SID)


def marked(tmp_path: Path, reason: str) -> JobFolder:
    job = folder(tmp_path)
    job.config.mkdir(parents=True, exist_ok=True)
    job.status_file.write_text(json.dumps({"mark": "stopped", "reason": reason}))
    return job


def test_jobs_the_fault_hit_are_resubmitted(tmp_path: Path) -> None:
    # a hung job: stopped, then resubmitted
    assert _ended_apart(record("RUNNING", None), incident(), folder(tmp_path)) is None
    # the rank died with the node: Ray ends the job a little after the node's death
    assert _ended_apart(record("FAILED", FAULT + timedelta(seconds=3)), incident(), folder(tmp_path)) is None
    # evidence read a poll after the job ended still counts as this fault
    assert _ended_apart(record("FAILED", FAULT - timedelta(seconds=10)), incident(), folder(tmp_path)) is None


def test_jobs_that_ended_apart_from_the_fault_stay_ended(tmp_path: Path) -> None:
    assert "succeeded" in _ended_apart(record("SUCCEEDED", FAULT - timedelta(hours=1)), incident(), folder(tmp_path))
    early = _ended_apart(record("FAILED", FAULT - timedelta(seconds=57)), incident(), folder(tmp_path))
    assert early and "before this fault" in early
    stopped = _ended_apart(record("STOPPED", FAULT - timedelta(seconds=32), "stopped"), incident(),
                           marked(tmp_path, "stop requested"))
    assert stopped and "stopped on purpose (stop requested)" in stopped
    timed_out = _ended_apart(record("STOPPED", FAULT, "timed_out"), incident(), folder(tmp_path / "x"))
    assert timed_out and "stopped on purpose" in timed_out


def test_a_job_this_incident_stopped_is_still_its_own_after_a_crash(tmp_path: Path) -> None:
    """The resubmit step stops a hung job first; a run repeated after a crash must go on to submit."""
    job = marked(tmp_path, f"resubmitting as {SID}-r1 (incident inc-c3d630c2db4d)")
    assert _ended_apart(record("STOPPED", FAULT + timedelta(seconds=5), "stopped"), incident(), job) is None
    other = _ended_apart(record("STOPPED", FAULT + timedelta(seconds=5), "stopped"), incident("inc-000000000000"),
                         job)
    assert other and "stopped on purpose" in other


def test_the_node_death_time_beats_an_earlier_echo_in_the_incident(tmp_path: Path) -> None:
    """Echoes filed into a lost-node incident (a stall on another job) can pull first_seen a minute early."""
    died = FAULT + timedelta(seconds=58)
    lost = incident().model_copy(update={"attrs": {"died_at": died.isoformat()}})
    early = _ended_apart(record("FAILED", FAULT + timedelta(seconds=2)), lost, folder(tmp_path))
    assert early and "before this fault" in early
    assert _ended_apart(record("FAILED", died + timedelta(seconds=1)), lost, folder(tmp_path)) is None


def test_a_success_that_is_only_tees_does_not_keep_a_job_the_fault_killed(tmp_path: Path) -> None:
    """`python train.py | tee log`: /bin/sh returns tee's status, so a trainer killed with its node leaves the
    job SUCCEEDED. Only the fault's time tells then."""
    piped = "cd /nfs && python3 -m verl.trainer.main_ppo a=b 2>&1 | tee train.log"
    after = record("SUCCEEDED", FAULT + timedelta(seconds=2))
    assert _ended_apart(after, incident(), folder(tmp_path), piped) is None
    long_before = _ended_apart(record("SUCCEEDED", FAULT - timedelta(hours=1)), incident(), folder(tmp_path), piped)
    assert long_before and "before this fault" in long_before
    assert "succeeded" in _ended_apart(after, incident(), folder(tmp_path), "python3 train.py > out.log 2>&1")
    assert "succeeded" in _ended_apart(after, incident(), folder(tmp_path), "cd /x && python3 train.py && cp a b")
    for masked in ("python3 train.py; echo done", "python3 train.py || true", "python3 train.py\necho done"):
        assert _ended_apart(after, incident(), folder(tmp_path), masked) is None, masked
