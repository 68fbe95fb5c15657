"""Jobs: submit, list, read, stop and read the logs of Ray jobs through the control plane.

Stopping a job stops work: the ops agent's stop meets the remediation policy's guards as a stop_job step (403
when refused; argus/api/agent_policy.py), people's does not. Submitting is not guarded: it starts work, as any
user's `ray job submit` does, and takes nothing away from running jobs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.api.agent_policy import job_target, within_policy
from argus.api.auth import Principal, require
from argus.api.errors import ERRORS_KEY
from argus.control_plane import ControlPlane
from argus.store.tokens import Role
from control.jobs import JobRecord
from control.jobspec import JobSpec
from core.errors import NotConfigured

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


# 403: a path outside the code roots an admin set; 404: a code path or working dir that does not exist
@router.post("", status_code=201, dependencies=[Depends(require(Role.OPERATOR))], openapi_extra={ERRORS_KEY: [404]})
def submit(request: Request, spec: Annotated[JobSpec, Body()]) -> dict[str, Any]:
    """Submit a job; its folder `<shared root>/jobs/<submission_id>/` gets the spec and the submit call."""
    record = control(request).jobs.submit(spec)
    request.state.audit_detail = {"submission_id": record.submission_id, "owner": spec.owner}
    return {"job": job_json(record)}


@router.get("", dependencies=[Depends(require(Role.VIEWER))])
def list_jobs(
    request: Request,
    all_jobs: Annotated[bool, Query(alias="all", description="also jobs not submitted through Argus")] = False,
) -> dict[str, Any]:
    return {"items": [job_json(r) for r in control(request).jobs.list(all_jobs=all_jobs)]}


@router.get("/{submission_id}", dependencies=[Depends(require(Role.VIEWER))])
def get_job(request: Request, submission_id: SubmissionId) -> dict[str, Any]:
    return {"job": job_json(control(request).jobs.get(submission_id))}


@router.post("/{submission_id}/stop")
def stop_job(
    request: Request, submission_id: SubmissionId, who: Annotated[Principal, Depends(require(Role.OPERATOR))],
    body: Annotated[StopRequest | None, Body()] = None,
) -> dict[str, Any]:
    reason = (body or StopRequest()).reason
    jobs = control(request).jobs
    record = within_policy(request, who, "stop_job", job_target(submission_id), route="stop", reason=reason,
                           act=lambda: jobs.stop(submission_id, reason=reason), ended=lambda r: (True, r.message))
    request.state.audit_detail = {"reason": reason, "result": record.message}
    answer: dict[str, Any] = {"job": job_json(record)}
    agent_action = getattr(request.state, "agent_action", None)  # the agent's step, as the guards count it
    if agent_action is not None:
        answer["action_id"] = request.state.audit_detail["action"] = agent_action
    return answer


@router.get("/{submission_id}/logs", response_class=PlainTextResponse, dependencies=[Depends(require(Role.VIEWER))])
def job_logs(
    request: Request,
    submission_id: SubmissionId,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="only the last N lines")] = None,
) -> PlainTextResponse:
    jobs = control(request).jobs
    text = jobs.logs(submission_id) if tail is None else jobs.tail(submission_id, tail)
    return PlainTextResponse(text)
