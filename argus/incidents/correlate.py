"""Correlation: a root cause suppresses its echoes, and one fault seen twice is one incident.

When a node dies or a rank runs out of memory, the other ranks of the same job fail next, with NCCL
errors, collective timeouts and stack traces of their own. Those are echoes: filed under the root
cause's incident, not opened as new ones. If an echo was seen first (its incident is already open)
and the root cause arrives later, the echo's incident is merged into the root cause's. A root cause whose
resolved incident is reopened (its fault came back, argus/incidents/desk.py) is open again and absorbs open
echoes the same way; an echo merged away is never reopened itself, its fault lives on in the root.

One host fault is also seen from the node and from the job it hurt: a host OOM is the GCS's and the node's own
raylet's line (an incident about the node) and the job's exception (an incident about the job, which names the
node it struck: core.refs `affected_node_id`). A root cause about a node belongs to an open incident of its
category whose affected node it is; when that job incident opens (or reopens) after the node's, the node's is
merged into it. The job's incident is the one kept: it names who was hurt, and remediation acts on the job. A
node fault no job incident names stays its own incident.

Which jobs a finding touches is core.refs's one reading of its subject and attrs (`job_ids`: the job it is
about, the jobs the lost-node detector lists under `jobs`, `submission_id`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from core.refs import refs_of
from core.types import Category, Finding, Incident, IncidentState, SubjectKind, utcnow

ROOT_CAUSES = frozenset(
    {Category.GPU_HARDWARE, Category.NODE_LOST, Category.HOST_OOM, Category.GPU_OOM, Category.DISK_FULL}
)
ECHOES = frozenset({Category.NCCL_ERROR, Category.NCCL_HANG, Category.USER_ERROR, Category.UNKNOWN})
OPEN_SCAN_LIMIT = 1000  # the store's largest page: the newest open incidents within the window


def filing_order(finding: Finding) -> int:
    """Sort key: in one tick, root causes are filed before the echoes they explain."""
    return 0 if finding.category in ROOT_CAUSES else 1


def finding_jobs(finding: Finding) -> set[str]:
    return set(refs_of(finding).job_ids)


def incident_jobs(incident: Incident) -> set[str]:
    return set(refs_of(incident).job_ids)


class Correlator:
    """Decides where a finding goes; reads open incidents from the store, changes nothing itself."""

    def __init__(self, store: Any, *, window_s: float = 1800.0, clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.window = timedelta(seconds=window_s)
        self._clock = clock

    def _open(self, categories: frozenset[Category], **narrow: Any) -> Iterable[Incident]:
        """Open incidents of `categories` seen within the window, narrowed in the store (`not_subject_kind`,
        `mentions`: see Store.list_incidents); callers check what they need on what comes back."""
        since = self._clock() - self.window
        return self.store.list_incidents(states=(IncidentState.OPEN, IncidentState.MITIGATING), since=since,
                                         limit=OPEN_SCAN_LIMIT, categories=categories, **narrow)

    def root_for(self, finding: Finding) -> Incident | None:
        """The open incident this finding belongs to under another fingerprint, if any (the earliest).

        An echo belongs to a root cause of the jobs it touches; a root cause belongs to an open incident
        of the same category about the same jobs (one fault seen twice: Ray's node state and the job's log).
        """
        jobs = finding_jobs(finding)
        if not jobs and self.store.find_open(finding.fingerprint) is not None:
            # A repeat of a fault whose own incident is open (an alert Alertmanager sends again, a log line seen
            # again): filing it under another incident would have closed that one (merged), and no job links it to
            # a root cause, so it stays where it is. One indexed read instead of scanning the open incidents.
            return None
        absorbed = [
            i for i in self._open(ROOT_CAUSES | ECHOES, mentions=finding.fingerprint)
            if finding.fingerprint in (i.attrs.get("echoes") or [])
        ]
        if absorbed:  # this fingerprint was already filed under another incident: keep filing it there
            return min(absorbed, key=lambda i: i.first_seen)
        if (struck := self._incident_naming_node(finding)) is not None:
            return struck
        if not jobs:
            return None
        if finding.category in ECHOES:
            candidates = self._open(ROOT_CAUSES)
        elif finding.category in ROOT_CAUSES:
            candidates = self._open(frozenset({finding.category}))
        else:
            return None
        roots = [i for i in candidates if i.fingerprint != finding.fingerprint and self.jobs_of(i) & jobs]
        return min(roots, key=lambda i: i.first_seen) if roots else None

    def _incident_naming_node(self, finding: Finding) -> Incident | None:
        """For a root cause about a node: the earliest open incident of its category, about something else (a job),
        that names that node as the one its fault struck."""
        if finding.category not in ROOT_CAUSES or finding.subject.kind is not SubjectKind.NODE:
            return None
        node = finding.subject.id
        named = [
            i for i in self._open(frozenset({finding.category}), not_subject_kind=SubjectKind.NODE)
            if i.fingerprint != finding.fingerprint and i.subject.kind is not SubjectKind.NODE
            and node in self.struck_nodes(i)
        ]
        return min(named, key=lambda i: i.first_seen) if named else None

    def jobs_of(self, incident: Incident) -> set[str]:
        """The jobs an incident is about: its own attrs', and its findings'. A node's incident may have opened on
        the GCS's line about the node (no jobs), and Ray's node state, which lists the jobs it hit, folded in after."""
        jobs = incident_jobs(incident)
        if incident.category in ROOT_CAUSES and incident.subject.kind is SubjectKind.NODE:
            for f in self.store.findings_for(incident.id):
                jobs |= finding_jobs(f)
        return jobs

    def struck_nodes(self, incident: Incident) -> set[str]:
        """The nodes an incident about a job names as struck: its own attrs', else its findings'. A job's first
        line may not name the node (Ray's OOM exception puts "Memory on the node (IP, ID)" on the line after
        it); the job's FAILED message that folds in later does."""
        node = refs_of(incident).affected_node_id
        if node is not None:
            return {node}
        return {n for f in self.store.findings_for(incident.id) if (n := refs_of(f).affected_node_id) is not None}

    def echoes_of(self, root: Incident) -> list[Incident]:
        """Open incidents a new (or reopened) root-cause incident explains: echoes about its jobs, and the same
        fault seen from the node it names as struck (an open incident of its category about that node)."""
        if root.category not in ROOT_CAUSES:
            return []
        found = []
        jobs = self.jobs_of(root)
        if jobs:
            found += [i for i in self._open(ECHOES) if i.id != root.id and incident_jobs(i) & jobs]
        if root.subject.kind is not SubjectKind.NODE:
            nodes = self.struck_nodes(root)
            if nodes:
                found += [
                    i for i in self._open(frozenset({root.category}))
                    if i.id != root.id and i.subject.kind is SubjectKind.NODE and i.subject.id in nodes
                ]
        return found
