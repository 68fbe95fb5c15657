"""The ops agent within the policy: its direct mutations meet the same guards as remediation's steps.

The agent's token satisfies operator routes, so without this it could drain nodes, take them offline or stop
jobs around the remediation policy. Routes that take capacity away or stop work run their effect through
`within_policy`: for the agent role the call is checked with remediation.guards.check_agent (the kinds it may
do without a person, `agent_may_approve`, then the rate limits, the per-node limit, the drain interval, the
drained share, protected nodes and jobs: the one set of rules remediation's runner uses), refused with 403
(GuardRefused) naming the guard and what to do instead, or admitted and stored as an Action with no incident,
the agent as `requested_by`, so later checks of either path count it (one budget). The audit log records
both, the guard that refused or the action id.

The guards bind the agent role only. Operators and admins are people: accountable for what they do and
allowed to override the policy (draining a protected node by hand is sometimes the fix). The agent is
automation: it acts fast, repeats itself, and is nobody to ask afterwards, so it gets the limits remediation
gets, and what the policy keeps for people it may propose on an incident, for a person to approve.

Which routes are guarded (see each route): drain and offline (as drain_node: offline takes the node out harder,
stopping its work at once) and a job's stop (stop_job). Not guarded, as they take nothing away: join and undrain
add capacity (undrain only once Ray has let the node's work go), reset moves an offline or failed node to
pending, probe reads, submit starts work like any user's `ray job submit`, and registering needs an admin.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, NoReturn, TypeVar

from fastapi import Request
from loguru import logger

from argus.api.auth import Principal
from argus.api.errors import GuardRefused
from argus.api.state import remediator_or_none
from argus.control_plane import ControlPlane
from argus.store.tokens import Role
from control.nodes import NodeRecord
from core.errors import ArgusError, Conflict, InputError, NotFound
from core.types import Action, ActionState, Subject, SubjectKind, utcnow
from remediation.guards import Target, Verdict, check_agent
from remediation.policy import Guards, load_policy

if TYPE_CHECKING:
    from argus.store.store import Store

T = TypeVar("T")
OUT = ("draining", "offline")
# Check and claim as one step: two agent calls at once must not both fit under one limit.
_admitting = threading.Lock()

_HINTS = {
    "agent_may_approve": 'propose it on the incident instead: POST /v1/incidents/{{id}}/actions with '
                         '{{"steps": [{{"action": "{kind}"}}]}}, for a person to approve; operators may do it directly',
    "protected_nodes": "the policy keeps this node for people: ask an operator, or propose the step on the incident "
                       "(POST /v1/incidents/{{id}}/actions) for a person to approve",
    "protected_jobs": "the policy keeps this job for people: ask an operator, or propose the step on the incident "
                      "(POST /v1/incidents/{{id}}/actions) for a person to approve",
}
_WAIT_HINT = ("wait until the guard allows it, or propose the step on the incident (POST /v1/incidents/{{id}}/actions) "
              "for a person to approve; operators may act directly")


@lru_cache(maxsize=1)
def _built_in_guards() -> Guards:
    return load_policy().guards


def guards_of(request: Request) -> Guards:
    """The running policy's guards; without remediation in this Argus, the built-in policy's (which let the
    agent take nothing away by itself): the agent is never unguarded."""
    rem = remediator_or_none(request)
    return rem.policy.guards if rem is not None else _built_in_guards()


def node_target(record: NodeRecord) -> tuple[Target, Subject]:
    """Every name the node goes by (any may be protected, or name an earlier step's target), and the subject its
    recorded action gets (Ray node id when known, as remediation's drains name it; its address as the name)."""
    spec = record.spec
    names = tuple(dict.fromkeys(n for n in (record.name, spec.node_ip, spec.host, record.ray_node_id) if n))
    subject = Subject(kind=SubjectKind.NODE, id=record.ray_node_id or record.name, name=spec.node_ip or spec.host)
    return Target(nodes=names), subject


def job_target(submission_id: str) -> tuple[Target, Subject]:
    return Target(jobs=(submission_id,)), Subject(kind=SubjectKind.JOB, id=submission_id)


def within_policy(request: Request, who: Principal, kind: str, target: tuple[Target, Subject], *, route: str,
                  reason: str, act: Callable[[], T], ended: Callable[[T], tuple[bool, str]],
                  node: NodeRecord | None = None) -> T:
    """Run `act` (the route's effect): at once for people; for the agent only if the guards admit a `kind` step
    on the target, recorded running while it runs and then as `ended` (ok, message) says. `node`: the record
    of a node step's node, so a node already drained or offline is not counted twice in the drained share."""
    if who.role is not Role.AGENT:
        return act()
    store: Store = request.app.state.store
    action = _admit(request, who, kind, target, route=route, reason=reason, node=node)
    request.state.agent_action = action.id
    request.state.audit_detail = {"action": action.id}  # the route adds what happened, when it answers
    try:
        result = act()
    except ArgusError as exc:
        # refused before anything ran (unknown, out of order, bad input): it took nothing, so it counts for nothing
        state = ActionState.SKIPPED if isinstance(exc, (Conflict, NotFound, InputError)) else ActionState.FAILED
        _finish(store, action, state, exc.message)
        raise
    except Exception as exc:
        _finish(store, action, ActionState.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    ok, message = ended(result)
    _finish(store, action, ActionState.SUCCEEDED if ok else ActionState.FAILED, message)
    return result


def _admit(request: Request, who: Principal, kind: str, target: tuple[Target, Subject], *, route: str,
           reason: str, node: NodeRecord | None) -> Action:
    store: Store = request.app.state.store
    plane: ControlPlane = request.app.state.control
    rem = remediator_or_none(request)
    now = rem.clock() if rem is not None else utcnow()
    goal, subject = target

    def node_counts() -> tuple[int, int]:
        if rem is not None:
            drained, total = rem.node_counts()
        else:
            records = plane.registry.list()
            drained, total = sum(r.state.value in OUT for r in records), len(records)
        already_out = node is not None and node.state.value in OUT  # taking it offline takes nothing more out
        return max(drained - already_out, 0), total

    with _admitting:
        verdict = check_agent(guards_of(request), kind, goal, store.list_actions(), now=now,
                              shared_root=plane.jobs.shared_root, node_counts=node_counts)
        if not verdict.allowed or verdict.waiting:
            _refuse(request, kind, route, verdict)
        return store.add_action(Action(
            id="", incident_id=None, kind=kind, target=subject, state=ActionState.RUNNING,
            idempotency_key=f"direct:{uuid.uuid4().hex}", requested_by=who.name, reason=reason[:500],
            dry_run=False, created_at=now, updated_at=now,
            result={"direct": route, "path": request.url.path, "role": who.role.value, "started_at": now.isoformat()},
        ))


def _refuse(request: Request, kind: str, route: str, verdict: Verdict) -> NoReturn:
    guard = verdict.guard or "guards"
    reason = verdict.reason if not verdict.waiting else f"{verdict.reason} (not before {verdict.wait_until})"
    request.state.audit_detail = {"guard": guard, "kind": kind, "reason": reason[:500]}
    as_kind = f" (taking a node {route} is checked as {kind})" if route == "offline" else ""
    raise GuardRefused(f"refused by the remediation policy's guard {guard}{as_kind}: {reason}",
                       hint=_HINTS.get(guard, _WAIT_HINT).format(kind=kind))


def _finish(store: Store, action: Action, state: ActionState, message: str) -> None:
    try:
        store.transition_action(action.id, (ActionState.RUNNING,), state,
                                {**action.result, "message": message[:1000], "finished_at": utcnow().isoformat()})
    except ArgusError as exc:  # the call has happened; a lost record is logged, and the action stays running
        logger.error("could not record how the agent's {} {} ended: {}", action.kind, action.id, exc)
