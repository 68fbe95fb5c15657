"""What the stall detector knows of each job (its progress counters, the stall being reported) and how that is
remembered across an Argus restart (detectors/memory.py).

Remembered per job, as one JSON object: every counter's high mark, last progress time, recent step gaps and
last progress line (the line anchors the finding's fingerprint, so a stall seen again after a restart folds into
the same incident), the open episode's fingerprint, the last GPU activity, and that the job was RUNNING. Not
remembered: when the job was last heard of (a restart is a fresh start for forgetting), the last GPU utilisation
values and samples (a restart just needs one more sample to see activity again).

Remembered too, under its own detector name (HUNG_ENDED_MEMORY), each job that ended while hung, until a
resubmission of it runs: the stall's fingerprint (the incident its recovery closes), the status it ended with (the
recovery's reason says it) and when it ended (a restart keeps the most recent, as the detector's bound does). Its
memory key is the job's (memory.job_key); the object holds the job's id in full and must belong under that key.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core import signal_keys as keys
from core.types import Signal, SignalKind, Subject, SubjectKind
from detectors.memory import (
    StateUnreadable,
    job_key,
    read_int,
    read_number,
    read_optional_number,
    read_optional_str,
    read_optional_time,
    read_str,
    read_time,
    read_version,
)

HISTORY = 16  # per-step gaps kept per counter
MIN_GAPS = 2  # below this a counter's interval is unknown
MAX_COUNTERS = 64  # per job; a log with ever-new tqdm labels must not grow memory without bound
STATE_VERSION = 1
HUNG_ENDED_MEMORY = "stall_hung_ended"  # the detector name its ended hung jobs are remembered under
_LINE_CHARS = 2000  # of the last progress line, remembered: the finding quotes at most 500


@dataclass
class ProgressCounter:
    """One progress counter of one job: a step counter or, for jobs without steps, the log itself."""

    high: float | None = None
    last_at: datetime | None = None
    last_line: Signal | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    batch_gap: float | None = None  # the gap before the current poll's batch of lines
    batch_n: int = 0
    longest: float | None = None  # the longest silence between two polls that brought lines
    steps: int = 0

    def interval(self) -> float | None:
        """max(median of recent gaps, last gap): steps that slow down raise the estimate as they arrive."""
        if len(self.gaps) < MIN_GAPS:
            return None
        return max(statistics.median(self.gaps), self.gaps[-1])


@dataclass(frozen=True)
class RankProgress:
    """The last progress line of one process of a job (Ray prefixes an actor's output with its pid and IP)."""

    pid: int
    node: str | None
    text: str
    at: datetime
    count: int = 1  # progress lines of this process so far


@dataclass
class WatchedJob:
    subject: Subject
    status: str | None = None  # None: Ray has not said yet (a new job, or one remembered from before a restart)
    seen_at: datetime | None = None
    counters: dict[tuple[str, str], ProgressCounter] = field(default_factory=dict)
    log: ProgressCounter = field(default_factory=ProgressCounter)
    gpu_last: dict[str, float] = field(default_factory=dict)
    gpu_activity_at: datetime | None = None
    gpu_samples: dict[str, Signal] = field(default_factory=dict)
    # pid -> the last progress line Ray tagged with that process, when it was seen and the process's node (not kept
    # across restarts: the next lines teach it again)
    rank_progress: dict[int, RankProgress] = field(default_factory=dict)
    episode: str | None = None  # fingerprint of the stall being reported
    watch_from: datetime | None = None  # when Argus first read this job's backlog: no stall before a threshold more


@dataclass(frozen=True)
class HungEnded:
    """A job that left RUNNING while hung: its stall's incident stays open until a resubmission of it runs."""

    fingerprint: str  # of the stall
    status: str  # the one it ended with
    ended_at: datetime


def remembered(job: WatchedJob) -> dict[str, Any] | None:
    """What to remember of `job`; None when there is nothing worth it (not RUNNING, or no line of it seen)."""
    if job.status not in ("RUNNING", None) or job.log.last_at is None:
        return None
    return {
        "v": STATE_VERSION,
        "subject": job.subject.model_dump(mode="json"),
        "status": "RUNNING",
        "episode": job.episode,
        "gpu_activity_at": _iso(job.gpu_activity_at),
        "watch_from": _iso(job.watch_from),
        "log": _counter_out(job.log),
        "counters": [[name, label, _counter_out(c)] for (name, label), c in job.counters.items()],
    }


def recalled(key: str, value: dict[str, Any], now: datetime) -> WatchedJob:
    """The job remembered as `value`; StateUnreadable when any part of it is not what this version writes.
    Its status is left unknown: it is judged again once Ray says it is still RUNNING."""
    read_version(value, STATE_VERSION)
    if value.get("status") != "RUNNING":
        raise StateUnreadable(f"its status is {value.get('status')!r}; only RUNNING jobs are remembered")
    try:
        subject = Subject.model_validate(value.get("subject"))
    except ValueError as err:
        raise StateUnreadable(f"its subject is unreadable: {err}") from None
    if subject.kind is not SubjectKind.JOB or subject.id != key:
        raise StateUnreadable(f"its subject {subject.key()} is not job {key}")
    job = WatchedJob(subject=subject, seen_at=now)
    job.episode = read_optional_str(value.get("episode"), "episode")
    job.gpu_activity_at = read_optional_time(value.get("gpu_activity_at"), "gpu_activity_at")
    job.watch_from = read_optional_time(value.get("watch_from"), "watch_from")
    job.log = _counter_in(value.get("log"), subject, "log")
    if job.log.last_at is None:
        raise StateUnreadable("no line of it was seen")
    counters = value.get("counters")
    if not isinstance(counters, list):
        raise StateUnreadable(f"counters is {type(counters).__name__}, not a list")
    for item in counters[-MAX_COUNTERS:]:
        if not isinstance(item, list) or len(item) != 3:
            raise StateUnreadable(f"counter {item!r} is not [pattern, label, counter]")
        name, label = read_str(item[0], "counter pattern"), read_str(item[1], "counter label")
        job.counters[(name, label)] = _counter_in(item[2], subject, f"counter {name}")
    return job


def remembered_hung_ended(job_id: str, ended: HungEnded) -> dict[str, Any]:
    return {"v": STATE_VERSION, "job": job_id, "fingerprint": ended.fingerprint, "status": ended.status,
            "ended_at": ended.ended_at.isoformat()}


def recalled_hung_ended(key: str, value: dict[str, Any]) -> tuple[str, HungEnded]:
    """The job and its ended stall remembered as `value` under memory key `key`; StateUnreadable when any part is
    not what this version writes, or it does not belong under `key`."""
    read_version(value, STATE_VERSION)
    job_id = read_str(value.get("job"), "job")
    if not job_id or job_key(job_id) != key:
        raise StateUnreadable(f"it is the state of job {job_id!r}, saved under another key")
    fingerprint = read_str(value.get("fingerprint"), "fingerprint")
    status = read_str(value.get("status"), "status")
    if not fingerprint:
        raise StateUnreadable("its fingerprint is empty")
    if status in ("", "RUNNING"):
        raise StateUnreadable(f"its status is {status!r}, not one a job ends with")
    return job_id, HungEnded(fingerprint=fingerprint, status=status,
                             ended_at=read_time(value.get("ended_at"), "ended_at"))


def _counter_out(c: ProgressCounter) -> dict[str, Any]:
    line = c.last_line
    return {
        "high": c.high,
        "last_at": _iso(c.last_at),
        "gaps": list(c.gaps),
        "batch_gap": c.batch_gap,
        "batch_n": c.batch_n,
        "longest": c.longest,
        "steps": c.steps,
        "line": None if line is None else {
            "source": line.source,
            "line": line.line,
            "text": (line.text or "")[:_LINE_CHARS],
            "at": _iso(line.observed_at),
            "stream": line.attrs.get(keys.STREAM),
        },
    }


def _counter_in(value: Any, subject: Subject, what: str) -> ProgressCounter:
    if not isinstance(value, dict):
        raise StateUnreadable(f"{what} is {type(value).__name__}, not an object")
    gaps = value.get("gaps")
    if not isinstance(gaps, list):
        raise StateUnreadable(f"{what}: gaps is not a list")
    counter = ProgressCounter(
        high=read_optional_number(value.get("high"), f"{what}: high"),
        last_at=read_optional_time(value.get("last_at"), f"{what}: last_at"),
        gaps=deque((read_number(g, f"{what}: a gap") for g in gaps[-HISTORY:]), maxlen=HISTORY),
        batch_gap=read_optional_number(value.get("batch_gap"), f"{what}: batch_gap"),
        batch_n=read_int(value.get("batch_n"), f"{what}: batch_n"),
        longest=read_optional_number(value.get("longest"), f"{what}: longest"),
        steps=read_int(value.get("steps"), f"{what}: steps"),
    )
    line = value.get("line")
    if line is not None:
        if not isinstance(line, dict):
            raise StateUnreadable(f"{what}: line is not an object")
        number = line.get("line")
        stream = read_optional_str(line.get("stream"), f"{what}: line stream")
        counter.last_line = Signal(
            kind=SignalKind.LOG_LINE,
            source=read_str(line.get("source"), f"{what}: line source"),
            subject=subject,
            observed_at=read_time(line.get("at"), f"{what}: line time"),
            text=read_str(line.get("text"), f"{what}: line text"),
            line=None if number is None else read_int(number, f"{what}: line number"),
            attrs={} if stream is None else {keys.STREAM: stream},
        )
    return counter


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()
