"""Guards: what stops a step that the policy planned. Checked just before a step runs (not when it is
planned), against what has actually run. A refusal is final for that step (it is skipped, saying why); a
wait (the resubmit backoff, a grace period) leaves it approved until it is due.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from core.jobfolder import JobFolder
from core.types import Action, ActionState, Incident
from remediation.actions import chain_of, jobs_of, node_of
from remediation.policy import Guards

DONE = {ActionState.RUNNING, ActionState.SUCCEEDED}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""
    wait_until: datetime | None = None  # not refused: run it from then on

    @property
    def waiting(self) -> bool:
        return self.wait_until is not None


ALLOW = Verdict(True)


def check(guards: Guards, action: Action, incident: Incident, history: list[Action], *, now: datetime,
          shared_root: Path, node_counts: Callable[[], tuple[int, int]]) -> Verdict:
    """May `action` run now? `history`: every action in the store; `node_counts`: (nodes drained or offline,
    nodes in all), asked only for drains."""
    if action.dry_run:
        return ALLOW  # a dry run changes nothing: no guard applies
    kind = action.kind
    hour_ago, day_ago = now - timedelta(hours=1), now - timedelta(days=1)
    ran = [a for a in history if a.id != action.id and a.state in DONE and not a.dry_run]

    limit = guards.max_per_hour.get(kind)  # type: ignore[call-overload]
    recent = [a for a in ran if a.kind == kind and a.updated_at >= hour_ago]
    if limit is not None and len(recent) >= limit:
        return Verdict(False, f"rate limit: {len(recent)} {kind} in the last hour (at most {limit})")

    node_id, ip = node_of(incident)
    if kind in ("drain_node", "keep_scene") and guards.node_protected(node_id, ip):
        return Verdict(False, f"node {ip or node_id} is protected by the policy") if kind == "drain_node" else ALLOW
    if kind == "drain_node" and (node_id or ip):
        on_node = [a for a in ran if a.updated_at >= hour_ago and a.target.id in {node_id, ip}]
        if len(on_node) >= guards.max_per_node_per_hour:
            return Verdict(False, f"rate limit: {len(on_node)} steps on node {ip or node_id} in the last hour "
                                  f"(at most {guards.max_per_node_per_hour})")
        drains = sorted((a.updated_at for a in ran if a.kind == "drain_node"), reverse=True)
        if drains and (now - drains[0]).total_seconds() < guards.min_drain_interval_s:
            return Verdict(False, f"the last drain was {(now - drains[0]).total_seconds():.0f} s ago "
                                  f"(at least {guards.min_drain_interval_s:.0f} s between drains)")
        drained, total = node_counts()
        if total and (drained + 1) / total > guards.max_drained_share:
            return Verdict(False, f"draining it would take {drained + 1} of {total} nodes out "
                                  f"(at most {guards.max_drained_share:.0%} of the cluster)")

    if kind in ("resubmit_job", "stop_job"):
        protected = [s for s in jobs_of(incident) if guards.job_protected(s)]
        if protected:
            return Verdict(False, f"job {', '.join(protected)} is protected by the policy")
    if kind == "resubmit_job":
        for sid in jobs_of(incident):
            root, attempt = chain_of(JobFolder(shared_root, sid))
            chain = [a for a in ran if a.kind == "resubmit_job" and a.updated_at >= day_ago
                     and root in (a.result.get("roots") or [])]
            if len(chain) >= guards.max_resubmits_per_job_per_day:
                return Verdict(False, f"job {root} was resubmitted {len(chain)} times in a day "
                                      f"(at most {guards.max_resubmits_per_job_per_day})")
            if attempt >= 1 and chain:
                due = max(a.updated_at for a in chain) + timedelta(
                    seconds=guards.resubmit_backoff_s * 2 ** (attempt - 1))
                if due > now:
                    return Verdict(True, f"backoff before attempt {attempt + 1} of {root}", wait_until=due)
    return ALLOW
