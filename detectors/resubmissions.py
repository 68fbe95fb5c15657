"""Whether a job runs again, itself or as a resubmission: one reading of JOB_STATE signals for the detectors
whose faults end that way (a failed job, a stalled job, the jobs a lost node hit).

A resubmission is recognised by what Argus writes when it resubmits (core.lineage): Ray job metadata naming
the job it resubmits, the chain's first job (root) and the attempt. A job submitted through Argus (metadata
argus=1) without that metadata, resubmitted before Argus wrote it, is recognised by its id,
`<root[:56]>-r<attempt>`. A job anyone submits with `ray job submit`, even with the same entrypoint, is not
taken for a resubmission: nothing but a guess links it to the job that failed.

Resubmissions form a chain (the root, -r1, -r2, ...): a later attempt that runs is a resubmission of every
earlier one that runs again, so the fault of the root closes when -r2 runs although -r1 never started.

A job "reached RUNNING" when a JOB_STATE said RUNNING, or SUCCEEDED (it ran, perhaps between two polls). A
job seen only FAILED or STOPPED may never have started (a bad runtime env fails while PENDING), so it counts
only when this watch saw it RUNNING before. Ray lists finished jobs too, so after a restart of Argus the
resubmissions that ran and ended are known again from the first poll.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core import signal_keys as keys
from core.lineage import ROOT_CHARS, Lineage, parse_resubmission_id, submitted_by_argus
from core.types import Signal, SignalKind, SubjectKind

RAN = frozenset({"RUNNING", "SUCCEEDED"})  # statuses that prove the job ran


@dataclass(frozen=True)
class _Chain:
    """A job's place in its chain of resubmissions. `exact`: `root` is the root's whole id (from metadata);
    otherwise only its first 56 characters are known (from the id)."""

    root: str
    attempt: int
    exact: bool
    of: str | None = None

    def same_root(self, other: _Chain) -> bool:
        if self.exact and other.exact:
            return self.root == other.root
        return self.root[:ROOT_CHARS] == other.root[:ROOT_CHARS]


@dataclass
class _Job:
    status: str | None
    ran: bool
    chain: _Chain | None  # None: not a resubmission (the root of any chain it starts)


class JobRuns:
    """What the JOB_STATE signals said of each job: its status, whether it ran, and whose resubmission it is.

    Feed it every detect() call's signals (`observe`); ask `resubmission_ran(job)`. (A job itself never runs
    again: Ray does not take a submission id from an ended state back to RUNNING.) Bounded: the least recently
    reported jobs are forgotten past `max_jobs` (Ray reports every job it keeps on every poll)."""

    def __init__(self, *, max_jobs: int = 100_000) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        # The resubmissions that ran, by the job they name and by their root's first 56 characters: a query
        # looks at one chain, not at every job.
        self._ran_by_of: dict[str, set[str]] = {}
        self._ran_by_root: dict[str, dict[str, _Chain]] = {}
        self.generation = 0  # grows when a resubmission is first seen to have run: callers re-check only then

    def observe(self, signals: Sequence[Signal]) -> None:
        for signal in signals:
            if signal.kind is not SignalKind.JOB_STATE or signal.subject.kind is not SubjectKind.JOB:
                continue
            sid = signal.subject.id
            status = str(signal.attrs.get(keys.STATUS) or "") or None
            before = self._jobs.pop(sid, None)
            ran = (before is not None and before.ran) or status in RAN
            metadata = signal.attrs.get(keys.METADATA)
            chain = _chain_of(sid, metadata if isinstance(metadata, Mapping) else {})
            self._jobs[sid] = job = _Job(status=status, ran=ran, chain=chain)
            if ran and chain is not None and (before is None or not before.ran):
                self._index(sid, job)
            while len(self._jobs) > self.max_jobs:
                self._unindex(*self._jobs.popitem(last=False))

    def status(self, job_id: str) -> str | None:
        """The job's last reported status; None when no JOB_STATE named it."""
        job = self._jobs.get(job_id)
        return job.status if job is not None else None

    def resubmission_ran(self, job_id: str) -> str | None:
        """The id of a resubmission of `job_id` (a later attempt of its chain) that reached RUNNING; None if none."""
        mine = self._jobs.get(job_id)
        place = mine.chain if mine is not None and mine.chain is not None else _Chain(job_id, 0, exact=True)
        found: list[tuple[int, str]] = []
        for sid in self._ran_by_of.get(job_id, ()):
            chain = self._jobs[sid].chain
            assert chain is not None  # indexed only with a chain
            found.append((chain.attempt, sid))
        for sid, chain in self._ran_by_root.get(place.root[:ROOT_CHARS], {}).items():
            if sid != job_id and chain.same_root(place) and chain.attempt > place.attempt:
                found.append((chain.attempt, sid))
        return max(found)[1] if found else None  # the newest attempt: the one a person would look at

    def _index(self, sid: str, job: _Job) -> None:
        chain = job.chain
        assert chain is not None
        if chain.of is not None:
            self._ran_by_of.setdefault(chain.of, set()).add(sid)
        self._ran_by_root.setdefault(chain.root[:ROOT_CHARS], {})[sid] = chain
        self.generation += 1

    def _unindex(self, sid: str, job: _Job) -> None:
        chain = job.chain
        if chain is None or not job.ran:
            return
        if chain.of is not None and (named := self._ran_by_of.get(chain.of)) is not None:
            named.discard(sid)
            if not named:
                del self._ran_by_of[chain.of]
        stem = chain.root[:ROOT_CHARS]
        if (same := self._ran_by_root.get(stem)) is not None:
            same.pop(sid, None)
            if not same:
                del self._ran_by_root[stem]


def _chain_of(sid: str, metadata: Mapping[str, object]) -> _Chain | None:
    lineage = Lineage.from_metadata(metadata)
    if lineage is not None:
        return _Chain(lineage.root, lineage.attempt, exact=True, of=lineage.of)
    if not submitted_by_argus(metadata):
        return None  # a job Argus did not submit is no resubmission of Argus's, whatever its id
    parsed = parse_resubmission_id(sid)
    return _Chain(parsed[0], parsed[1], exact=False) if parsed is not None else None
