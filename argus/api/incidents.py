"""Incidents, read side: what the engineers' tools and the ops agent list and open."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from argus.api.auth import Principal, require
from argus.api.params import IncidentIdPath
from argus.api.state import incidents_of
from argus.store.tokens import Role
from core.errors import InputError, NotFound
from core.types import Category, Incident, IncidentState, IsoDateTime

router = APIRouter(prefix="/v1/incidents", tags=["incidents"])

@router.get("")
def list_incidents(
    request: Request,
    state: IncidentState | None = None,
    category: Category | None = None,
    subject: Annotated[str | None, Query(max_length=256, description="job submission id or node id")] = None,
    since: IsoDateTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> dict[str, Any]:
    store = request.app.state.store
    items = store.list_incidents(
        state=state, category=category, subject_id=subject, since=since, limit=limit, offset=offset
    )
    return {"items": [incident_json(i) for i in items], "limit": limit, "offset": offset}


def incident_json(incident: Incident) -> dict[str, Any]:
    """The incident as stored, and beside its occurrences how many times it was reopened (its fault came back
    after it was resolved; 0: never), so a reader need not know where the store keeps that count."""
    return {**incident.model_dump(mode="json"), "reopened": incident.reopened}


def _check_id(incident_id: str) -> None:
    if len(incident_id) > 64:
        raise InputError(
            f"an incident id of {len(incident_id)} characters is not an incident id",
            hint="ids look like inc-0123456789ab; list them with GET /v1/incidents",
        )


@router.get("/{incident_id:ident}")
def get_incident(request: Request, incident_id: IncidentIdPath) -> dict[str, Any]:
    store = request.app.state.store
    _check_id(incident_id)
    incident = store.get_incident(incident_id)
    findings = store.findings_for(incident_id)
    return {
        "incident": incident_json(incident),
        "findings": [f.model_dump(mode="json") for f in findings],
    }


@router.get("/{incident_id:ident}/report", responses={200: {"content": {"text/markdown": {}, "application/json": {}}}})
def get_report(
    request: Request,
    incident_id: IncidentIdPath,
    format: Annotated[Literal["markdown", "json"] | None, Query(description="default: by the Accept header")] = None,
) -> Response:
    """The incident's latest root-cause report, as Markdown or JSON (`?format=` or `Accept: text/markdown`)."""
    _check_id(incident_id)
    store = request.app.state.store
    reports = store.reports_for(incident_id)  # NotFound for an unknown incident
    if not reports:
        raise NotFound(f"incident {incident_id} has no report yet",
                       hint="reports are written within seconds of an incident opening (longer with an LLM); retry")
    latest = reports[-1]
    wants_markdown = format == "markdown" or (format is None and "text/markdown" in request.headers.get("accept", ""))
    if wants_markdown:
        return PlainTextResponse(latest.markdown, media_type="text/markdown; charset=utf-8")
    body = latest.model_dump(mode="json")
    body["earlier"] = [{"id": r.id, "generator": r.generator, "category": r.category.value,
                        "created_at": r.created_at.isoformat()} for r in reports[:-1]]
    return JSONResponse(body)


class StateChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500)


@router.post("/{incident_id:ident}:resolve")
def resolve(request: Request, incident_id: IncidentIdPath, body: Annotated[StateChange, Body()],
            who: Annotated[Principal, Depends(require(Role.OPERATOR))]) -> dict[str, Any]:
    """Mark the incident resolved (people are told); its fault back within reopen_window_s reopens it (counted in
    "reopened"), later a new incident opens."""
    _check_id(incident_id)
    request.state.audit_detail = {"reason": body.reason}
    incident = incidents_of(request).resolve(incident_id, by=who.name, reason=body.reason)
    return {"incident": incident_json(incident)}
