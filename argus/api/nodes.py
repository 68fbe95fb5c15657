"""Nodes: register GPU nodes and move them through their lifecycle over SSH (join, drain, undrain, offline).

A step that reached the node but failed there (SSH refused, `ray start` failed) is an outcome, not an
error of the request: it answers 502 with the outcome (the node is then `failed`). An out-of-order step is
409 and runs nothing.

Drain and offline take capacity away: the ops agent's calls to them meet the remediation policy's guards (403
when refused; argus/api/agent_policy.py), people's do not. Each other step says why it is not guarded.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.api.agent_policy import node_target, within_policy
from argus.api.auth import Principal, require
from argus.api.errors import ERRORS_KEY
from argus.api.jobs import control
from argus.store.tokens import Role
from control.node_manager import NodeOutcome
from control.nodes import NAME_RE, NodeRecord, NodeSpec
from core.types import WholeNumber

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])
NodeName = Annotated[str, Path(min_length=1, max_length=63, pattern=f"^{NAME_RE.pattern}$")]
# What `ray drain-node --reason-message` accepts (control/commands.py), so a reason never fails there.
Reason = Annotated[str, Field(min_length=1, max_length=180, pattern=r"^[A-Za-z0-9 _.,:/()=+-]+$")]


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: Reason = Field(description="why: recorded with the transition and, for drains, sent to Ray")


class DrainRequest(StepRequest):
    deadline_s: Annotated[int, Field(ge=0, le=7 * 24 * 3600), WholeNumber] | None = Field(
        default=None, description="Ray ends the node's work after this many seconds")


class ProbeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    disk_path: str = Field(default="/", max_length=200, description="whose filesystem's free space to report")


def _ended(outcome: NodeOutcome) -> tuple[bool, str]:
    return outcome.ok, outcome.message


def record_json(record: NodeRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "state": record.state.value,
        "ray_node_id": record.ray_node_id,
        "updated_at": record.updated_at.isoformat(),
        "spec": record.spec.model_dump(mode="json"),
    }


def outcome_response(request: Request, outcome: NodeOutcome) -> JSONResponse:
    body = {
        "node": outcome.node,
        "action": outcome.action,
        "ok": outcome.ok,
        "state": outcome.state.value,
        "message": outcome.message,
        "hint": outcome.hint,
        "ray_node_id": outcome.ray_node_id,
        "data": outcome.data,
        "commands": [
            {"argv": c.argv, "exit_status": c.exit_status, "timed_out": c.timed_out,
             "stdout": c.stdout[-4000:], "stderr": c.stderr[-4000:], "duration_s": round(c.duration_s, 3)}
            for c in outcome.commands
        ],
        "at": outcome.at.isoformat(),
    }
    if not outcome.ok:
        body["error"] = "NodeStepFailed"
    request.state.audit_detail = {"ok": outcome.ok, "state": outcome.state.value, "message": outcome.message[:500]}
    agent_action = getattr(request.state, "agent_action", None)  # the agent's step, as the guards count it
    if agent_action is not None:
        body["action_id"] = request.state.audit_detail["action"] = agent_action
    return JSONResponse(body, status_code=200 if outcome.ok else 502)


@router.post("", status_code=201, openapi_extra={ERRORS_KEY: [404]})  # 404: no key file at ssh_key_path
def register(
    request: Request, spec: Annotated[NodeSpec, Body()], who: Annotated[Principal, Depends(require(Role.ADMIN))]
) -> dict[str, Any]:
    """Register a node (state pending). Admins only: the spec names a private key Argus logs in with."""
    plane = control(request)
    plane.check_key_path(spec)
    outcome = plane.registry.add(spec, actor=who.name, reason="registered through the API")
    request.state.audit_detail = {"node": spec.name, "host": spec.host}
    return {"node": record_json(outcome)}


@router.get("", dependencies=[Depends(require(Role.VIEWER))])
def list_nodes(request: Request) -> dict[str, Any]:
    return {"items": [record_json(r) for r in control(request).registry.list()]}


@router.get("/{name}", dependencies=[Depends(require(Role.VIEWER))])
def get_node(request: Request, name: NodeName) -> dict[str, Any]:
    registry = control(request).registry
    record = registry.get(name)
    history = [
        {"from": t.from_state.value if t.from_state else None, "to": t.to_state.value, "actor": t.actor,
         "reason": t.reason, "at": t.at.isoformat()}
        for t in registry.transitions(name)
    ]
    return {"node": record_json(record), "transitions": history}


@router.post("/{name}/join")
async def join(request: Request, name: NodeName, body: Annotated[StepRequest, Body()],
               who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> JSONResponse:
    """pending -> online: start Ray on the node over SSH with its labels, wait until Ray lists it ALIVE."""
    # not guarded for the agent: a join adds capacity and stops nothing
    nodes = control(request).nodes()
    return outcome_response(request, await run_in_threadpool(nodes.join, name, actor=who.name, reason=body.reason))


@router.post("/{name}/drain")
async def drain(request: Request, name: NodeName, body: Annotated[DrainRequest, Body()],
                who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> JSONResponse:
    """online -> draining: no new work lands there (Ray's drain); running work may finish. The agent's drain
    meets the policy's guards as a drain_node step."""
    plane = control(request)
    nodes = plane.nodes()
    record = await run_in_threadpool(plane.registry.get, name)
    outcome = await run_in_threadpool(
        within_policy, request, who, "drain_node", node_target(record), route="drain", reason=body.reason,
        node=record, ended=_ended,
        act=lambda: nodes.drain(name, actor=who.name, reason=body.reason, deadline_s=body.deadline_s))
    return outcome_response(request, outcome)


@router.post("/{name}/undrain")
async def undrain(request: Request, name: NodeName, body: Annotated[StepRequest, Body()],
                  who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> JSONResponse:
    """draining -> online: Ray cannot cancel a drain, so the node joins again once Ray has let it go (409
    while its work still runs)."""
    # not guarded for the agent: it gives capacity back, and refuses while the node's work still runs
    nodes = control(request).nodes()
    return outcome_response(request, await run_in_threadpool(nodes.undrain, name, actor=who.name,
                                                             reason=body.reason))


@router.post("/{name}/offline")
async def offline(request: Request, name: NodeName, body: Annotated[StepRequest, Body()],
                  who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> JSONResponse:
    """-> offline: stop the node's Ray processes and wait until Ray lists it no more. The agent's call meets the
    policy's guards as a drain_node step (the node leaves the cluster, its work stopped at once: a harder drain;
    the policy has no kind of its own for it)."""
    plane = control(request)
    nodes = plane.nodes()
    record = await run_in_threadpool(plane.registry.get, name)
    outcome = await run_in_threadpool(
        within_policy, request, who, "drain_node", node_target(record), route="offline", reason=body.reason,
        node=record, ended=_ended, act=lambda: nodes.offline(name, actor=who.name, reason=body.reason))
    return outcome_response(request, outcome)


@router.post("/{name}/reset")
async def reset(request: Request, name: NodeName, body: Annotated[StepRequest, Body()],
                who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> JSONResponse:
    """offline or failed -> pending, so it can be joined again."""
    # not guarded for the agent: the node is out already; this only lets a later join bring it back
    nodes = control(request).nodes()
    return outcome_response(request, await run_in_threadpool(nodes.reset, name, actor=who.name, reason=body.reason))


@router.post("/{name}/probe", dependencies=[Depends(require(Role.OPERATOR))])
async def probe(request: Request, name: NodeName,
                body: Annotated[ProbeRequest | None, Body()] = None) -> JSONResponse:
    """Reachability, CPUs, memory, disk and GPUs over SSH; changes no state."""
    # not guarded for the agent: it reads
    nodes = control(request).nodes()
    disk_path = (body or ProbeRequest()).disk_path
    return outcome_response(request, await run_in_threadpool(nodes.probe, name, disk_path=disk_path))
