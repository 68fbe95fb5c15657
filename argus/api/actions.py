"""Remediation through the API: list actions, propose a plan for an incident, approve or reject a step.

Operators (and admins) may propose and approve any step. The ops agent may propose and approve only the
kinds the policy lists in `guards.agent_may_approve`; anything else it proposes waits for an operator.
"""

from __future__ import annotations

import re
from html import escape
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.api.auth import Principal, require
from argus.api.errors import ERRORS_KEY, Forbidden
from argus.api.params import ID_CHARS, ActionIdPath, IncidentIdPath, IncidentIdQuery
from argus.api.state import approval_links_of, incidents_of, remediator_of
from argus.approval_links import ApprovalLinks
from argus.incidents.subscribers import waiting_for_decision
from argus.store.tokens import Role
from core.errors import Conflict, InputError, NotConfigured
from core.types import Action, ActionState
from remediation.policy import Mode, Step

router = APIRouter(tags=["remediation"])


class PolicyPlan(BaseModel):
    """Plan what the remediation policy says for this incident."""

    model_config = ConfigDict(extra="forbid")

    plan: Literal["policy"]


class GivenSteps(BaseModel):
    """Plan these steps."""

    model_config = ConfigDict(extra="forbid")

    steps: list[Step] = Field(min_length=1, max_length=10)


# One or the other, as the schema says (a body with both, neither or a null is a 422 naming the fields).
Proposal = PolicyPlan | GivenSteps


class Rejection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500)


def action_json(action: Action) -> dict[str, Any]:
    return action.model_dump(mode="json")


def _check_id(action_id: str) -> str:
    if not re.fullmatch(ID_CHARS, action_id):  # the route's pattern already; this keeps callers in Python honest
        raise InputError(f"{action_id[:70]!r} is not an action id", hint="ids look like act-0123456789ab")
    return action_id


@router.get("/v1/actions", dependencies=[Depends(require(Role.VIEWER))])
def list_actions(
    request: Request,
    incident_id: IncidentIdQuery = None,
    state: ActionState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    items = request.app.state.store.list_actions(incident_id)
    if state is not None:
        items = [a for a in items if a.state is state]
    return {"items": [action_json(a) for a in items[-limit:]]}


@router.get("/v1/actions/{action_id:ident}", dependencies=[Depends(require(Role.VIEWER))])
def get_action(request: Request, action_id: ActionIdPath) -> dict[str, Any]:
    return {"action": action_json(request.app.state.store.get_action(_check_id(action_id)))}


@router.post("/v1/incidents/{incident_id:ident}/actions", status_code=201)
def propose(request: Request, incident_id: IncidentIdPath, body: Annotated[Proposal, Body()],
            who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> dict[str, Any]:
    """Plan steps for the incident: the policy's (`{"plan": "policy"}`) or the ones given (`{"steps": [...]}`)."""
    steps = body.steps if isinstance(body, GivenSteps) else None
    rem = remediator_of(request)
    if len(incident_id) > 64:
        raise InputError("that is not an incident id", hint="ids look like inc-0123456789ab")
    incident = request.app.state.store.get_incident(incident_id)
    if rem.policy.mode is Mode.OFF:
        raise Conflict("remediation is off in this Argus's policy", hint="set mode to dry-run, approval or auto")
    agent = who.role is Role.AGENT
    allowed = set(rem.policy.guards.agent_may_approve)
    if agent and steps and any(s.action not in allowed for s in steps):
        # the agent may ask; what it may not approve waits for an operator
        mode = Mode.APPROVAL if rem.policy.mode is not Mode.DRY_RUN else Mode.DRY_RUN
    elif rem.policy.mode is Mode.AUTO and not agent:
        mode = Mode.AUTO
    else:
        mode = Mode.APPROVAL if rem.policy.mode is not Mode.DRY_RUN else Mode.DRY_RUN
    planned = rem.plan(incident, steps=steps, requested_by=who.name, mode=mode if steps else None)
    incidents_of(request).approval_needed(incident, waiting_for_decision(planned))
    request.state.audit_detail = {"incident": incident_id, "planned": [a.id for a in planned]}
    return {"items": [action_json(a) for a in planned]}


@router.post("/v1/actions/{action_id:ident}:approve")
def approve(request: Request, action_id: ActionIdPath,
            who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> dict[str, Any]:
    rem = remediator_of(request)
    action = request.app.state.store.get_action(_check_id(action_id))
    if who.role is Role.AGENT and action.kind not in rem.policy.guards.agent_may_approve:
        raise Forbidden(f"the agent may not approve {action.kind}; the policy lets it approve: "
                        f"{', '.join(rem.policy.guards.agent_may_approve) or 'nothing'}",
                        hint="an operator approves this step")
    approved = rem.approve(action_id, who=who.name)
    request.state.audit_detail = {"kind": approved.kind, "incident": approved.incident_id}
    return {"action": action_json(approved)}


@router.post("/v1/actions/{action_id:ident}:reject")
def reject(request: Request, action_id: ActionIdPath, body: Annotated[Rejection, Body()],
           who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> dict[str, Any]:
    rejected = remediator_of(request).reject(_check_id(action_id), who=who.name, reason=body.reason)
    request.state.audit_detail = {"kind": rejected.kind, "reason": body.reason}
    return {"action": action_json(rejected)}


# -- signed links from IM messages (see argus/approval_links.py) --------------------------------------------


def _links(request: Request) -> ApprovalLinks:
    links = approval_links_of(request)
    if links is None:
        raise NotConfigured("approval links are off in this Argus", hint="they are on under `argus serve`")
    return links


def _checked(request: Request, action_id: str, decision: str, expires: int, sig: str) -> Action:
    reason = _links(request).check(_check_id(action_id), decision, expires, sig[:128])
    if reason is not None:
        raise Forbidden(reason, hint="ask for a fresh link, or decide in the API with a token")
    return request.app.state.store.get_action(action_id)


LinkQuery = Annotated[str, Query(pattern="^(approve|reject)$")]


@router.get("/v1/actions/{action_id:ident}/decide", response_class=HTMLResponse,
            openapi_extra={ERRORS_KEY: [403]})  # 403: the link's signature does not match, or it expired
def decide_page(request: Request, action_id: ActionIdPath, decision: LinkQuery,
                expires: Annotated[int, Query(ge=0, le=2**40)], sig: Annotated[str, Query(max_length=128)]):
    """What a signed link from a message would decide, with the button that decides it (a GET decides nothing)."""
    action = _checked(request, action_id, decision, expires, sig)
    incident = request.app.state.store.get_incident(action.incident_id) if action.incident_id else None
    target = f"{action.target.kind.value} {action.target.name or action.target.id}"
    summary = incident.summary if incident else ""
    state_note = "" if action.state is ActionState.PLANNED else f"<p>It is already {escape(action.state.value)}.</p>"
    return HTMLResponse(
        "<!doctype html><meta charset=utf-8><title>Argus: decide a step</title>"
        f"<h1>{escape(decision.title())} {escape(action.kind)} on {escape(target)}?</h1>"
        f"<p>Incident {escape(action.incident_id or '')}: {escape(summary[:500])}</p>"
        f"<p>Why: {escape(action.reason)}</p>{state_note}"
        f"<form method=post><input type=hidden name=decision value={escape(decision)}>"
        f"<input type=hidden name=expires value={expires}><input type=hidden name=sig value={escape(sig)}>"
        f"<button type=submit>{escape(decision.title())}</button></form>")


# What the page's form posts, stated for clients generated from the schema (the route parses the body itself).
_LINK_FORM = {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": {
    "type": "object", "required": ["decision", "expires", "sig"], "additionalProperties": False,
    "properties": {"decision": {"type": "string", "enum": ["approve", "reject"]},
                   "expires": {"type": "integer", "minimum": 0, "maximum": 2**40},
                   "sig": {"type": "string", "maxLength": 128}}}}}}


@router.post("/v1/actions/{action_id:ident}/decide", openapi_extra={"requestBody": _LINK_FORM, ERRORS_KEY: [403]})
async def decide(request: Request, action_id: ActionIdPath) -> dict[str, Any]:
    """Decide through a signed link's form (fields decision, expires, sig)."""
    # the page's form posts application/x-www-form-urlencoded; parsed here, without a multipart dependency
    raw = (await request.body())[:4096].decode("utf-8", errors="replace")
    try:
        form = {k: v[0] for k, v in parse_qs(raw, max_num_fields=10).items()}
    except ValueError:  # more fields than a link's form has
        raise InputError("the form has too many fields", hint="post the link's form as it was sent") from None
    if unknown := sorted(set(form) - {"decision", "expires", "sig"}):
        raise InputError(f"the form has fields a link's form does not: {', '.join(unknown)[:200]}",
                         hint="post decision, expires and sig only")
    decision = str(form.get("decision", ""))[:16]
    try:
        expires = int(str(form.get("expires", ""))[:16])
    except ValueError:
        raise InputError("the link's expiry is not a number", hint="use the link as it was sent") from None
    action = _checked(request, action_id, decision, expires, str(form.get("sig", "")))
    rem = remediator_of(request)
    who = "signed link"
    done = (rem.approve(action.id, who=who) if decision == "approve"
            else rem.reject(action.id, who=who, reason="rejected through a signed link"))
    request.state.audit_detail = {"kind": done.kind, "decision": decision, "via": "signed link"}
    return {"action": action_json(done)}
