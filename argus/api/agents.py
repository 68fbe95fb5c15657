"""Node agents (argus/agents): batches of the lines they read on their nodes, and the fleet's view of them.

`POST /v1/agents/batch` takes a node agent's batch (a `node_agent` token; nothing else may send, and that token may
do nothing else) into the inbox the Ray log collector reads on its next poll. A full inbox answers 429 with
Retry-After: the agent keeps the batch and sends it again, so nothing is lost and the central's memory stays
bounded. A batch may carry the node's newest GPU readings (NVML on the node, dcgm-exporter's field names;
collectors.agent_gpus): only the newest report per node is kept. `GET /v1/agents` lists the agents heard from
(viewer).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.agents.inbox import AgentInbox
from argus.api.auth import require
from argus.api.errors import error_body
from argus.api.health import leads
from argus.store.tokens import Role
from collectors.agent_gpus import PER_GPU_LABELS, GpuReading
from collectors.ray_logs import AgentLineRecord
from core.errors import NotConfigured
from core.limits import MAX_LINE_CHARS
from core.types import WholeNumber

router = APIRouter(prefix="/v1/agents", tags=["agents"])
MAX_BATCH_LINES = 10_000
MAX_GPUS = 64  # a node's GPUs, MIG instances aside; 8 is usual, 16 the most shipped in one box
NodeId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[0-9A-Za-z._:-]+$")]


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    file: str = Field(min_length=1, max_length=255, pattern=r"^[^/\x00]+$", description="the log file's name")
    line: Annotated[int, Field(ge=0, le=2**53), WholeNumber] = Field(
        description="the line's number in its file (a kernel record's sequence)")
    text: str = Field(max_length=MAX_LINE_CHARS)
    truncated: bool = False
    line_time: str | None = Field(default=None, max_length=64)
    history: bool = False


DcgmField = Annotated[str, Field(pattern=r"^DCGM_FI_[A-Z0-9_]{1,64}$")]
LabelName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gpu: Annotated[int, Field(ge=0, lt=1024), WholeNumber] = Field(description="the GPU's index on its node")
    uuid: str = Field(min_length=1, max_length=128, pattern=r"^[0-9A-Za-z._:-]+$")
    model_name: str = Field(max_length=128)
    # pydantic states a key's pattern as patternProperties, which lets other keys through: the schema says none may
    values: dict[DcgmField, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        max_length=64, json_schema_extra={"additionalProperties": False})
    labels: dict[LabelName, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=16, json_schema_extra={"additionalProperties": False})


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    node_id: NodeId
    node_ip: str = Field(min_length=1, max_length=64, pattern=r"^[0-9A-Fa-f.:]+$")
    hostname: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[0-9A-Za-z._-]+$",
                                 description="the node's own hostname (the Hostname label of its GPU series)")
    agent: dict[Annotated[str, Field(max_length=64)], Any] = Field(default_factory=dict, max_length=64)
    lines: list[Line] = Field(default_factory=list, max_length=MAX_BATCH_LINES)
    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS,
                            description="the node's newest GPU readings (NVML, dcgm-exporter's field names)")


def inbox_of(request: Request) -> AgentInbox:
    inbox: AgentInbox | None = request.app.state.agents
    if inbox is None:
        raise NotConfigured("this Argus takes no node agents", hint="set node_agents: true and restart argus serve")
    return inbox


@router.post("/batch", dependencies=[Depends(require(Role.NODE_AGENT))])
def take_batch(request: Request, batch: Annotated[Batch, Body()]) -> Any:
    inbox = inbox_of(request)
    if not leads(request):  # only the leader's loop reads the inbox: the agent keeps the batch and tries again
        return JSONResponse(error_body("NotLeader", "this Argus replica does not run the loop",
                                       "point node_agent_url at the leader (GET /v1/leader answers 200 there)"),
                            status_code=503, headers={"Retry-After": "2"})
    lines = [AgentLineRecord(file=x.file, line=x.line, text=x.text, truncated=x.truncated, line_time=x.line_time,
                             history=x.history) for x in batch.lines]
    stats = {k: v for k, v in batch.agent.items() if isinstance(v, (int, float, str, bool)) or v is None}
    gpus = [GpuReading(g.gpu, g.uuid, g.model_name, dict(g.values),
                       {k: v for k, v in g.labels.items() if k in PER_GPU_LABELS}) for g in batch.gpus]
    if not inbox.put(batch.node_id, batch.node_ip, lines, stats, gpus=gpus, hostname=batch.hostname):
        return JSONResponse(error_body("InboxFull", f"{inbox.waiting()} lines are waiting for the next poll",
                                       "keep the batch and send it again after Retry-After"),
                            status_code=429, headers={"Retry-After": "2"})
    return {"accepted": len(lines), "gpus": len(gpus)}


@router.get("", dependencies=[Depends(require(Role.VIEWER))])
def list_agents(request: Request) -> Any:
    inbox = inbox_of(request)
    covered = inbox.covered()
    return [{"node_id": a.node_id, "node_ip": a.node_ip, "up": a.node_id in covered, "lines": a.lines,
             "stats": a.stats} for a in inbox.agents()]
