"""JobFailureDetector on constructed JOB_STATE signals and a rule file written here."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from core.lineage import Lineage
from core.types import Category, Signal, SignalKind, Subject, SubjectKind, fingerprint_of
from detectors.engine import RuleSet
from detectors.job_failure import UNMATCHED_REASON, JobFailureDetector
from tests.support import Clock
from tests.support.job_states import ARGUS, job_state, resubmission

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

RULES = r"""
source: job-logs
rules:
  - reason: RayOomKilled
    category: host_oom
    type: permanent
    priority: 90
    description: Ray's OOM killer killed a task.
    pattern: 'ray\.exceptions\.OutOfMemoryError'
  - reason: CudaOom
    category: gpu_oom
    type: permanent
    priority: 90
    pattern: 'CUDA out of memory'
  - reason: PythonTraceback
    category: user_error
    type: permanent
    priority: 20
    pattern: 'Traceback \(most recent call last\)'
  - reason: SlowHeartbeat
    category: node_lost
    type: temporary
    priority: 60
    pattern: 'heartbeat late'
  - reason: RayletOnly
    category: node_lost
    type: permanent
    priority: 99
    source: raylet
    pattern: 'node died'
"""

OOM_MESSAGE = """Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):
heartbeat late
Traceback (most recent call last):
  File "train.py", line 30, in <module>
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
Memory on the node (IP: 10.0.0.3, ID: abc) where the task was running was 22.1GB / 23.5GB (0.94)
node died
"""


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return RuleSet.load([path])


def job(status: str, message: str | None, sid: str = "raysubmit_1", ended: datetime | None = NOW) -> Signal:
    return Signal(
        kind=SignalKind.JOB_STATE,
        source="ray.jobs",
        subject=Subject(kind=SubjectKind.JOB, id=sid, name="python train.py"),
        observed_at=NOW,
        text=message,
        attrs={
            "status": status,
            "submission_id": sid,
            "job_id": "02000000",
            "message": message,
            "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR" if status == "FAILED" else None,
            "entrypoint": "python train.py",
            "end_time": ended.isoformat() if ended else None,
        },
    )


def test_failed_job_message_is_classified_once(rules: RuleSet) -> None:
    det = JobFailureDetector(rules, clock=lambda: NOW)
    [finding] = det.detect([job("FAILED", OOM_MESSAGE)])
    assert finding.category is Category.HOST_OOM and finding.reason == "RayOomKilled"
    assert finding.subject.id == "raysubmit_1"
    first = finding.evidence[0]
    assert (first.source, first.line) == ("ray.jobs/raysubmit_1/message", 5)
    assert first.text.startswith("ray.exceptions.OutOfMemoryError")
    # the lower-priority traceback is kept as evidence; a temporary sign and another stream's rule are not used
    assert finding.attrs["matched"] == ["PythonTraceback", "RayOomKilled"]
    assert "RayletOnly" not in finding.attrs["matched"]
    assert "error_type=JOB_ENTRYPOINT_COMMAND_ERROR" in finding.evidence[-1].text
    assert finding.fingerprint == fingerprint_of(Category.HOST_OOM, finding.subject)  # as the log rules do
    assert finding.first_seen == NOW
    assert det.detect([job("FAILED", OOM_MESSAGE)]) == []


def test_first_line_wins_among_equal_priorities(rules: RuleSet) -> None:
    message = "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB\nray.exceptions.OutOfMemoryError: x\n"
    [finding] = JobFailureDetector(rules, clock=lambda: NOW).detect([job("FAILED", message)])
    assert finding.category is Category.GPU_OOM


@pytest.mark.parametrize("status", ["RUNNING", "PENDING", "SUCCEEDED", "STOPPED"])
def test_only_failed_jobs(rules: RuleSet, status: str) -> None:
    assert JobFailureDetector(rules, clock=lambda: NOW).detect([job(status, OOM_MESSAGE)]) == []


def test_unexplained_failure_is_unknown_with_the_tail(rules: RuleSet) -> None:
    message = "\n".join(f"line {i}" for i in range(1, 11)) + "\nValueError: bad config"
    [finding] = JobFailureDetector(rules, clock=lambda: NOW).detect([job("FAILED", message)])
    assert finding.category is Category.UNKNOWN and finding.reason == UNMATCHED_REASON
    assert "ValueError: bad config" in finding.summary
    assert [e.line for e in finding.evidence[:-1]] == [7, 8, 9, 10, 11]
    quiet = JobFailureDetector(rules, report_unmatched=False, clock=lambda: NOW)
    assert quiet.detect([job("FAILED", message, sid="raysubmit_2")]) == []
    [empty] = JobFailureDetector(rules, clock=lambda: NOW).detect([job("FAILED", None, sid="raysubmit_3")])
    assert "(empty message)" in empty.summary


def test_failures_older_than_the_lookback_are_history(rules: RuleSet) -> None:
    det = JobFailureDetector(rules, lookback_s=3600, clock=lambda: NOW)
    old = job("FAILED", OOM_MESSAGE, ended=NOW - timedelta(hours=2))
    assert det.detect([old]) == []
    assert len(det.detect([job("FAILED", OOM_MESSAGE, sid="raysubmit_new", ended=None)])) == 1


def test_ray_oom_message_cut_to_its_advice_is_still_host_oom():
    """The tail of a Ray 2.60 job message after an OOM kill on a busy host (seen in the tests/faults run;
    text as in the raylet binary of ray 2.60): the header was cut away and only the advice remained."""
    from detectors.engine import load_rules, root_cause

    tail = [
        "Refer to the documentation on how to address the out of memory issue: "
        "https://docs.ray.io/en/latest/ray-observability/user-guides/debug-apps/debug-memory.html. Consider "
        "provisioning more "
        "memory on this node or reducing task parallelism by requesting more CPUs per task. To adjust the kill "
        "threshold, set the environment variable `RAY_memory_usage_threshold` when starting Ray. To disable "
        "worker killing, set the environment variable `RAY_memory_monitor_refresh_ms` to zero.",
    ]
    winner = root_cause(list(load_rules().scan(tail, source="message")))
    assert winner is not None and winner.rule.category.value == "host_oom"


# --- recovery: a resubmission reached RUNNING -------------------------------------------------------------


SID = "grpo-20261122T084034Z-eff5"


def failed(sid: str = SID, **kw: object) -> Signal:
    return job_state(sid, "FAILED", message=OOM_MESSAGE, metadata=ARGUS, at=NOW, **kw)  # type: ignore[arg-type]


def test_a_failed_jobs_incident_closes_when_its_resubmission_runs(rules: RuleSet) -> None:
    clock = Clock(NOW)
    det = JobFailureDetector(rules, clock=clock)
    [finding] = det.detect([failed()])
    assert det.recoveries() == []
    clock.tick(30)
    assert det.detect([failed(), resubmission(SID, 1, "PENDING", at=clock.now)]) == []
    assert det.recoveries() == []  # submitted is not running
    clock.tick(30)
    det.detect([failed(), resubmission(SID, 1, "RUNNING", at=clock.now)])
    [recovered] = det.recoveries()
    assert recovered.fingerprint == finding.fingerprint and recovered.detector == "job_failure"
    assert recovered.reason == f"job {SID} was resubmitted as {SID}-r1, which reached RUNNING"
    assert recovered.observed_at == clock.now
    det.detect([failed(), resubmission(SID, 1, "RUNNING", at=clock.tick(30))])
    assert det.recoveries() == []  # told once


def test_without_an_argus_resubmission_the_incident_stays_open_for_a_person(rules: RuleSet) -> None:
    det = JobFailureDetector(rules, clock=Clock(NOW))
    [finding] = det.detect([failed()])
    others = [
        job_state("sft-20261122T090000Z-0a1b", "RUNNING", metadata=ARGUS, at=NOW),  # an unrelated job
        job_state(f"{SID}-r1", "RUNNING", at=NOW),  # a person's `ray job submit` under a look-alike id
        job_state("raysubmit_9", "RUNNING", at=NOW),  # a person's `ray job submit` of the same entrypoint
    ]
    for _ in range(3):
        det.detect([failed(), *others])
    assert det.recoveries() == []
    # the resubmission that failed before it ran does not close it either; the next attempt that runs does
    first_retry = job_state(f"{SID}-r1", "FAILED", message="ValueError: bad runtime env", at=NOW,
                            metadata={**ARGUS, **Lineage(of=SID, root=SID, attempt=1).metadata()})
    [retry_failed] = det.detect([failed(), first_retry])  # its own failure: its own incident
    assert det.recoveries() == []
    det.detect([failed(), first_retry, resubmission(f"{SID}-r1", 2, "SUCCEEDED", root=SID)])
    recovered = {r.fingerprint: r.reason for r in det.recoveries()}
    assert recovered == {  # the chain's next attempt that ran ends both failures
        finding.fingerprint: f"job {SID} was resubmitted as {SID}-r2, which reached RUNNING (now SUCCEEDED)",
        retry_failed.fingerprint: f"job {SID}-r1 was resubmitted as {SID}-r2, which reached RUNNING (now SUCCEEDED)",
    }


def test_a_failure_whose_resubmission_already_ran_is_not_news_but_still_closes(rules: RuleSet) -> None:
    """Argus restarted after the job failed and was resubmitted: nothing new is reported, and an incident left
    open from before the restart closes (failures past the lookback too)."""
    det = JobFailureDetector(rules, lookback_s=3600, clock=Clock(NOW))
    old = failed(sid="old-1", ended=NOW - timedelta(hours=5))
    assert det.detect([failed(), resubmission(SID, 1, "RUNNING"), old, resubmission("old-1", 1, "SUCCEEDED")]) == []
    recovered = det.recoveries()
    expected = fingerprint_of(Category.HOST_OOM, Subject(kind=SubjectKind.JOB, id=SID))
    assert sorted(r.fingerprint for r in recovered) == sorted(
        [expected, fingerprint_of(Category.HOST_OOM, Subject(kind=SubjectKind.JOB, id="old-1"))])


# --- the node a host OOM struck -----------------------------------------------------------------------------


STRUCK = "99417ec8d7b1e36e562b13b943ed85a5055c6e79cd586bb99034beb5"


def test_a_host_oom_records_the_node_it_struck_from_a_later_line_of_the_message() -> None:
    """Ray's older exception: the matching line names no node, the next one does (IP and ID)."""
    from detectors.engine import load_rules

    message = OOM_MESSAGE.replace("ID: abc", f"ID: {STRUCK}")
    [finding] = JobFailureDetector(load_rules(), clock=lambda: NOW).detect([job("FAILED", message)])
    assert finding.category is Category.HOST_OOM
    assert (finding.attrs["affected_node_id"], finding.attrs["affected_node_ip"]) == (STRUCK, "10.0.0.3")
    assert "node_id" not in finding.attrs  # where it was written is not claimed


def test_a_host_oom_without_a_well_formed_node_records_none(rules: RuleSet) -> None:
    [finding] = JobFailureDetector(rules, clock=lambda: NOW).detect([job("FAILED", OOM_MESSAGE)])  # "ID: abc"
    assert "affected_node_id" not in finding.attrs and "affected_node_ip" not in finding.attrs


def test_another_category_names_no_struck_node() -> None:
    from detectors.engine import load_rules

    message = f"torch.OutOfMemoryError: CUDA out of memory. Memory on the node (IP: 10.0.0.3, ID: {STRUCK})"
    [finding] = JobFailureDetector(load_rules(), clock=lambda: NOW).detect([job("FAILED", message)])
    assert finding.category is Category.GPU_OOM and "affected_node_id" not in finding.attrs
