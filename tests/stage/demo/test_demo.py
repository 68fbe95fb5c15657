"""The demo's own pieces: which incident belongs to which fault, the live table, and the planned restart the
host-OOM fault needs (on the real cluster: Argus must not call it a lost node). `make demo` itself runs the
whole thing; its output is quoted in the README."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from rich.console import Console

from collectors.ray_state import RayStateCollector
from core.types import Action, ActionState, Category, Incident, IncidentState, Severity, Subject, SubjectKind
from detectors.lost_node import LostNodeDetector
from remediation.policy import DEFAULT_POLICY, load_policy
from stage.demo.faults import FAULTS
from stage.demo.inject import DemoContext, Injection, is_its_incident, planned_restart
from stage.demo.table import Row, render
from stage.localstack.jobs import JOBS_DIR
from tests.helpers import wait_until

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
SID = "sft-20261122T120000Z-ab12"


def incident(subject: Subject, *, category: Category = Category.GPU_OOM, detected: datetime = NOW,
             summary: str = "x", **attrs) -> Incident:  # type: ignore[no-untyped-def]
    return Incident(id="inc-000000000001", fingerprint="f", category=category, subject=subject,
                    state=IncidentState.OPEN, severity=Severity.CRITICAL, summary=summary, reason="R",
                    first_seen=detected, last_seen=detected, detected_at=detected, attrs=attrs)


def test_an_incident_belongs_to_the_fault_by_job_gpu_or_node_and_never_before_it() -> None:
    at = NOW.timestamp()
    job = Injection(at, submission_id=SID)
    assert is_its_incident(incident(Subject(kind=SubjectKind.JOB, id=SID)), job)
    assert is_its_incident(incident(Subject(kind=SubjectKind.NODE, id="n1"), jobs=[{"submission_id": SID}]), job)
    assert not is_its_incident(incident(Subject(kind=SubjectKind.JOB, id="other-20261122T120000Z-ab12")), job)
    before = NOW - timedelta(seconds=30)
    assert not is_its_incident(incident(Subject(kind=SubjectKind.JOB, id=SID), detected=before), job)

    gpu = Injection(at, gpu_uuid="GPU-1234")
    assert is_its_incident(incident(Subject(kind=SubjectKind.GPU, id="GPU-1234")), gpu)
    assert not is_its_incident(incident(Subject(kind=SubjectKind.GPU, id="GPU-9999")), gpu)

    node = Injection(at, node_ip="127.0.0.3")
    assert is_its_incident(incident(Subject(kind=SubjectKind.NODE, id="abc", name="127.0.0.3")), node)
    assert not is_its_incident(incident(Subject(kind=SubjectKind.NODE, id="abc", name="127.0.0.4")), node)


def test_the_table_shows_category_verdicts_remediation_and_errors() -> None:
    by_key = {f.key: f for f in FAULTS}
    ok = Row(by_key["node_lost"], injection=Injection(NOW.timestamp() - 3, node_ip="127.0.0.3"),
             incident=incident(Subject(kind=SubjectKind.NODE, id="n1", name="127.0.0.3"),
                               category=Category.NODE_LOST))
    ok.actions = [Action(id="act-1", incident_id=ok.incident.id, kind="resubmit_job", target=ok.incident.subject,
                         state=ActionState.SUCCEEDED, idempotency_key="k", requested_by="policy", dry_run=False,
                         result={"jobs": [{"job": SID, "new": f"{SID}-r1"}]}),
                  Action(id="act-2", incident_id=ok.incident.id, kind="drain_node", target=ok.incident.subject,
                         state=ActionState.PLANNED, idempotency_key="k2", requested_by="policy", dry_run=False)]
    wrong = Row(by_key["cuda_oom"], injection=Injection(NOW.timestamp(), submission_id=SID),
                incident=incident(Subject(kind=SubjectKind.JOB, id=SID), category=Category.USER_ERROR))
    missed = Row(by_key["xid"], error="not detected within 150 s")
    console = Console(width=200, record=True)
    console.print(render([ok, wrong, missed], started=NOW.timestamp() - 10, title="t"))
    text = console.export_text()
    assert "node_lost ✓" in text and "+3.0s" in text and "resubmit_job ✓ → …-r1" in text
    assert "drain_node: waiting for approval" in text
    assert "user_error ✗ expected gpu_oom" in text
    assert "not detected within 150 s" in text
    assert ok.category_ok and not wrong.category_ok


def test_the_demo_policy_is_valid_and_leaves_gpu_hardware_to_a_person() -> None:
    policy = load_policy(DEFAULT_POLICY.parent / "demo.yaml")
    modes = {rule.name: policy.mode_for(rule).value for rule in policy.rules}
    assert modes["gpu-hardware"] == "approval" and modes["lost-node"] == "auto"


def test_a_planned_restart_is_not_a_lost_node(ray_cluster, ray_faults) -> None:  # type: ignore[no-untyped-def]
    """The host-OOM fault restarts worker 2 with a lower memory threshold; Argus must not see a lost node, even when
    something still runs there (a drain alone would wait for it)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    collector = RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)
    detector = LostNodeDetector(lookback_s=120)
    # Nodes that other tests of this session ended within the lookback are reported now; they are not ours.
    earlier = {f.subject.id for f in detector.detect(collector.collect())}
    old = ray_cluster.worker(2).node_id
    assert old not in earlier
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    busy = client.submit_job(entrypoint=f"{sys.executable} -c 'import time; time.sleep(600)'",
                             entrypoint_resources={"worker2": 0.1})
    try:
        wait_until("a job to run on worker 2", lambda: client.get_job_status(busy) == JobStatus.RUNNING,
                   timeout=60, interval=0.5)
        ray_faults.killed.append(2)  # restored by the fixture if the restart below fails half-way
        planned_restart(ray_cluster, 2, "for a test")
        ray_faults.killed.remove(2)
    finally:
        client.stop_job(busy)
    assert ray_cluster.worker(2).node_id != old
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a few polls, as the loop would make
        signals = collector.collect()
        states = {s.subject.id: s for s in signals if s.subject.id == old}
        assert [f for f in detector.detect(signals) if f.subject.id not in earlier] == []
        time.sleep(1)
    [dead] = states.values()
    assert "argus: planned restart" in (dead.text or str(dead.attrs))


def test_the_demo_finds_its_job_scripts_where_the_stage_keeps_them(tmp_path):
    ctx = DemoContext(cluster=None, sims=[], api=None, code_dir=tmp_path / "code")
    ctx.prepare_code()
    copied = sorted(p.name for p in ctx.code_dir.iterdir())
    assert copied == ["cuda_oom.py", "gloo_steps.py", "host_oom.py", "idle_gpus.py", "train.py"]
    assert (ctx.code_dir / "host_oom.py").read_text() == (JOBS_DIR / "host_oom.py").read_text()
    assert JOBS_DIR.parent.name == "localstack" and JOBS_DIR.parent.parent.name == "stage"
