"""A report for log files read outside a live cluster: `argus analyze --report / --llm` and bench/rca_eval.py.

The logs stand for one job that failed with no cause known yet: the incident and finding below say exactly
that (category unknown, "job failed"), so the RcaEngine decides everything from the logs, the same way it
does for an incident's logs on a cluster (every log classified on its own, the first failure across them wins,
the LLM's narrative where a writer is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from core.types import Category, Finding, Incident, IncidentState, Report, Severity, Subject, SubjectKind
from rca.engine import RcaEngine
from rca.evidence import LogSource

OFFLINE_REASON = "JobFailed"


def failed_job(name: str, at: datetime | None = None) -> tuple[Incident, Finding]:
    """The incident and finding of a job `name` that failed, its cause not known."""
    at = at or datetime.now(timezone.utc)
    subject = Subject(kind=SubjectKind.JOB, id=name)
    incident = Incident(id=f"offline-{name}"[:120], fingerprint=f"offline:{name}", category=Category.UNKNOWN,
                        subject=subject, state=IncidentState.OPEN, severity=Severity.CRITICAL,
                        summary=f"job {name} failed", reason=OFFLINE_REASON, first_seen=at, last_seen=at,
                        detected_at=at)
    finding = Finding(category=Category.UNKNOWN, reason=OFFLINE_REASON, subject=subject, summary="job failed",
                      severity=Severity.CRITICAL, evidence=(),
                      first_seen=at)
    return incident, finding


def report_logs(engine: RcaEngine, name: str, logs: Sequence[LogSource], *, use_llm: bool = True,
                at: datetime | None = None) -> Report:
    """The engine's report on `logs` as the logs of one failed job called `name`."""
    incident, finding = failed_job(name, at)
    return engine.report(incident, [finding], logs, use_llm=use_llm)
