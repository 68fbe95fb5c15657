"""Housekeeping the ops team and its agent run: today, cleaning a finished job's old checkpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from argus.api.auth import require
from argus.api.errors import ERRORS_KEY
from argus.api.jobs import control
from argus.store.tokens import Role
from control.artifacts import MAX_KEEP, Checkpoint, CleanupPlan
from core.types import WholeNumber

router = APIRouter(prefix="/v1/ops", tags=["ops"])


class CleanupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `"dry_run": 0` is a mistake, not a no

    submission_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    keep_last: Annotated[int, Field(ge=1, le=MAX_KEEP), WholeNumber] = Field(
        default=2, description="how many of the newest checkpoints stay")
    dry_run: bool = Field(default=False, description="say what would go, delete nothing")


def plan_json(plan: CleanupPlan) -> dict[str, Any]:
    def items(checkpoints: tuple[Checkpoint, ...]) -> list[dict[str, Any]]:
        return [{"name": c.name, "step": c.step, "bytes": c.bytes} for c in checkpoints]

    return {
        "folder": str(plan.folder),
        "keep_last": plan.keep_last,
        "kept": items(plan.kept),
        "removed": items(plan.removed),
        "pinned": plan.pinned,
        "done": plan.done,
        "freed_bytes": plan.freed_bytes,
        "errors": list(plan.errors),
    }


@router.post("/cleanup_job_artifacts", dependencies=[Depends(require(Role.OPERATOR))],
             openapi_extra={ERRORS_KEY: [404]})  # 404: no such job
def cleanup_job_artifacts(request: Request, body: Annotated[CleanupRequest, Body()]) -> dict[str, Any]:
    """Delete all but the newest `keep_last` checkpoints of an ended job (409 while it runs). The checkpoint
    a tracker file (verl's latest_checkpointed_iteration.txt) names is kept too."""
    plan = control(request).jobs.cleanup_artifacts(body.submission_id, keep_last=body.keep_last,
                                                   dry_run=body.dry_run)
    request.state.audit_detail = {"submission_id": body.submission_id, "removed": [c.name for c in plan.removed],
                                  "dry_run": body.dry_run}
    return {"cleanup": plan_json(plan)}
