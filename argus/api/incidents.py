"""Incidents, read side: what the engineers' tools and the ops agent list and open."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from core.errors import InputError
from core.types import Category, IncidentState

router = APIRouter(prefix="/v1/incidents", tags=["incidents"])

@router.get("")
def list_incidents(
    request: Request,
    state: IncidentState | None = None,
    category: Category | None = None,
    subject: Annotated[str | None, Query(max_length=256, description="job submission id or node id")] = None,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> dict[str, Any]:
    store = request.app.state.store
    items = store.list_incidents(
        state=state, category=category, subject_id=subject, since=since, limit=limit, offset=offset
    )
    return {"items": [i.model_dump(mode="json") for i in items], "limit": limit, "offset": offset}


@router.get("/{incident_id}")
def get_incident(request: Request, incident_id: str) -> dict[str, Any]:
    store = request.app.state.store
    if len(incident_id) > 64:
        raise InputError(
            f"an incident id of {len(incident_id)} characters is not an incident id",
            hint="ids look like inc-0123456789ab; list them with GET /v1/incidents",
        )
    incident = store.get_incident(incident_id)
    findings = store.findings_for(incident_id)
    return {
        "incident": incident.model_dump(mode="json"),
        "findings": [f.model_dump(mode="json") for f in findings],
    }
