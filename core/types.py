"""The one vocabulary: Signal, Finding, Incident, Action, Report and the closed list of categories.

Free of Ray, langchain and SQLAlchemy types, so every package can speak it and tests can build it.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_ISO_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _iso_date_time(value: object) -> object:
    # pydantic reads a bare number as seconds since 1970 ("0.5" becomes 1970-01-01T00:00:00.5): an input that
    # documents `date-time` takes RFC 3339 text only, so a client's mistake is a clear error, not a 1970 filter.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _ISO_DATE_TIME.match(value):
        raise ValueError("must be an RFC 3339 date and time, e.g. 2026-11-29T08:00:00Z")
    return value


def _whole_number(value: object) -> object:
    # JSON Schema counts a number with no fraction as an integer, so a client may send 2.0; strict models still
    # refuse "2", true and 2.5
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer read from outside by a strict model: 2.0 is 2 (put it after the Field that constrains the int).
WholeNumber = BeforeValidator(_whole_number)

# A date and time read from outside (a query, a webhook's body): RFC 3339 text, not a number.
IsoDateTime = Annotated[datetime, BeforeValidator(_iso_date_time)]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Category(str, Enum):
    """What went wrong. Closed: detectors, RCA, `argus analyze` and the API all use exactly these."""

    GPU_OOM = "gpu_oom"
    HOST_OOM = "host_oom"
    NCCL_HANG = "nccl_hang"
    NCCL_ERROR = "nccl_error"
    NODE_LOST = "node_lost"
    GPU_HARDWARE = "gpu_hardware"
    DISK_FULL = "disk_full"
    IDLE_GPU = "idle_gpu"
    UNSCHEDULABLE = "unschedulable"  # a job waits for a place no node offers (PENDING driver, unplaced groups)
    TRAINING_ANOMALY = "training_anomaly"  # the job runs, its metrics went wrong: NaN loss, spikes, slow steps
    USER_ERROR = "user_error"
    UNKNOWN = "unknown"


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "critical": 2}[self.value]


class SubjectKind(str, Enum):
    JOB = "job"
    NODE = "node"
    GPU = "gpu"
    CLUSTER = "cluster"


class SignalKind(str, Enum):
    NODE_STATE = "node_state"
    JOB_STATE = "job_state"
    LOG_LINE = "log_line"
    METRIC = "metric"
    ALERT = "alert"
    STACKS = "stacks"  # stack samples of a job's processes (collectors/rank_stacks.py)


class IncidentState(str, Enum):
    OPEN = "open"
    MITIGATING = "mitigating"
    RESOLVED = "resolved"


class ActionState(str, Enum):
    PLANNED = "planned"
    APPROVED = "approved"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    REJECTED = "rejected"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Subject(_Model):
    """What a signal or finding is about: a job (submission id), a node (Ray node id), a GPU or the cluster."""

    kind: SubjectKind
    id: str
    name: str | None = None  # human-friendly: node IP, job entrypoint, GPU UUID

    def key(self) -> str:
        return f"{self.kind.value}:{self.id}"


class Signal(_Model):
    """One observation: a node or job state, a log line with its source, a metric sample, an alert."""

    kind: SignalKind
    source: str  # where it came from: "ray.state", "prometheus", a log file path
    subject: Subject
    observed_at: datetime = Field(default_factory=utcnow)
    text: str | None = None  # a log line, or a state message
    line: int | None = None  # line number in `source` for log lines
    value: float | None = None  # a metric sample
    attrs: dict[str, Any] = Field(default_factory=dict)


class Evidence(_Model):
    """One piece of support for a claim, quotable in a report."""

    source: str
    text: str
    line: int | None = None
    at: datetime | None = None
    value: float | None = None


def fingerprint_of(category: Category, subject: Subject, discriminator: str = "") -> str:
    """Stable across restarts: the same claim about the same subject is the same incident."""
    raw = f"{category.value}|{subject.key()}|{discriminator}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class Finding(_Model):
    """One detector's claim about one subject, with the evidence for it."""

    category: Category
    reason: str  # the rule or detector that made the claim, e.g. "NodeDead"
    subject: Subject
    summary: str
    severity: Severity = Severity.WARNING
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    evidence: tuple[Evidence, ...] = ()
    first_seen: datetime = Field(default_factory=utcnow)
    detected_at: datetime = Field(default_factory=utcnow)
    recommended_action: str | None = None
    fingerprint: str = ""
    attrs: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint_of(self.category, self.subject))


class Recovery(_Model):
    """One detector's claim that a fault it found has ended: the open incident with this fingerprint may close.

    `reason` says what ended it, in words for the record and the resolve message ("progress resumed at step
    120", "node 10.0.0.7 is ALIVE again").
    """

    fingerprint: str = Field(min_length=1)
    reason: str
    detector: str
    observed_at: datetime = Field(default_factory=utcnow)
    # The severity the incident keeps once closed, when how it ended shows the fault mattered less than feared
    # (an error line in a job that went on to succeed is a warning); None keeps the incident's own.
    severity: Severity | None = None


# The incident attrs the store keeps about a fault that came back after its incident was resolved (flapping):
# how many times it was reopened, when last, and when it had been resolved before that. Kept in attrs, not in
# columns of their own, so that counting reopenings needed no schema change.
REOPENED = "reopened"
REOPENED_AT = "reopened_at"
RESOLVED_BEFORE = "resolved_before"
# The attrs of a resolved incident that say who resolved it and why ({by, reason, at}): a person, Alertmanager, or
# the detector that saw the fault end, with its reason ("progress resumed at step 120"). Cleared when it reopens.
RESOLUTION = "resolution"


class Incident(_Model):
    """Findings with one fingerprint, with a lifecycle. Built by the store; read by everyone else."""

    id: str
    fingerprint: str
    category: Category
    subject: Subject
    state: IncidentState
    severity: Severity
    summary: str
    reason: str
    first_seen: datetime
    last_seen: datetime
    detected_at: datetime
    occurrences: int = 1
    recommended_action: str | None = None
    attrs: dict[str, Any] = Field(default_factory=dict)
    resolved_at: datetime | None = None

    @property
    def reopened(self) -> int:
        """How many times the fault came back after the incident was resolved (0: never)."""
        count = self.attrs.get(REOPENED, 0)
        return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0

    @property
    def resolution(self) -> str | None:
        """"by argus:stall: progress resumed at step 120" for a resolved incident whose resolution is recorded."""
        record = self.attrs.get(RESOLUTION) if self.state is IncidentState.RESOLVED else None
        if not isinstance(record, dict):
            return None
        by, reason = str(record.get("by") or ""), str(record.get("reason") or "")
        text = f"by {by}" if by else ""
        return (f"{text}: {reason}" if text else reason) if reason else (text or None)


class Action(_Model):
    """One remediation step, with an idempotency key so a restart never repeats it."""

    id: str
    incident_id: str | None
    kind: str  # drain_node, resubmit_job, keep_scene, stop_job
    target: Subject
    state: ActionState
    idempotency_key: str
    requested_by: str
    reason: str = ""
    dry_run: bool = True
    result: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Report(_Model):
    """A root-cause report for an incident, in Markdown, with its structured parts."""

    id: str
    incident_id: str
    category: Category
    confidence: float
    summary: str
    markdown: str
    generator: str  # "deterministic" or the LLM model name
    created_at: datetime = Field(default_factory=utcnow)
    data: dict[str, Any] = Field(default_factory=dict)
