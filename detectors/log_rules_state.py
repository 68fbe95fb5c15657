"""What the log-rule detector keeps of the findings a job's own log lines opened, until the job's outcome closes them
at warning, and how that is remembered across an Argus restart (detectors/memory.py).

Kept per finding, only what its close needs: the fingerprint (the incident to close), the severity (the recovery's
is at most a warning), the category (with the job, the (subject, category) pair that is news again once closed),
the file and line the recovery's reason names, and when it was reported (a restart keeps the jobs reported to most
recently, as the detector's bound does). Not kept: evidence and summary, which the incident already holds.

Remembered per job, as one JSON object: the job's id and its open findings. The memory key is the job's
(memory.job_key); the object holds the id in full and must belong under the key it is read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.types import Category, Finding, Severity
from detectors.memory import (
    StateUnreadable,
    job_key,
    read_int,
    read_str,
    read_time,
    read_version,
)

STATE_VERSION = 1
# One open finding per category and job (its fingerprint is category + job): more cannot be this version's.
MAX_FINDINGS = len(Category)
_FILE_CHARS = 1000  # of the file named in the recovery's reason: every job's value stays far below the store's cap


@dataclass(frozen=True)
class OpenFinding:
    """A finding reported from a job's own log lines, open until the job's outcome is known."""

    fingerprint: str
    severity: Severity
    category: Category
    file: str
    line: int | None
    reported_at: datetime

    @classmethod
    def of(cls, finding: Finding) -> OpenFinding:
        line = finding.attrs.get("line")
        return cls(fingerprint=finding.fingerprint, severity=finding.severity, category=finding.category,
                   file=str(finding.attrs.get("file"))[:_FILE_CHARS], line=line if isinstance(line, int) else None,
                   reported_at=finding.detected_at)


def remembered(job_id: str, findings: list[OpenFinding]) -> dict[str, Any] | None:
    """What to remember of a job's open findings; None when it has none (nothing to close)."""
    if not findings:
        return None
    return {
        "v": STATE_VERSION,
        "job": job_id,
        "findings": [{
            "fingerprint": f.fingerprint,
            "severity": f.severity.value,
            "category": f.category.value,
            "file": f.file,
            "line": f.line,
            "reported_at": f.reported_at.isoformat(),
        } for f in findings],
    }


def recalled(key: str, value: dict[str, Any]) -> tuple[str, list[OpenFinding]]:
    """The job and its open findings remembered as `value` under memory key `key`; StateUnreadable when any part is
    not what this version writes, or it does not belong under `key`."""
    read_version(value, STATE_VERSION)
    job_id = read_str(value.get("job"), "job")
    if not job_id:
        raise StateUnreadable("its job is empty")
    if job_key(job_id) != key:
        raise StateUnreadable(f"it is the state of job {job_id}, saved under another key")
    items = value.get("findings")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_FINDINGS:
        raise StateUnreadable(f"findings is {items!r:.80}, not a list of 1 to {MAX_FINDINGS}")
    findings = [_finding_in(item, n) for n, item in enumerate(items)]
    if len({f.fingerprint for f in findings}) != len(findings):
        raise StateUnreadable("it holds one fingerprint twice")
    return job_id, findings


def _finding_in(item: Any, n: int) -> OpenFinding:
    what = f"finding {n}"
    if not isinstance(item, dict):
        raise StateUnreadable(f"{what} is {type(item).__name__}, not an object")
    fingerprint = read_str(item.get("fingerprint"), f"{what}: fingerprint")
    if not fingerprint:
        raise StateUnreadable(f"{what}: its fingerprint is empty")
    line = item.get("line")
    severity_text = read_str(item.get("severity"), f"{what}: severity")
    category_text = read_str(item.get("category"), f"{what}: category")
    try:
        severity, category = Severity(severity_text), Category(category_text)
    except ValueError as err:  # a severity or category this version does not know
        raise StateUnreadable(f"{what}: {err}") from None
    return OpenFinding(fingerprint=fingerprint, severity=severity, category=category,
                       file=read_str(item.get("file"), f"{what}: file"),
                       line=None if line is None else read_int(line, f"{what}: line"),
                       reported_at=read_time(item.get("reported_at"), f"{what}: reported_at"))
