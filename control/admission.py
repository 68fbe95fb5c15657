"""Gang admission: whether a job's whole gang (nodes × GPUs per node, in its pool) fits now, and if not, why not
in words a person understands ("waiting for 2 nodes × 8 GPUs in pool h20: 1 node has 8 free").

Plain data in, decisions out; the queue (argus/job_queue.py) reads Ray and the store and acts on them.

- Capacity is per alive, schedulable node: Ray's free GPUs on it. Nodes Argus has drained, taken offline or seen
  fail take no new job (the queue leaves them out), nor do nodes Ray no longer lists as ALIVE.
- A job admitted a moment ago holds no GPU in Ray yet: its GPUs show as used only once its driver has created its
  placement groups or GPU actors. Until then its claim reserves them: each admitted, live job's GPUs that Ray does
  not show it using (`Claim.unseen_gpus`) are placed on the free nodes first, as its gang would be, and taken away.
- Best fit: a gang takes the nodes with the least free GPUs that still hold a whole share, so whole nodes stay free
  for the bigger gangs behind it.
- First that fits, not strict FIFO: the queue is walked oldest first; a job that does not fit waits and the ones
  behind it may start, each admission taking its GPUs from what the next ones see.
- A per-user limit of concurrent GPUs counts every admitted, live job of the user (seen by Ray or not).
A job that asks for no GPU (gpus_per_node 0) always fits: its driver is all it needs, and Ray places that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_NODES_NAMED = 6


@dataclass(frozen=True)
class Gang:
    """What a job holds while it runs: `nnodes` nodes with `gpus_per_node` GPUs each, in `pool` (None: any node)."""

    nnodes: int
    gpus_per_node: int
    pool: str | None = None

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    def text(self) -> str:
        nodes = f"{self.nnodes} node{'s' if self.nnodes != 1 else ''}"
        where = f"in pool {self.pool}" if self.pool else "on any node"
        return f"{nodes} × {self.gpus_per_node} GPU{'s' if self.gpus_per_node != 1 else ''} {where}"


@dataclass(frozen=True)
class NodeCapacity:
    """One alive, schedulable node: its id, its name for people, its pool, and its GPUs in all and free now."""

    node_id: str
    name: str
    pool: str | None
    total_gpus: float
    free_gpus: float


@dataclass(frozen=True)
class ClusterGpus:
    """One reading: alive nodes (every one: the queue leaves out the ones out of rotation), GPUs held by job (by
    submission id), and each submitted job's status in Ray (by submission id)."""

    nodes: tuple[NodeCapacity, ...]
    held_by_job: dict[str, float] = field(default_factory=dict)
    status_by_job: dict[str, str] = field(default_factory=dict)
    node_names: dict[str, str] = field(default_factory=dict)  # node id -> the argus.io/node label, where it has one


@dataclass(frozen=True)
class Claim:
    """An admitted job not yet ended: its owner, its gang, and how many of its GPUs Ray shows it using."""

    key: str
    owner: str
    gang: Gang
    seen_gpus: float = 0.0

    @property
    def unseen_gpus(self) -> float:
        return max(0.0, self.gang.gpus - self.seen_gpus)


@dataclass(frozen=True)
class Candidate:
    """A queued job: its queue key, owner and gang, oldest first."""

    key: str
    owner: str
    gang: Gang


@dataclass(frozen=True)
class Admit:
    key: str
    nodes: tuple[str, ...]  # the node ids its gang was counted on (Ray places the work; this is the reservation)


@dataclass(frozen=True)
class Wait:
    key: str
    reason: str


Decision = Admit | Wait


def _in_pool(node: NodeCapacity, pool: str | None) -> bool:
    return pool is None or node.pool == pool


def best_fit(free: Mapping[str, float], gang: Gang, nodes: Sequence[NodeCapacity]) -> tuple[str, ...] | None:
    """The node ids the gang would take (the fullest nodes that still hold a share), or None when it does not fit."""
    if gang.gpus_per_node == 0:
        return ()
    fitting = [n for n in nodes if _in_pool(n, gang.pool) and free.get(n.node_id, 0.0) >= gang.gpus_per_node]
    if len(fitting) < gang.nnodes:
        return None
    fitting.sort(key=lambda n: (free[n.node_id], n.name))
    return tuple(n.node_id for n in fitting[: gang.nnodes])


def _reserve(free: dict[str, float], gang: Gang, gpus: float, nodes: Sequence[NodeCapacity]) -> None:
    """Take `gpus` of a claim's gang from `free`, a share at a time, where its gang would go."""
    share = gang.gpus_per_node
    if share <= 0 or gpus <= 0:
        return
    whole = Gang(nnodes=max(1, -int(-gpus // share)), gpus_per_node=share, pool=gang.pool)
    placed = best_fit(free, whole, nodes)
    if placed is None:  # Ray shows less free than the claim needs: part of it is running already; take what is
        placed = tuple(n.node_id for n in nodes if _in_pool(n, gang.pool) and free.get(n.node_id, 0.0) > 0)
    left = gpus
    for node_id in placed:
        take = min(share, free[node_id], left)
        free[node_id] -= take
        left -= take
        if left <= 0:
            break


def why_waiting(gang: Gang, free: Mapping[str, float], nodes: Sequence[NodeCapacity]) -> str:
    """Why `gang` does not fit: how many nodes of its pool have its share free, and how many could ever."""
    pool_nodes = [n for n in nodes if _in_pool(n, gang.pool)]
    where = f"pool {gang.pool}" if gang.pool else "the cluster"
    head = f"waiting for {gang.text()}"
    if not pool_nodes:
        return (f"{head}: no alive node is in {where} (draining, offline and failed nodes take no new job); "
                "it starts when one joins")
    ready = [n for n in pool_nodes if free.get(n.node_id, 0.0) >= gang.gpus_per_node]
    big_enough = [n for n in pool_nodes if n.total_gpus >= gang.gpus_per_node]
    if not ready:
        most = max(free.get(n.node_id, 0.0) for n in pool_nodes)
        have = f"no node has {gang.gpus_per_node} free (the most on one node: {most:g})"
    else:
        names = ", ".join(n.name for n in ready[:MAX_NODES_NAMED]) + (" …" if len(ready) > MAX_NODES_NAMED else "")
        have = (f"{len(ready)} node{'s' if len(ready) != 1 else ''} ha{'ve' if len(ready) != 1 else 's'} "
                f"{gang.gpus_per_node} free ({names})")
    if len(big_enough) < gang.nnodes:
        return (f"{head}: {have}; {where} has only {len(big_enough)} node"
                f"{'s' if len(big_enough) != 1 else ''} with {gang.gpus_per_node} GPUs in all, so it waits "
                "for nodes to join")
    return f"{head}: {have}"


def admit(
    queued: Sequence[Candidate],
    nodes: Sequence[NodeCapacity],
    claims: Sequence[Claim],
    *,
    user_limit: Callable[[str], int | None] = lambda _user: None,
) -> list[Decision]:
    """Decide for each queued job, oldest first: Admit (its gang fits after the claims and the admissions before
    it) or Wait with the reason. `user_limit(user)`: the most GPUs the user's live jobs may hold, None for no limit."""
    free = {n.node_id: max(0.0, n.free_gpus) for n in nodes}
    held: dict[str, int] = {}
    for claim in claims:
        _reserve(free, claim.gang, claim.unseen_gpus, nodes)
        held[claim.owner] = held.get(claim.owner, 0) + claim.gang.gpus
    decisions: list[Decision] = []
    for job in queued:
        limit = user_limit(job.owner)
        has = held.get(job.owner, 0)
        if limit is not None and job.gang.gpus and has + job.gang.gpus > limit:
            decisions.append(Wait(job.key, (
                f"waiting for user {job.owner}'s GPUs: their running jobs hold {has} of the {limit} GPUs a user "
                f"may hold at once, and this job needs {job.gang.gpus}"
                + ("; it can never start under this limit" if job.gang.gpus > limit else ""))))
            continue
        placed = best_fit(free, job.gang, nodes)
        if placed is None:
            decisions.append(Wait(job.key, why_waiting(job.gang, free, nodes)))
            continue
        for node_id in placed:
            free[node_id] -= job.gang.gpus_per_node
        held[job.owner] = has + job.gang.gpus
        decisions.append(Admit(job.key, placed))
    return decisions
