"""JOB_STATE signals as collectors.ray_state emits them, for the detectors that follow jobs and their
resubmissions: an Argus submission (metadata argus=1), a resubmission (with the lineage core.lineage writes),
or a job anyone submitted with `ray job submit` (no metadata)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.lineage import Lineage, resubmission_id
from core.types import Signal, SignalKind, Subject, SubjectKind
from tests.support import T0

ARGUS = {"argus": "1", "owner": "alice", "workload": "grpo", "name": "grpo"}


def job_state(sid: str, status: str, *, at: datetime = T0, metadata: dict[str, str] | None = None,
              message: str | None = None, ended: datetime | None = None, job_id: str = "02000000") -> Signal:
    attrs: dict[str, Any] = {
        "status": status, "submission_id": sid, "job_id": job_id, "entrypoint": "python train.py",
        "message": message, "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR" if status == "FAILED" else None,
        "end_time": (ended or at).isoformat() if status in ("FAILED", "SUCCEEDED", "STOPPED") else None,
        "metadata": dict(metadata or {}),
    }
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", observed_at=at, text=message, attrs=attrs,
                  subject=Subject(kind=SubjectKind.JOB, id=sid, name="python train.py"))


def resubmission(of: str, attempt: int, status: str, *, root: str | None = None, sid: str | None = None,
                 at: datetime = T0) -> Signal:
    """The `attempt`-th resubmission of `of` as Argus makes it: the id scheme and the lineage metadata."""
    root = root or of
    lineage = Lineage(of=of, root=root, attempt=attempt)
    return job_state(sid or resubmission_id(root, attempt), status, at=at, metadata={**ARGUS, **lineage.metadata()})
