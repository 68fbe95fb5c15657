"""Health: the API stays up when Ray or Prometheus is down, and says what it cannot reach."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter(tags=["health"])


@router.get("/v1/health")
def health(request: Request) -> dict[str, Any]:
    provider = request.app.state.health
    body = provider() if provider else {"sources": []}
    down = [s["name"] for s in body.get("sources", []) if s.get("ok") is False]
    body["status"] = "degraded" if down else "ok"
    body["unreachable"] = down
    return body
