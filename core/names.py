"""The names people use for what an incident is about: one spelling for incidents, reports, IM, web and CLI.

A job is named by its submission id (what `ray job logs`, the Ray dashboard and Argus's API take), with its
JobSpec name and owner where known: "pretrain-20261122T084034Z-eff5 (pretrain, owner alice)". Its entrypoint
is a detail (attr `entrypoint`), never the name: a command line says what runs, not which job it is.
A node is named by its name (hostname or Ray node name) and its IP, "gpu-worker-3 (10.0.0.7)"; by its IP
alone when it has no other name; by the Ray node id only when neither is known.

Where the parts come from: collectors put a job's JobSpec name and owner (from Ray job metadata, see
`job_identity`) into the job Subject's `name` and the attrs below; the loop adds what it knows to every
finding it files (argus/naming.py), so a claim made from a log line is named like one made from Ray's state.
Names come from job metadata and other systems: `clean` keeps a bounded, printable, one-line string; each
renderer still escapes for its own markup (Markdown, HTML, IM cards).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.refs import HasRefs, refs_from
from core.signal_keys import ENTRYPOINT, JOB_NAME, JOB_PLACEMENT, NODE_IP, NODE_NAME, OWNER
from core.types import Subject, SubjectKind

NAME_MAX = 64  # a JobSpec name, an owner, a node name: longer is cut (with an ellipsis)
ID_MAX = 64  # submission ids are at most 64 characters (core.jobfolder); a longer id is cut when shown
ENTRYPOINT_MAX = 500  # the entrypoint kept as a detail
# Job metadata keys, in order: Argus's own submissions write {"name", "owner", "workload"} (control/jobs.py);
# other tools use "user" or "job_name".
NAME_KEYS = ("name", "job_name")
OWNER_KEYS = ("owner", "user")

# Controls, format characters (zero-width, bidi overrides) and line/paragraph separators: they could hide or
# reorder what a name says, or break the one line it is shown on.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
_SPACE = re.compile(r"\s+")


def clean(value: object, limit: int = NAME_MAX) -> str | None:
    """`value` as one short printable line, or None when it is not a non-empty string (metadata may hold
    anything over REST)."""
    if not isinstance(value, str):
        return None
    text = _SPACE.sub(" ", _INVISIBLE.sub("", value[: limit * 4])).strip()
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class JobIdentity:
    """What a job's metadata says about it: its JobSpec name and owner, cleaned; None where it says nothing."""

    name: str | None = None
    owner: str | None = None


def job_identity(metadata: object, owner_keys: Sequence[str] = OWNER_KEYS) -> JobIdentity:
    """The JobSpec name and owner in a Ray job's metadata (a dict of strings; anything else says nothing)."""
    if not isinstance(metadata, Mapping):
        return JobIdentity()
    name = next((n for k in NAME_KEYS if (n := clean(metadata.get(k)))), None)
    owner = next((o for k in owner_keys if (o := clean(metadata.get(k)))), None)
    return JobIdentity(name=name, owner=owner)


def job_label(submission_id: str, name: str | None = None, owner: str | None = None) -> str:
    """"<submission id> (<name>, owner <owner>)", each part only where known."""
    sid = clean(submission_id, ID_MAX) or "(no id)"
    name, owner = clean(name), clean(owner)
    parts = [p for p in (name if name != sid else None, f"owner {owner}" if owner else None) if p]
    return f"{sid} ({', '.join(parts)})" if parts else sid


def node_label(node_id: str | None = None, name: str | None = None, ip: str | None = None) -> str:
    """"<name> (<ip>)"; the IP alone when the name is the IP (Ray's default) or unknown; the node id last."""
    name, ip = clean(name), clean(ip)
    if name and ip and name != ip:
        return f"{name} ({ip})"
    return ip or name or clean(node_id, 128) or "(unknown node)"


def _attr(attrs: Mapping[str, Any], key: str) -> str | None:
    return clean(attrs.get(key))


def job_of(item: HasRefs, *, with_owner: bool = True) -> str | None:
    """The label of the job a finding or incident is about (its subject, else a `submission_id` attr)."""
    attrs = item.attrs if isinstance(item.attrs, dict) else {}
    sid = refs_from(item.subject, attrs).submission_id
    if sid is None:
        return None
    name = _attr(attrs, JOB_NAME)
    if name is None and item.subject.kind is SubjectKind.JOB and item.subject.id == sid:
        name = clean(item.subject.name)
    return job_label(sid, name, _attr(attrs, OWNER) if with_owner else None)


def node_of(item: HasRefs) -> str | None:
    """The label of the node a finding or incident names (its subject, else `node_id` / `node_ip` attrs)."""
    attrs = item.attrs if isinstance(item.attrs, dict) else {}
    refs = refs_from(item.subject, attrs)
    if refs.node_id is None and refs.node_ip is None:
        return None
    return node_label(refs.node_id, _attr(attrs, NODE_NAME), refs.node_ip)


def subject_label(subject: Subject, attrs: Mapping[str, Any] | None = None) -> str:
    """The subject as people name it, with its kind: "job <label>", "node <label>", "gpu …", "cluster …"."""
    item = Named(subject, dict(attrs) if isinstance(attrs, Mapping) else {})
    if subject.kind is SubjectKind.JOB:
        name = _attr(item.attrs, JOB_NAME) or clean(subject.name)
        return f"job {job_label(subject.id, name, _attr(item.attrs, OWNER))}"
    if subject.kind is SubjectKind.NODE:
        return f"node {node_of(item) or node_label(subject.id)}"
    return f"{subject.kind.value} {clean(subject.name, 128) or clean(subject.id, 128) or '(unnamed)'}"


def label_of(item: HasRefs) -> str:
    """What a Finding or an Incident is about, as people name it (see the module docstring)."""
    return subject_label(item.subject, item.attrs)


def entrypoint_of(item: HasRefs) -> str | None:
    """The job's entrypoint command, a detail shown apart from its name."""
    attrs = item.attrs if isinstance(item.attrs, dict) else {}
    return clean(attrs.get(ENTRYPOINT), ENTRYPOINT_MAX)


@dataclass(frozen=True)
class PlacedGpus:
    """GPUs a job held on one node, as Argus last saw them (collectors/placement.py)."""

    node_id: str | None
    node_ip: str | None
    node_name: str | None
    gpus: float

    @property
    def label(self) -> str:
        return node_label(self.node_id, self.node_name, self.node_ip)

    def as_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "node_ip": self.node_ip, "node_name": self.node_name, "gpus": self.gpus}


MAX_PLACED_NODES = 256


def placement_of(attrs: Mapping[str, Any] | None) -> tuple[PlacedGpus, ...]:
    """The `job_placement` attr read back: every well-formed entry (a dict with a node and a GPU count >= 0)."""
    raw = attrs.get(JOB_PLACEMENT) if isinstance(attrs, Mapping) else None
    if not isinstance(raw, list):
        return ()
    placed = []
    for entry in raw[:MAX_PLACED_NODES]:
        if not isinstance(entry, dict):
            continue
        gpus = entry.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not (math.isfinite(gpus) and gpus >= 0):
            continue
        node_id, ip, name = clean(entry.get("node_id"), 128), clean(entry.get(NODE_IP)), clean(entry.get(NODE_NAME))
        if node_id or ip or name:
            placed.append(PlacedGpus(node_id=node_id, node_ip=ip, node_name=name, gpus=float(gpus)))
    return tuple(placed)


@dataclass(frozen=True)
class Named:
    """A subject with attrs, for naming what is neither a Finding nor an Incident (or one with added facts)."""

    subject: Subject
    attrs: dict[str, Any]
