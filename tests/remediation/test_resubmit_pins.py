"""A resubmission asks Ray for the place its job's driver was pinned to: the JobSpec's `resources`, pool and labels
come back from the spec snapshot in the job's folder, round after round (`<sid>-r1`, then `<sid>-r2`). A driver that
lost its pin could land on the node a fault, a drain or an operator keeps it off. (An adopted job's pin comes from
Ray's record of it: tests/control/test_adopt.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control.jobs import JobController
from control.jobspec import JobSpec
from control.local import LocalRunner
from core.types import Category, Subject, SubjectKind
from remediation.actions import Context, resubmit_job
from tests.support import make_incident

SID = "train-20261122T081944Z-71d9"
PIN = {"resources": {"worker1": 0.001}, "pool": "h100", "labels": {"example.com/tier": "gold"}}


class FakeRay:
    """The Jobs SDK calls a resubmission makes: it records each submission; Ray has forgotten the old jobs."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def submit_job(self, **call: Any) -> str:
        self.calls.append(call)
        return str(call["submission_id"])

    def get_job_info(self, submission_id: str) -> Any:
        raise RuntimeError(f"Request failed with status code 404: Job {submission_id} does not exist.")


def test_a_resubmission_keeps_the_drivers_pin_round_after_round(tmp_path: Path) -> None:
    ray = FakeRay()
    jobs = JobController("http://127.0.0.1:1", tmp_path / "shared", client=ray)
    ctx = Context(jobs=jobs, registry=None, nodes=None, dashboard_url="http://127.0.0.1:1",  # type: ignore[arg-type]
                  gcs_address=None, local=LocalRunner())
    jobs.submit(JobSpec.from_dict({"name": "train", "entrypoint": "python3 train.py", "owner": "alice",
                                   "submission_id": SID, **PIN}))
    for n, sid in enumerate((SID, f"{SID}-r1"), start=1):
        (ctx.folders.of(sid).root / "checkpoints" / f"global_step_{5 * n}").mkdir()
        incident = make_incident(category=Category.NODE_LOST, subject=Subject(kind=SubjectKind.JOB, id=sid))
        outcome = resubmit_job(ctx, incident, {}, dry_run=False)
        assert outcome.data["jobs"][0]["state"] == "submitted", outcome.message
        call = ray.calls[-1]
        assert call["submission_id"] == f"{SID}-r{n}"
        assert call["entrypoint_resources"] == {"worker": 0.001, "worker1": 0.001}
        assert call["entrypoint_label_selector"] == {"example.com/tier": "gold", "argus.io/pool": "h100"}
        assert JobSpec.load(ctx.folders.of(f"{SID}-r{n}").spec_file).resources == {"worker1": 0.001}
