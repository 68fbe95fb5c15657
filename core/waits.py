"""What a job waits for, and what the cluster has free, in words: one wording for the job controller's timeout
reason (control/jobs.py: a job PENDING past its timeout_s) and the waiting-job detector (detectors/waiting.py: a
job PENDING, or a RUNNING job's placement groups unplaced, past Settings.pending_alert_s).

Plain data in, text out: resource amounts as Ray names them ({"GPU": 8, "CPU": 1, "worker": 0.001, "memory":
bytes}), label selectors as Ray takes them ({"argus.io/pool": "h100"}, values also "!v", "in(a,b)", "!in(a,b)"),
and nodes as `NodeFree` (what one alive node has in all and free now).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.ray_labels import POOL_LABEL

# Resources counted in bytes (Ray's "memory", "object_store_memory"): shown in GiB.
_BYTES = frozenset({"memory", "object_store_memory"})
_MAX_NODES_LISTED = 12


@dataclass(frozen=True)
class NodeFree:
    """One alive node: its name for people (IP), labels, and resources in all and free (None: free unknown)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    total: Mapping[str, float] = field(default_factory=dict)
    free: Mapping[str, float] | None = None


def amount(resource: str, value: Any) -> str:
    """One amount as shown: "8", "0.001", "16.0 GiB" for memory."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if resource in _BYTES:
        return f"{number / 2**30:.1f} GiB"
    return f"{number:g}"


def amounts(resources: Mapping[str, Any]) -> str:
    """"worker=0.001, CPU=1": resources as key=amount, in the order given."""
    return ", ".join(f"{k}={amount(k, v)}" for k, v in resources.items())


def selector_text(selector: Mapping[str, Any]) -> str:
    """"argus.io/pool=h100, gpu=!a10": a label selector as key=value."""
    return ", ".join(f"{k}={v}" for k, v in selector.items())


def entrypoint_demand(*, num_cpus: Any = None, num_gpus: Any = None, memory: Any = None,
                      resources: Mapping[str, Any] | None = None) -> dict[str, float]:
    """A job driver's demand as Ray schedules it (its supervisor actor's resources): the custom resources first,
    then CPU, GPU and memory where asked for. Zero and unreadable amounts are left out."""
    demand: dict[str, float] = {}
    for key, value in [*(resources or {}).items(), ("CPU", num_cpus), ("GPU", num_gpus), ("memory", memory)]:
        try:
            number = float(value) if value is not None else 0.0
        except (TypeError, ValueError):
            continue
        if number > 0:
            demand[str(key)] = number
    return demand


def driver_wants(resources: Mapping[str, Any], selector: Mapping[str, Any]) -> str:
    """"labels argus.io/pool=h100 and resources worker=0.001": what a PENDING job's driver needs a node to offer."""
    wants = [f"{what} {text}" for what, text in (("labels", selector_text(selector)), ("resources", amounts(resources)))
             if text]
    return " and ".join(wants) or "it a place"


def driver_advice(selector: Mapping[str, Any]) -> str:
    """What a user does about a driver no node takes: about its pool when it names one (core.ray_labels)."""
    pool = selector.get(POOL_LABEL)
    if pool:
        return f"join a node into pool {pool} or free one there, or resubmit in a pool that has free nodes"
    return "see `ray status` for free nodes, or resubmit asking for less"


def bundles_text(bundles: Sequence[Mapping[str, Any]]) -> str:
    """"2 bundles of {GPU: 8} and 1 bundle of {CPU: 4}": a placement group's bundles, equal ones counted, in the
    order they first appear."""
    counts: dict[str, int] = {}
    for bundle in bundles:
        shape = "{" + ", ".join(f"{k}: {amount(k, v)}" for k, v in bundle.items()) + "}"
        counts[shape] = counts.get(shape, 0) + 1
    return " and ".join(f"{n} bundle{'s' if n != 1 else ''} of {shape}" for shape, n in counts.items()) or "no bundles"


def matches(labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    """Whether a node's labels satisfy a Ray label selector: every key, with a value "v", "!v", "in(a,b)" or
    "!in(a,b)" (a negation also holds where the node lacks the label)."""
    for key, raw in selector.items():
        want = str(raw).strip()
        negate = want.startswith("!")
        if negate:
            want = want[1:].strip()
        if want.startswith("in(") and want.endswith(")"):
            values = {v.strip() for v in want[3:-1].split(",") if v.strip()}
        else:
            values = {want}
        has = key in labels and str(labels[key]) in values
        if has == negate:
            return False
    return True


def free_text(demand: Mapping[str, Any], nodes: Sequence[NodeFree], selector: Mapping[str, Any] | None = None,
              *, also: Sequence[str] = ("GPU", "CPU")) -> str:
    """How much of what `demand` names the alive nodes have free, per node: "largest free on one node: 4 GPU; 3
    alive nodes with GPU: 8/8/4 free"; then the same for the resources in `also` that `demand` does not name, where
    some node has them (the context a reader looks for: what a GPU cluster has free). With a label selector, only
    the nodes it matches count (and the text says how many do). Free amounts come from Ray's autoscaler report;
    without it the text says they are unknown."""
    parts: list[str] = []
    if selector:
        matching = [n for n in nodes if matches(n.labels, selector)]
        parts.append(f"{len(matching)} of {len(nodes)} alive node{'s' if len(nodes) != 1 else ''} match labels "
                     f"{selector_text(selector)}")
        nodes = matching
    if nodes and all(n.free is None for n in nodes):
        parts.append("free resources unknown (Ray's autoscaler report was not available)")
        return "; ".join(parts)
    for resource in [*demand, *(r for r in also if r not in demand)]:
        having = [n for n in nodes if float(n.total.get(resource, 0) or 0) > 0]
        if not having:
            if resource in demand:
                parts.append(f"no alive node{' matching them' if selector else ''} has {resource}")
            continue
        free = sorted((float((n.free or {}).get(resource, 0) or 0) for n in having if n.free is not None),
                      reverse=True)
        if not free:
            continue
        shown = "/".join(amount(resource, f) for f in free[:_MAX_NODES_LISTED])
        more = f"/… ({len(free) - _MAX_NODES_LISTED} more)" if len(free) > _MAX_NODES_LISTED else ""
        parts.append(f"largest free on one node: {amount(resource, free[0])} {resource}; {len(having)} alive "
                     f"node{'s' if len(having) != 1 else ''} with {resource}: {shown}{more} free")
    return "; ".join(parts) or "nothing is asked for"
