"""The job queue: every job Argus starts goes through it, so a job starts only when its whole gang fits
(control/admission.py) and otherwise waits, first that fits first, with the reason it waits.

queued → started (handed to Ray; from then on Ray's status says running, then finished) → finished; or queued →
expired (its queue timeout passed; the reason it last waited for is kept), cancelled (stopped while queued), failed
(Ray refused the submission). The queue is persisted (argus/store/job_queue.py): a restart keeps every place.

`tick()` (a chore of the daemon, and once after each submission) reads Ray (`read_capacity`, passed in), leaves out
the nodes Argus took out of rotation (draining, offline, failed in the node registry), counts the started jobs Ray
has not ended as claims, expires, admits and submits. Admission is a compare-and-set in the store (queued →
started), so two replicas never submit one job twice.

A resubmission (remediation's resubmit_job) is queued like any job: it carries the checkpoint it resumes from and
its lineage, and waits for a replacement node rather than failing. `started_at - enqueued_at` is how long it waited.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from control.admission import Admit, Candidate, Claim, ClusterGpus, Gang, Wait, admit
from control.jobs import TERMINAL, JobController, JobRecord
from control.jobspec import JobSpec
from control.nodes import NodeRegistry, NodeState
from core.errors import ArgusError, Conflict, NotFound
from core.lineage import Lineage
from core.types import utcnow

OUT_OF_ROTATION = frozenset({NodeState.DRAINING, NodeState.OFFLINE, NodeState.FAILED})
UNREADABLE = "Ray's state cannot be read now ({}); the queue waits until it can"


class QueueState(str, Enum):
    QUEUED = "queued"
    STARTED = "started"  # handed to Ray: Ray's own status (PENDING, RUNNING) says where it is
    FINISHED = "finished"  # Ray ended it (SUCCEEDED, FAILED, STOPPED)
    EXPIRED = "expired"  # waited past its queue timeout
    CANCELLED = "cancelled"  # stopped while queued
    FAILED = "failed"  # Ray refused to take it

    @property
    def waiting(self) -> bool:
        return self is QueueState.QUEUED


@dataclass(frozen=True)
class QueueEntry:
    """One job's place in the queue. `request`: the spec as JSON, and for a resubmission `resume_from` and
    `lineage` (what JobController.submit takes besides the spec)."""

    position: int
    submission_id: str
    owner: str
    gang: Gang
    request: dict[str, Any]
    state: QueueState
    reason: str
    enqueued_at: datetime
    timeout_s: float | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    ray_status: str | None = None

    @property
    def spec(self) -> JobSpec:
        return JobSpec.from_dict(self.request["spec"], source=f"the queued spec of {self.submission_id}")

    @property
    def waited_s(self) -> float | None:
        """How long it waited for capacity: until it started, or (still queued) until now is the caller's sum."""
        return (self.started_at - self.enqueued_at).total_seconds() if self.started_at else None

    def job_state(self) -> str:
        """queued, running or finished for people: Ray's word once it has the job."""
        if self.state is QueueState.STARTED:
            return "running" if self.ray_status in {None, "PENDING", "RUNNING"} else "finished"
        return {QueueState.QUEUED: "queued", QueueState.FINISHED: "finished"}.get(self.state, self.state.value)


class QueueStore(Protocol):
    """Where the queue keeps its entries (argus/store/job_queue.py)."""

    def add(self, entry: QueueEntry) -> QueueEntry: ...

    def get(self, submission_id: str) -> QueueEntry: ...

    def list(self, *, states: Sequence[QueueState] | None = None, owner: str | None = None,
             limit: int = 1000) -> builtins.list[QueueEntry]: ...

    def move(self, submission_id: str, from_state: QueueState, to_state: QueueState, *, reason: str,
             at: datetime | None = None, ray_status: str | None = None) -> QueueEntry | None:
        """Compare-and-set: the moved entry, or None when it was no longer in `from_state`."""
        ...

    def note(self, submission_id: str, *, reason: str | None = None, ray_status: str | None = None) -> None: ...


@dataclass
class TickOutcome:
    started: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    waiting: int = 0
    error: str | None = None
    refusals: dict[str, ArgusError] = field(default_factory=dict)  # what Ray answered the submissions it refused
    waited_s: dict[str, float] = field(default_factory=dict)  # the started ones: how long each waited
    waiting_by_pool: dict[str, int] = field(default_factory=dict)  # still queued, by pool ("" for any node)


class JobQueue:
    """Queue, admit and start jobs. Thread-safe: one tick at a time in this process."""

    def __init__(
        self,
        store: QueueStore,
        jobs: JobController,
        read_capacity: Callable[[], ClusterGpus],
        *,
        registry: NodeRegistry | None = None,
        default_timeout_s: float | None = None,
        user_limit: Callable[[str], int | None] = lambda _user: None,
        clock: Callable[[], datetime] = utcnow,
        observe: Callable[[TickOutcome], None] | None = None,
    ) -> None:
        """`observe`: told each tick's outcome (Argus's metrics)."""
        self.store = store
        self.jobs = jobs
        self.read_capacity = read_capacity
        self.registry = registry
        self.default_timeout_s = default_timeout_s
        self.user_limit = user_limit
        self.clock = clock
        self.observe = observe
        self._lock = threading.Lock()

    # -- submitting ----------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, resume_from: Path | None = None, lineage: Lineage | None = None,
               timeout_s: float | None = None, resubmit_marker: dict[str, Any] | None = None) -> QueueEntry:
        """Queue `spec` and start it at once when its gang fits; the entry as it stands after that.
        `resubmit_marker`: for a resubmission, what remediation records in its folder (config/resubmit.json) once it
        starts: the chain it belongs to."""
        sid = spec.submission_id or self.jobs.new_submission_id(spec.name)
        for path, what in ((spec.code_path, "code_path"), (spec.working_dir, "working_dir")):
            if path is not None:
                self.jobs.check_code_dir(Path(path), what, sid)  # refused now, not when its turn comes
        if self.jobs.folder(sid).exists():
            raise Conflict(f"job folder {self.jobs.job_dir(sid)} already exists",
                           hint="choose another submission_id, or leave it out to get a generated one")
        request: dict[str, Any] = {"spec": spec.model_copy(update={"submission_id": sid}).model_dump(mode="json")}
        if resume_from is not None:
            request["resume_from"] = str(resume_from)
        if lineage is not None:
            request["lineage"] = lineage.metadata()
        if resubmit_marker is not None:
            request["resubmit_marker"] = resubmit_marker
        self.jobs.user_dir(spec.owner)  # the owner's own folders exist from their first job on
        gang = Gang(nnodes=spec.nnodes, gpus_per_node=spec.gpus_per_node, pool=spec.pool_name)
        entry = self.store.add(QueueEntry(
            position=0, submission_id=sid, owner=spec.owner, gang=gang, request=request, state=QueueState.QUEUED,
            reason=f"queued for {gang.text()}", enqueued_at=self.clock(),
            timeout_s=next((t for t in (timeout_s, spec.queue_timeout_s, self.default_timeout_s) if t is not None),
                           None)))
        logger.info("queued job {} ({}, owner {})", sid, gang.text(), spec.owner)
        outcome = self.tick()
        refused = outcome.refusals.get(sid)
        if refused is not None:
            raise refused  # the caller hears Ray's answer as it was (unreachable, conflict); the entry says failed
        return self.store.get(entry.submission_id)

    def cancel(self, submission_id: str, *, reason: str) -> QueueEntry | None:
        """Take a queued job out of the queue; None when it is not queued (started: stop it in Ray)."""
        moved = self.store.move(submission_id, QueueState.QUEUED, QueueState.CANCELLED, reason=reason,
                                at=self.clock())
        if moved is not None:
            logger.info("cancelled queued job {}: {}", submission_id, reason)
        return moved

    def get(self, submission_id: str) -> QueueEntry:
        return self.store.get(submission_id)

    def find(self, submission_id: str) -> QueueEntry | None:
        try:
            return self.store.get(submission_id)
        except NotFound:
            return None

    # -- the chore -----------------------------------------------------------------------------------

    def tick(self) -> TickOutcome:
        """Finish what Ray ended, expire, admit and start; see the module docstring."""
        with self._lock:
            outcome = self._tick()
        if self.observe is not None:
            try:
                self.observe(outcome)
            except Exception as exc:  # noqa: BLE001 - a metric must never stop the queue
                logger.warning("could not record the job queue's tick: {}", exc)
        return outcome

    def _tick(self) -> TickOutcome:
        outcome = TickOutcome()
        live = self.store.list(states=[QueueState.QUEUED, QueueState.STARTED])
        if not live:
            return outcome
        waiting = {e.submission_id: e.gang.pool or "" for e in live if e.state is QueueState.QUEUED}
        now = self.clock()
        queued = [e for e in live if e.state is QueueState.QUEUED]
        for entry in queued:
            if entry.timeout_s is not None and (now - entry.enqueued_at).total_seconds() > entry.timeout_s:
                reason = f"not started within its queue timeout of {entry.timeout_s:g} s: {entry.reason}"
                if self.store.move(entry.submission_id, QueueState.QUEUED, QueueState.EXPIRED, reason=reason,
                                   at=now):
                    logger.warning("queued job {} expired: {}", entry.submission_id, reason)
                    outcome.expired.append(entry.submission_id)
        queued = [e for e in queued if e.submission_id not in outcome.expired]
        started = [e for e in live if e.state is QueueState.STARTED]
        if not queued:
            self._finish_ended(started, now, outcome)  # nothing to admit: Ray's job list is all it needs
            return outcome
        try:
            cluster = self.read_capacity()
        except ArgusError as exc:
            outcome.error = UNREADABLE.format(exc.message)
            for entry in queued:
                self.store.note(entry.submission_id, reason=outcome.error)
            outcome.waiting = len(queued)
            outcome.waiting_by_pool = dict(Counter(waiting[e.submission_id] for e in queued))
            return outcome
        claims = self._claims(started, cluster, now, outcome)
        nodes = self._in_rotation(cluster)
        decisions = admit([Candidate(e.submission_id, e.owner, e.gang) for e in queued], nodes, claims,
                          user_limit=self.user_limit)
        by_id = {e.submission_id: e for e in queued}
        for decision in decisions:
            entry = by_id[decision.key]
            if isinstance(decision, Wait):
                outcome.waiting += 1
                if decision.reason != entry.reason:
                    self.store.note(entry.submission_id, reason=decision.reason)
            elif isinstance(decision, Admit):
                self._start(entry, now, outcome)
        outcome.waiting_by_pool = dict(Counter(waiting[e.submission_id] for e in queued
                                               if e.submission_id not in outcome.started and e.submission_id not in
                                               outcome.failed))
        return outcome

    def _claims(self, started: Sequence[QueueEntry], cluster: ClusterGpus, now: datetime,
                outcome: TickOutcome) -> list[Claim]:
        claims = []
        for entry in started:
            status = cluster.status_by_job.get(entry.submission_id)
            if status in TERMINAL:
                self.store.move(entry.submission_id, QueueState.STARTED, QueueState.FINISHED,
                                reason=f"Ray ended it: {status}", at=now, ray_status=status)
                outcome.finished.append(entry.submission_id)
                continue
            if status is not None and status != entry.ray_status:
                self.store.note(entry.submission_id, ray_status=status)
            claims.append(Claim(entry.submission_id, entry.owner, entry.gang,
                                seen_gpus=cluster.held_by_job.get(entry.submission_id, 0.0)))
        return claims

    def _finish_ended(self, started: Sequence[QueueEntry], now: datetime, outcome: TickOutcome) -> None:
        """Mark the started jobs Ray has ended finished, from Ray's job list alone (the cheap read: the full capacity
        reading lists every actor and placement group of the cluster, needed only while a job waits)."""
        if not started:
            return
        try:
            status = {r.submission_id: r.status for r in self.jobs.list()}
        except ArgusError as exc:
            logger.warning("could not list Ray's jobs (started jobs are checked again next tick): {}", exc)
            return
        self._claims(started, ClusterGpus(nodes=(), status_by_job=status), now, outcome)

    def _in_rotation(self, cluster: ClusterGpus) -> list[Any]:
        if self.registry is None:
            return list(cluster.nodes)
        try:
            out = {r.name for r in self.registry.list() if r.state in OUT_OF_ROTATION}
        except ArgusError as exc:
            logger.warning("could not read the node registry (no node is left out of rotation this tick): {}", exc)
            return list(cluster.nodes)
        return [n for n in cluster.nodes if cluster.node_names.get(n.node_id) not in out]

    def _start(self, entry: QueueEntry, now: datetime, outcome: TickOutcome) -> None:
        waited = (now - entry.enqueued_at).total_seconds()
        claimed = self.store.move(entry.submission_id, QueueState.QUEUED, QueueState.STARTED,
                                  reason=f"started after {waited:.0f} s in the queue", at=now, ray_status="PENDING")
        if claimed is None:
            return  # another replica (or a cancel) took it first
        try:
            record = self._submit(entry)
        except ArgusError as exc:
            reason = f"Ray refused it: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
            self.store.move(entry.submission_id, QueueState.STARTED, QueueState.FAILED, reason=reason,
                            at=self.clock())
            logger.warning("queued job {} could not be submitted: {}", entry.submission_id, reason)
            outcome.failed.append(entry.submission_id)
            outcome.refusals[entry.submission_id] = exc
            return
        marker = entry.request.get("resubmit_marker")
        if marker is not None:
            marker = {**marker, "queued_s": round(waited, 3)}
            self.jobs.folder(record.submission_id).resubmit_file.write_text(json.dumps(marker, indent=2) + "\n")
        logger.info("started queued job {} after {:.0f} s ({})", record.submission_id, waited, entry.gang.text())
        outcome.started.append(entry.submission_id)
        outcome.waited_s[entry.submission_id] = waited

    def _submit(self, entry: QueueEntry) -> JobRecord:
        resume = entry.request.get("resume_from")
        lineage = entry.request.get("lineage")
        return self.jobs.submit(entry.spec, resume_from=Path(resume) if resume else None,
                                lineage=Lineage.from_metadata(lineage) if lineage else None)

