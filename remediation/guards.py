"""Guards: what stops a step that the policy planned, or one the ops agent takes itself. Checked just before a
step runs (not when it is planned), against what has actually run. A refusal is final for that step (it is
skipped, saying why); a wait (the resubmit backoff, a grace period) leaves it approved until it is due.

One set of rules, two ways in: `check` for a planned step of an incident, `check_agent` for a mutation the
ops agent makes directly through the API (argus/api/agent_policy.py), which must also be a kind the policy
lets the agent do without a person (`agent_may_approve`). Both count what the other has run: each admitted
direct mutation is stored as an Action too, so the two share one budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from core.jobfolder import JobFolder
from core.types import Action, ActionState, Incident, SubjectKind
from remediation.actions import chain_of, jobs_of, node_of
from remediation.policy import Guards

DONE = {ActionState.RUNNING, ActionState.SUCCEEDED}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""
    wait_until: datetime | None = None  # not refused: run it from then on
    guard: str = ""  # the field of Guards that refused (or made it wait)

    @property
    def waiting(self) -> bool:
        return self.wait_until is not None


ALLOW = Verdict(True)


@dataclass(frozen=True)
class Target:
    """What a step acts on: every name its node goes by, the one to show first (IP, Ray node id, registry name,
    host: any may be in protected_nodes or name an earlier step's target), and the submission ids of its jobs."""

    nodes: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()

    @property
    def node(self) -> str:
        return self.nodes[0] if self.nodes else ""


def target_of(incident: Incident) -> Target:
    node_id, ip = node_of(incident)
    return Target(nodes=tuple(n for n in (ip, node_id) if n), jobs=tuple(jobs_of(incident)))


def check(guards: Guards, action: Action, incident: Incident, history: list[Action], *, now: datetime,
          shared_root: Path, node_counts: Callable[[], tuple[int, int]]) -> Verdict:
    """May `action` run now? `history`: every action in the store; `node_counts`: (nodes drained or offline,
    nodes in all), asked only for drains."""
    if action.dry_run:
        return ALLOW  # a dry run changes nothing: no guard applies
    return check_step(guards, action.kind, target_of(incident), history, now=now, shared_root=shared_root,
                      node_counts=node_counts, exclude=action.id)


def check_agent(guards: Guards, kind: str, target: Target, history: list[Action], *, now: datetime,
                shared_root: Path, node_counts: Callable[[], tuple[int, int]]) -> Verdict:
    """May the ops agent take a step of `kind` on `target` now, itself, with no person approving it? Only a kind
    the policy lets it approve, and then within every guard a planned step meets."""
    if kind not in guards.agent_may_approve:
        allowed = ", ".join(guards.agent_may_approve) or "nothing"
        return Verdict(False, f"the agent may not {kind} without a person's approval (the policy lets it: "
                              f"{allowed})", guard="agent_may_approve")
    return check_step(guards, kind, target, history, now=now, shared_root=shared_root, node_counts=node_counts)


def _aimed_at(action: Action, names: set[str]) -> bool:
    subject = action.target
    return subject.id in names or (subject.kind is SubjectKind.NODE and (subject.name or "") in names)


def check_step(guards: Guards, kind: str, target: Target, history: list[Action], *, now: datetime,
               shared_root: Path, node_counts: Callable[[], tuple[int, int]], exclude: str | None = None) -> Verdict:
    """The rules themselves, for a step of `kind` on `target` that is no dry run; `exclude`: the step's own id
    in `history`, if it is there."""
    hour_ago, day_ago = now - timedelta(hours=1), now - timedelta(days=1)
    ran = [a for a in history if a.id != exclude and a.state in DONE and not a.dry_run]

    limit = guards.max_per_hour.get(kind)  # type: ignore[call-overload]
    recent = [a for a in ran if a.kind == kind and a.updated_at >= hour_ago]
    if limit is not None and len(recent) >= limit:
        return Verdict(False, f"rate limit: {len(recent)} {kind} in the last hour (at most {limit})",
                       guard="max_per_hour")

    if kind in ("drain_node", "keep_scene") and guards.node_protected(*target.nodes):
        return (Verdict(False, f"node {target.node} is protected by the policy", guard="protected_nodes")
                if kind == "drain_node" else ALLOW)
    if kind == "drain_node" and target.nodes:
        names = set(target.nodes)
        on_node = [a for a in ran if a.updated_at >= hour_ago and _aimed_at(a, names)]
        if len(on_node) >= guards.max_per_node_per_hour:
            return Verdict(False, f"rate limit: {len(on_node)} steps on node {target.node} in the last hour "
                                  f"(at most {guards.max_per_node_per_hour})", guard="max_per_node_per_hour")
        drains = sorted((a.updated_at for a in ran if a.kind == "drain_node"), reverse=True)
        if drains and (now - drains[0]).total_seconds() < guards.min_drain_interval_s:
            return Verdict(False, f"the last drain was {(now - drains[0]).total_seconds():.0f} s ago "
                                  f"(at least {guards.min_drain_interval_s:.0f} s between drains)",
                           guard="min_drain_interval_s")
        drained, total = node_counts()
        if total and (drained + 1) / total > guards.max_drained_share:
            return Verdict(False, f"draining it would take {drained + 1} of {total} nodes out "
                                  f"(at most {guards.max_drained_share:.0%} of the cluster)", guard="max_drained_share")

    if kind in ("resubmit_job", "stop_job"):
        protected = [s for s in target.jobs if guards.job_protected(s)]
        if protected:
            return Verdict(False, f"job {', '.join(protected)} is protected by the policy", guard="protected_jobs")
    if kind == "resubmit_job":
        for sid in target.jobs:
            root, attempt = chain_of(JobFolder(shared_root, sid))
            chain = [a for a in ran if a.kind == "resubmit_job" and a.updated_at >= day_ago
                     and root in (a.result.get("roots") or [])]
            if len(chain) >= guards.max_resubmits_per_job_per_day:
                return Verdict(False, f"job {root} was resubmitted {len(chain)} times in a day "
                                      f"(at most {guards.max_resubmits_per_job_per_day})",
                               guard="max_resubmits_per_job_per_day")
            if attempt >= 1 and chain:
                due = max(a.updated_at for a in chain) + timedelta(
                    seconds=guards.resubmit_backoff_s * 2 ** (attempt - 1))
                if due > now:
                    return Verdict(True, f"backoff before attempt {attempt + 1} of {root}", wait_until=due,
                                   guard="resubmit_backoff_s")
    return ALLOW
