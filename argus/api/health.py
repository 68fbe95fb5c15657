"""Health: the API stays up when Ray or Prometheus is down, and says what it cannot reach; with several replicas,
which one leads (`GET /v1/leader` answers 200 on the leader only, for a load balancer or a floating IP)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from argus.api.errors import error_body

router = APIRouter(tags=["health"])


@router.get("/v1/health")
def health(request: Request) -> dict[str, Any]:
    provider = request.app.state.health
    body = provider() if provider else {"sources": []}
    down = [s["name"] for s in body.get("sources", []) if s.get("ok") is False]
    body["status"] = "degraded" if down else "ok"
    body["unreachable"] = down
    filer = getattr(request.app.state, "alert_filer", None)
    if filer is not None:
        body["alert_inbox"] = filer.state()
    return body


def leads(request: Request) -> bool:
    """Whether this replica runs the loop: always where there is no election (one replica)."""
    view = getattr(request.app.state, "leader", None)
    return view is None or bool(view().leader)


@router.get("/v1/leader")
def leader(request: Request) -> Any:
    view = getattr(request.app.state, "leader", None)
    if view is None:
        return {"leader": True, "election": False}
    seen = view()
    body = {"leader": seen.leader, "election": True, "replica": seen.replica, "holder": seen.holder,
            "term": seen.term}
    if seen.leader:
        return body
    return JSONResponse({**error_body("NotLeader", f"replica {seen.replica} does not lead; {seen.holder} does",
                                      "send this to the leader (GET /v1/leader answers 200 there)"), **body},
                        status_code=503, headers={"Retry-After": "2"})
