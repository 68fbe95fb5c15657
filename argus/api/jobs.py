"""Jobs: submit, list, read, stop and read the logs of Ray jobs through the control plane.

Every submission goes through the job queue (control/queue.py): it starts at once when its whole gang fits
(201), and otherwise waits in the queue with its reason (202) and starts by itself when room frees up.
`GET /v1/jobs/queue` shows the queue: queued, started (Ray's status beside it), finished, expired, cancelled.

A user token (role user) speaks for one person: it submits jobs as that owner only, with code under the user's own
folder (`<shared root>/users/<user>/`), and sees, reads and stops only that user's jobs; another user's job is 404
to it, as if it did not exist. Operators, agents and admins see every job; viewers read every job.

Stopping a job stops work: the ops agent's stop meets the remediation policy's guards as a stop_job step (403
when refused; argus/api/agent_policy.py), people's does not. Submitting is not guarded: it starts work, as any
user's `ray job submit` does, and takes nothing away from running jobs.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path as Path_
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.api.agent_policy import job_target, within_policy
from argus.api.auth import Principal, require
from argus.api.errors import ERRORS_KEY
from argus.control_plane import ControlPlane
from argus.store.tokens import Role
from control.jobs import JobRecord
from control.jobspec import JobSpec
from control.queue import QueueEntry, QueueState
from core.errors import NotAllowed, NotConfigured, NotFound

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
SubmissionId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="stop requested", min_length=1, max_length=500)


def control(request: Request) -> ControlPlane:
    plane: ControlPlane | None = request.app.state.control
    if plane is None:
        raise NotConfigured("this Argus serves no control plane", hint="start it with `argus serve`")
    return plane


def job_json(record: JobRecord) -> dict[str, Any]:
    body = asdict(record)
    body["job_dir"] = str(record.job_dir) if record.job_dir else None
    for key in ("started_at", "ended_at"):
        body[key] = body[key].isoformat() if body[key] else None
    body["ended"] = record.ended
    return body


def queued_json(entry: QueueEntry, plane: ControlPlane) -> dict[str, Any]:
    """A job as the queue knows it: its place, its gang, why it waits, and Ray's status once Ray has it."""
    folder = plane.jobs.folder(entry.submission_id)
    spec = entry.request.get("spec") or {}
    return {
        "submission_id": entry.submission_id,
        "status": entry.ray_status if entry.state in (QueueState.STARTED, QueueState.FINISHED) and entry.ray_status
        else entry.state.value.upper(),
        "state": entry.job_state(),
        "job_dir": str(folder.root) if folder.exists() else None,
        "name": spec.get("name"), "owner": entry.owner, "workload": spec.get("workload"),
        "gang": {"nnodes": entry.gang.nnodes, "gpus_per_node": entry.gang.gpus_per_node, "pool": entry.gang.pool},
        "queue": {
            "position": entry.position, "state": entry.state.value, "reason": entry.reason,
            "enqueued_at": entry.enqueued_at.isoformat(),
            "started_at": entry.started_at.isoformat() if entry.started_at else None,
            "ended_at": entry.ended_at.isoformat() if entry.ended_at else None,
            "waited_s": entry.waited_s, "timeout_s": entry.timeout_s,
            "resubmission": "lineage" in entry.request,
        },
        "ended": entry.state not in (QueueState.QUEUED, QueueState.STARTED),
    }


def _check_user_spec(plane: ControlPlane, who: Principal, spec: JobSpec) -> None:
    """A user submits as themself, with code in their own folder."""
    user = who.scoped
    if user is None:
        return
    if spec.owner != user:
        raise NotAllowed(f"token {who.name!r} submits jobs for user {user}, not for {spec.owner}",
                         hint=f"set owner: {user}, or ask an operator to submit it")
    home = plane.jobs.user_dir(user)
    for path, what in ((spec.code_path, "code_path"), (spec.working_dir, "working_dir"),
                       (spec.checkpoint_dir, "checkpoint_dir")):
        if path is not None and not Path_(path).resolve().is_relative_to(home.resolve()):
            raise NotAllowed(f"{what} {path} is outside user {user}'s folder {home}",
                             hint=f"put it under {home}/ (code/, datasets/, models/)")


def _visible(who: Principal, owner: str | None, submission_id: str) -> None:
    """A user's token sees only that user's jobs: another's is not found, as if it did not exist."""
    if who.scoped is not None and owner != who.scoped:
        raise NotFound(f"user {who.scoped} has no job {submission_id}", hint="list your jobs with GET /v1/jobs")


def _owner_of(plane: ControlPlane, submission_id: str) -> str | None:
    entry = plane.queue.find(submission_id)
    return entry.owner if entry is not None else plane.jobs.get(submission_id).owner


# 403: a path outside the code roots an admin set, or a user token's job for someone else or outside their folder;
# 404: a code path or working dir that does not exist
@router.post("", status_code=201, openapi_extra={ERRORS_KEY: [404]},
             responses={202: {"description": "queued: its gang does not fit now; `job.queue.reason` says why"}})
def submit(request: Request, spec: Annotated[JobSpec, Body()],
           who: Annotated[Principal, Depends(require(Role.USER))]) -> Any:
    """Queue a job and start it when its whole gang fits: 201 started now, 202 queued with the reason it waits.
    Its folder `<shared root>/jobs/<submission_id>/` gets the spec and the submit call when it starts."""
    plane = control(request)
    _check_user_spec(plane, who, spec)
    entry = plane.queue.submit(spec)
    request.state.audit_detail = {"submission_id": entry.submission_id, "owner": spec.owner,
                                  "queue": entry.state.value}
    answer = {"job": queued_json(entry, plane)}
    return answer if entry.state is not QueueState.QUEUED else JSONResponse(answer, status_code=202)


@router.get("")
def list_jobs(
    request: Request, who: Annotated[Principal, Depends(require(Role.VIEWER))],
    all_jobs: Annotated[bool, Query(alias="all", description="also jobs not submitted through Argus")] = False,
) -> dict[str, Any]:
    """Jobs waiting in the queue (status QUEUED), then Ray's jobs, newest first; a user token sees its own."""
    plane = control(request)
    waiting = plane.queue.store.list(states=[QueueState.QUEUED], owner=who.scoped)
    ray = [job_json(r) for r in plane.jobs.list(all_jobs=all_jobs) if who.scoped is None or r.owner == who.scoped]
    return {"items": [queued_json(e, plane) for e in reversed(waiting)] + ray}


@router.get("/queue")
def job_queue(
    request: Request, who: Annotated[Principal, Depends(require(Role.VIEWER))],
    state: Annotated[list[QueueState] | None, Query(
        max_length=len(QueueState), description="only these states (repeat it); default all")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """The queue, oldest first: each job's place, gang, state and the reason it waits (or waited)."""
    plane = control(request)
    states = list(state) if state else None
    entries = plane.queue.store.list(states=states, owner=who.scoped, limit=limit)
    return {"items": [queued_json(e, plane) for e in entries]}


@router.get("/{submission_id}")
def get_job(request: Request, submission_id: SubmissionId,
            who: Annotated[Principal, Depends(require(Role.VIEWER))]) -> dict[str, Any]:
    plane = control(request)
    entry = plane.queue.find(submission_id)
    if entry is not None and entry.state not in (QueueState.STARTED, QueueState.FINISHED):
        _visible(who, entry.owner, submission_id)
        return {"job": queued_json(entry, plane)}
    record = plane.jobs.get(submission_id)
    _visible(who, entry.owner if entry else record.owner, submission_id)
    body = job_json(record)
    if entry is not None:
        body["queue"] = queued_json(entry, plane)["queue"]
    return {"job": body}


@router.post("/{submission_id}/stop")
def stop_job(
    request: Request, submission_id: SubmissionId, who: Annotated[Principal, Depends(require(Role.USER))],
    body: Annotated[StopRequest | None, Body()] = None,
) -> dict[str, Any]:
    """Stop a job: one still queued leaves the queue (cancelled), one Ray has is stopped there."""
    reason = (body or StopRequest()).reason
    plane = control(request)
    if who.scoped is not None:
        _visible(who, _owner_of(plane, submission_id), submission_id)
    cancelled = plane.queue.cancel(submission_id, reason=f"{reason} (by {who.name})")
    if cancelled is not None:
        request.state.audit_detail = {"reason": reason, "result": "cancelled in the queue"}
        return {"job": queued_json(cancelled, plane)}
    jobs = plane.jobs
    record = within_policy(request, who, "stop_job", job_target(submission_id), route="stop", reason=reason,
                           act=lambda: jobs.stop(submission_id, reason=reason), ended=lambda r: (True, r.message))
    request.state.audit_detail = {"reason": reason, "result": record.message}
    answer: dict[str, Any] = {"job": job_json(record)}
    agent_action = getattr(request.state, "agent_action", None)  # the agent's step, as the guards count it
    if agent_action is not None:
        answer["action_id"] = request.state.audit_detail["action"] = agent_action
    return answer


@router.get("/{submission_id}/logs", response_class=PlainTextResponse)
def job_logs(
    request: Request,
    submission_id: SubmissionId,
    who: Annotated[Principal, Depends(require(Role.VIEWER))],
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="only the last N lines")] = None,
) -> PlainTextResponse:
    plane = control(request)
    if who.scoped is not None:
        _visible(who, _owner_of(plane, submission_id), submission_id)
    jobs = plane.jobs
    text = jobs.logs(submission_id) if tail is None else jobs.tail(submission_id, tail)
    return PlainTextResponse(text)
