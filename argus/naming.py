"""What the loop knows about jobs and nodes, added to every finding it files, so each is named as people name it.

A detector sees what its own signals say: a finding made from a log line knows the job's submission id but not
its JobSpec name or owner, a finding from the GCS's log knows a node id but not its IP. Ray's state (job
metadata, node names and IPs, collectors/ray_state.py) and the GPU placement (collectors/placement.py) arrive
in the same tick; the Directory learns them from every tick's signals and, before a finding is filed, adds
what the finding lacks: the job's name, owner and entrypoint, where the job's GPUs were, the node's name and
IP (attrs keys in core/signal_keys.py, read back by core.names). What the detector said itself is kept; the
fingerprint is not touched (it names the subject by kind and id, never by name).

Where a job's GPUs were is the last placement seen while it held any: a job that failed has released them by
the time its failure is filed, and that is still where it ran. Bounded: the newest `max_jobs` jobs and
`max_nodes` nodes are remembered (an evicted job is simply named by its id).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core import signal_keys as keys
from core.names import ENTRYPOINT_MAX, MAX_PLACED_NODES, PlacedGpus, clean, job_identity
from core.refs import refs_of
from core.types import Finding, Signal, SignalKind, SubjectKind

K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """A dict that forgets its least recently written keys past `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class JobFacts:
    name: str | None = None
    owner: str | None = None
    entrypoint: str | None = None


@dataclass(frozen=True)
class NodeFacts:
    ip: str | None = None
    name: str | None = None


class Directory:
    """Jobs (by submission id) and nodes (by Ray node id) as the loop last heard of them."""

    def __init__(self, *, max_jobs: int = 20_000, max_nodes: int = 20_000) -> None:
        self._jobs: _Recent[str, JobFacts] = _Recent(max_jobs)
        self._placement: _Recent[str, tuple[PlacedGpus, ...]] = _Recent(max_jobs)
        self._nodes: _Recent[str, NodeFacts] = _Recent(max_nodes)

    # -- learning ---------------------------------------------------------------------------------------

    def learn(self, signals: Sequence[Signal]) -> None:
        for signal in signals:
            attrs = signal.attrs
            if signal.kind is SignalKind.JOB_STATE and signal.subject.kind is SubjectKind.JOB:
                self._learn_job(signal.subject.id, attrs, signal.subject.name)
            elif signal.kind is SignalKind.NODE_STATE and signal.subject.kind is SubjectKind.NODE:
                self._learn_node(signal.subject.id, attrs.get(keys.NODE_IP) or signal.subject.name,
                                 attrs.get(keys.NODE_NAME))
            elif signal.kind is SignalKind.METRIC and attrs.get(keys.METRIC) == keys.JOB_GPUS_METRIC:
                self._learn_job(signal.subject.id, attrs, signal.subject.name)
                self._learn_placement(signal.subject.id, attrs.get(keys.NODES))
            elif signal.kind is SignalKind.METRIC and attrs.get(keys.METRIC) == keys.PLACEMENT_METRIC:
                for node in _dicts(attrs.get(keys.NODES)):
                    self._learn_node(node.get(keys.NODE_ID), node.get(keys.NODE_IP), node.get(keys.NODE_NAME))

    def _learn_job(self, sid: str, attrs: dict[str, Any], subject_name: str | None) -> None:
        known = self._jobs.get(sid) or JobFacts()
        identity = job_identity(attrs.get("metadata"))
        facts = JobFacts(
            name=clean(attrs.get(keys.JOB_NAME)) or clean(subject_name) or identity.name or known.name,
            owner=clean(attrs.get(keys.OWNER)) or identity.owner or known.owner,
            entrypoint=clean(attrs.get(keys.ENTRYPOINT), ENTRYPOINT_MAX) or known.entrypoint,
        )
        if facts != known or self._jobs.get(sid) is None:
            self._jobs.put(sid, facts)

    def _learn_node(self, node_id: object, ip: object, name: object) -> None:
        node_id = clean(node_id, 128)
        if node_id is None:
            return
        known = self._nodes.get(node_id) or NodeFacts()
        facts = NodeFacts(ip=clean(ip) or known.ip, name=clean(name) or known.name)
        if facts != known or self._nodes.get(node_id) is None:
            self._nodes.put(node_id, facts)

    def _learn_placement(self, sid: str, nodes: object) -> None:
        placed = []
        for node in _dicts(nodes)[:MAX_PLACED_NODES]:
            gpus = node.get("gpus")
            if isinstance(gpus, int | float) and not isinstance(gpus, bool) and math.isfinite(gpus) and gpus > 0:
                placed.append(PlacedGpus(node_id=clean(node.get(keys.NODE_ID), 128),
                                         node_ip=clean(node.get(keys.NODE_IP)),
                                         node_name=clean(node.get(keys.NODE_NAME)), gpus=float(gpus)))
                self._learn_node(node.get(keys.NODE_ID), node.get(keys.NODE_IP), node.get(keys.NODE_NAME))
        if placed:  # holding nothing now says nothing about where the job ran
            self._placement.put(sid, tuple(placed))

    # -- reading ----------------------------------------------------------------------------------------------

    def job(self, submission_id: str) -> JobFacts | None:
        return self._jobs.get(submission_id)

    def node(self, node_id: str) -> NodeFacts | None:
        return self._nodes.get(node_id)

    def placement(self, submission_id: str) -> tuple[PlacedGpus, ...]:
        return self._placement.get(submission_id) or ()

    # -- naming a finding ----------------------------------------------------------------------------------

    def name(self, finding: Finding) -> Finding:
        """`finding` with the names the directory knows and it lacks (attrs and subject name; see the module)."""
        refs = refs_of(finding)
        add: dict[str, Any] = {}
        subject = finding.subject
        sid = refs.submission_id
        job = self._jobs.get(sid) if sid else None
        if sid and job is not None:
            add.update({keys.JOB_NAME: job.name, keys.OWNER: job.owner, keys.ENTRYPOINT: job.entrypoint})
            if subject.kind is SubjectKind.JOB and subject.id == sid and subject.name is None and job.name:
                subject = subject.model_copy(update={"name": job.name})
        if sid and (placed := self._placement.get(sid)):
            add[keys.JOB_PLACEMENT] = [p.as_dict() for p in placed]
        node = self._nodes.get(refs.node_id) if refs.node_id else None
        if node is not None:
            add.update({keys.NODE_NAME: node.name, keys.NODE_IP: node.ip})
            if subject.kind is SubjectKind.NODE and subject.name is None and node.ip:
                subject = subject.model_copy(update={"name": node.ip})  # a node subject's name is its IP (core.refs)
        missing = {k: v for k, v in add.items() if v is not None and finding.attrs.get(k) in (None, "")}
        if not missing and subject is finding.subject:
            return finding
        return finding.model_copy(update={"subject": subject, "attrs": {**finding.attrs, **missing}})


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list | tuple) else []
