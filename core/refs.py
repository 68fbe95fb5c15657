"""Which jobs, node and GPU a finding or an incident is about: one reading of its subject and attrs.

Detectors say it in two ways: the subject (kind job: the submission id; kind node: the Ray node id, its
IP as the name; kind gpu: the GPU's UUID) and attrs, because a claim about one thing often names others:
the lost-node detector lists under `jobs` the jobs that had work on the node (dicts from Ray with
`submission_id` and `job_id`, or plain strings), a job failure carries `submission_id`, a log line
carries `node_id` and `node_ip` (where it was written), a job's host OOM `affected_node_id` and
`affected_node_ip` (the node it struck). Correlation, remediation, reports, the exporter and notifications all
read these through `refs_of`, so they agree on what an incident touches.

Attrs come from logs and outside systems: every value is type-checked here, anything else is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from core.jobfolder import is_submission_id
from core.signal_keys import AFFECTED_NODE_ID, AFFECTED_NODE_IP, JOB_ID, JOBS, NODE_ID, NODE_IP, SUBMISSION_ID
from core.types import Subject, SubjectKind


class HasRefs(Protocol):
    """A Finding or an Incident: anything with a subject and attrs."""

    @property
    def subject(self) -> Subject: ...

    @property
    def attrs(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Refs:
    """What one finding or incident names.

    `submission_id`: the job it is about (attrs first, then a job subject). `submission_ids`: every
    submission id it names, in order (a job subject, attrs `submission_id`, then `jobs`), as given (check
    with `actionable_submission_ids` before using one as a folder or a Ray call). `job_ids`: every id a
    job may be known by (submission ids, Ray job ids, plain strings in `jobs`), for matching one claim
    with another. Node: the Ray node id and IP (subject kind node, else attrs; a node subject's IP is the attrs'
    only when they are about that node: a line one node wrote about another carries its writer's). `affected_node_id`
    / `affected_node_ip`: the node a fault struck, the node subject itself, else the attrs a job's finding names it
    by (a job's host OOM names the node its workers were killed on). `gpu`: a GPU subject's UUID.
    """

    submission_id: str | None = None
    submission_ids: tuple[str, ...] = ()
    job_ids: frozenset[str] = frozenset()
    node_id: str | None = None
    node_ip: str | None = None
    affected_node_id: str | None = None
    affected_node_ip: str | None = None
    gpu: str | None = None

    @property
    def actionable_submission_ids(self) -> list[str]:
        """The submission ids that may name a job folder or a Ray job: well-formed ones, in order."""
        return [s for s in self.submission_ids if is_submission_id(s)]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def refs_from(subject: Subject, attrs: dict[str, Any] | None) -> Refs:
    attrs = attrs if isinstance(attrs, dict) else {}
    kind = subject.kind
    listed = attrs.get(JOBS)
    listed = listed if isinstance(listed, (list, tuple)) else []
    attr_sid = attrs.get(SUBMISSION_ID)

    named: list[str] = []
    if kind is SubjectKind.JOB:
        named.append(subject.id)
    if isinstance(attr_sid, str):
        named.append(attr_sid)
    named += [job[SUBMISSION_ID] for job in listed if isinstance(job, dict) and isinstance(job.get(SUBMISSION_ID), str)]

    # Matching uses every id a job goes by: a claim may know only the Ray job id, or name jobs as strings.
    ids: set[str] = set()
    if kind is SubjectKind.JOB:
        ids.add(subject.id)
    for job in listed:
        if isinstance(job, dict):
            ids.update(str(v) for key in (SUBMISSION_ID, JOB_ID) if (v := job.get(key)))
        elif isinstance(job, str):
            ids.add(job)
    if isinstance(attr_sid, str):
        ids.add(attr_sid)

    is_node = kind is SubjectKind.NODE
    node_id = subject.id if is_node else _str(attrs.get(NODE_ID))
    written_on = _str(attrs.get(NODE_ID))
    attr_ip = _str(attrs.get(NODE_IP)) if not is_node or written_on in (None, subject.id) else None
    node_ip = attr_ip or (_str(subject.name) if is_node else None)
    return Refs(
        submission_id=_str(attr_sid) or (subject.id if kind is SubjectKind.JOB else None),
        submission_ids=tuple(dict.fromkeys(named)),
        job_ids=frozenset(ids),
        node_id=node_id,
        node_ip=node_ip,
        affected_node_id=node_id if is_node else _str(attrs.get(AFFECTED_NODE_ID)),
        affected_node_ip=node_ip if is_node else _str(attrs.get(AFFECTED_NODE_IP)),
        gpu=subject.id if kind is SubjectKind.GPU else None,
    )


def refs_of(item: HasRefs) -> Refs:
    """What a Finding or an Incident is about."""
    return refs_from(item.subject, item.attrs)


def jobs_of(subject_kind: SubjectKind, subject_id: str, attrs: dict[str, Any]) -> set[str]:
    """Every id of every job a claim touches: argus.correlate's rule, for callers holding the parts."""
    return set(refs_from(Subject(kind=subject_kind, id=subject_id), attrs).job_ids)
