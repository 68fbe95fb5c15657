"""The incident pages: the list with its filters, one incident with its report, evidence, timeline and steps,
and the forms operators use to approve or reject a step and to resolve an incident."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse

from argus.api.errors import Forbidden
from argus.api.state import incidents_of, remediator_of, remediator_or_none
from argus.incidents.desk import ordinal
from argus.store.tokens import Role
from argus.web.access import Viewer, may, posted
from argus.web.ui import UiRoute, page, status_of, web_of
from core.errors import Conflict, InputError, NotFound
from core.types import (
    REOPENED_AT,
    RESOLVED_BEFORE,
    Action,
    ActionState,
    Category,
    Incident,
    IncidentState,
    Report,
    Severity,
)

router = APIRouter(route_class=UiRoute, include_in_schema=False)
PAGE_SIZE = 50
MAX_PAGE = 10_000
COUNT_CAP = 1000  # per-state counts stop here and read "1000+"
SEVERITY_SCAN = 10_000  # the store cannot filter by severity: the newest this many incidents are looked at
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SUBJECT_MAX = 256
E = TypeVar("E", bound=Enum)


def check_id(value: str, what: str, example: str) -> str:
    if not _ID.fullmatch(value):
        raise InputError(f"{value[:70]!r} is not {what}", hint=f"ids look like {example}")
    return value


@dataclass
class Filters:
    state: IncidentState | None = None
    category: Category | None = None
    severity: Severity | None = None
    subject: str | None = None
    page: int = 1

    def query(self, **over: Any) -> str:
        """The query string of these filters, with `over` changed (page 1 and empty filters left out)."""
        values = {"state": self.state, "category": self.category, "severity": self.severity,
                  "subject": self.subject, "page": self.page, **over}
        plain = {k: getattr(v, "value", v) for k, v in values.items()}
        return urlencode({k: v for k, v in plain.items() if v not in (None, "") and not (k == "page" and v == 1)})


def _one(request: Request, name: str, problems: list[str]) -> str | None:
    values = request.query_params.getlist(name)
    if len(values) > 1:
        problems.append(f"{name} is given {len(values)} times: give it once")
        return None
    value = values[0].strip() if values else ""
    if len(value) > _SUBJECT_MAX:
        problems.append(f"{name} is {len(value)} characters long: at most {_SUBJECT_MAX}")
        return None
    return value or None


def _choice(request: Request, name: str, kind: type[E], problems: list[str]) -> E | None:
    value = _one(request, name, problems)
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        problems.append(f"{name} {value[:60]!r} is not one of: {choices}")
        return None


def parse_filters(request: Request) -> tuple[Filters, list[str]]:
    """The list's filters from the query; each bad value becomes a problem to show, not an error."""
    problems: list[str] = []
    known = {"state", "category", "severity", "subject", "page"}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        problems.append(f"unknown filter {', '.join(u[:40] for u in unknown[:5])}: use {', '.join(sorted(known))}")
    filters = Filters(state=_choice(request, "state", IncidentState, problems),
                      category=_choice(request, "category", Category, problems),
                      severity=_choice(request, "severity", Severity, problems),
                      subject=_one(request, "subject", problems))
    raw_page = _one(request, "page", problems)
    if raw_page is not None:
        if raw_page.isdigit() and 1 <= int(raw_page) <= MAX_PAGE:
            filters.page = int(raw_page)
        else:
            problems.append(f"page {raw_page[:20]!r} is not a number from 1 to {MAX_PAGE}")
    return filters, problems


def incidents_page(store: Any, f: Filters) -> tuple[list[Incident], bool, bool]:
    """One page of incidents, whether a next page exists, and whether the severity scan stopped short."""
    offset = (f.page - 1) * PAGE_SIZE
    where = {"state": f.state, "category": f.category, "subject_id": f.subject}
    if f.severity is None:
        items = store.list_incidents(**where, limit=PAGE_SIZE + 1, offset=offset)
        return items[:PAGE_SIZE], len(items) > PAGE_SIZE, False
    matched: list[Incident] = []
    scanned, batch_size = 0, 1000
    while True:
        batch = store.list_incidents(**where, limit=batch_size, offset=scanned)
        matched += [i for i in batch if i.severity is f.severity]
        scanned += len(batch)
        if len(batch) < batch_size or len(matched) > offset + PAGE_SIZE:
            return matched[offset:offset + PAGE_SIZE], len(matched) > offset + PAGE_SIZE, False
        if scanned >= SEVERITY_SCAN:
            return matched[offset:offset + PAGE_SIZE], False, True


def state_counts(store: Any, f: Filters) -> dict[str, str]:
    counts = {}
    for state in IncidentState:
        n = len(store.list_incidents(state=state, category=f.category, subject_id=f.subject, limit=COUNT_CAP))
        counts[state.value] = f"{n}+" if n >= COUNT_CAP else str(n)
    return counts


@router.get("/ui/incidents")
def incident_list(request: Request, viewer: Viewer) -> Response:
    store = request.app.state.store
    filters, problems = parse_filters(request)
    if problems:
        return page(request, "incidents.html", 400, title="Incidents", filters=filters, problems=problems,
                    incidents=[], counts={}, has_next=False, scan_cut=False, options=_options(),
                    refresh_s=0)
    items, has_next, scan_cut = incidents_page(store, filters)
    return page(request, "incidents.html", title="Incidents", filters=filters, problems=[], incidents=items,
                counts=state_counts(store, filters), has_next=has_next, scan_cut=scan_cut, options=_options(),
                refresh_s=web_of(request).refresh_s, scan_limit=SEVERITY_SCAN)


def _options() -> dict[str, list[str]]:
    return {"state": [s.value for s in IncidentState], "category": [c.value for c in Category],
            "severity": [s.value for s in Severity]}


# -- one incident --------------------------------------------------------------------------------------------


def _at(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def timeline(incident: Incident, findings: list[Any], reports: list[Report], actions: list[Action]) -> list[dict]:
    """What happened to the incident, from the store's own records, oldest first."""
    events: list[tuple[datetime, str, str]] = [
        (incident.first_seen, "failure", f"first seen: {incident.summary}"),
        (incident.detected_at, "argus", f"Argus opened the incident ({incident.reason})"),
    ]
    if incident.occurrences > 1:
        events.append((incident.last_seen, "failure", f"last seen ({incident.occurrences} occurrences)"))
    for f in findings:
        events.append((f.detected_at, "finding", f"{f.reason}: {f.summary}"))
    for r in reports:
        events.append((r.created_at, "report", f"report {r.id} by {r.generator}: {r.category.value}, "
                                               f"confidence {r.confidence:.2f}"))
    for a in actions:
        events.append((a.created_at, "step", f"{a.kind} planned by {a.requested_by}"))
        approved = _at(a.result.get("approved_at"))
        if approved is not None:
            events.append((approved, "step", f"{a.kind} approved by {a.result.get('approved_by', '?')}"))
        if a.state not in (ActionState.PLANNED, ActionState.APPROVED):
            rejected = a.state is ActionState.REJECTED and "rejected_by" in a.result
            by = f" by {a.result['rejected_by']}" if rejected else ""
            events.append((a.updated_at, "step", f"{a.kind} {a.state.value}{by}"))
    if incident.reopened:  # the store keeps the last resolve before the fault came back, and when it came back
        resolved_before, reopened_at = _at(incident.attrs.get(RESOLVED_BEFORE)), _at(incident.attrs.get(REOPENED_AT))
        if resolved_before is not None:
            events.append((resolved_before, "argus", "resolved"))
        if reopened_at is not None:
            events.append((reopened_at, "failure", f"the fault came back: reopened ({ordinal(incident.reopened)} "
                                                   "time)"))
    if incident.resolved_at is not None:
        events.append((incident.resolved_at, "argus", "resolved"))
    events.sort(key=lambda e: e[0])
    return [{"at": at, "kind": kind, "text": text} for at, kind, text in events]


def decidable(principal: Any, action: Action, remediator: Any) -> dict[str, bool]:
    """Which buttons a step gets for this caller: the API's rules (argus/api/actions.py)."""
    if remediator is None or action.dry_run or not may(principal, Role.OPERATOR):
        return {"approve": False, "reject": False}
    agent_ok = principal.role is not Role.AGENT or action.kind in remediator.policy.guards.agent_may_approve
    return {"approve": action.state is ActionState.PLANNED and agent_ok,
            "reject": action.state in (ActionState.PLANNED, ActionState.APPROVED)}


def _notice(changed: str | None, incident: Incident, actions: list[Action]) -> str | None:
    """The message after a decision, read from the store: it says what is true now, whatever the link says."""
    if not changed:
        return None
    if changed == "resolved" and incident.state is IncidentState.RESOLVED:
        return "The incident is resolved."
    step = next((a for a in actions if a.id == changed), None)
    return f"Step {step.kind} ({step.id}) is {step.state.value}." if step else None


def incident_context(request: Request, incident_id: str) -> dict[str, Any]:
    store = request.app.state.store
    incident = store.get_incident(incident_id)
    findings = store.findings_for(incident_id)
    reports = store.reports_for(incident_id)
    actions = store.list_actions(incident_id)
    remediator = remediator_or_none(request)
    principal = getattr(request.state, "principal", None)
    return {
        "title": f"{incident.category.value} · {incident.id}",
        "incident": incident, "findings": findings, "report": reports[-1] if reports else None,
        "earlier_reports": reports[:-1], "actions": actions,
        "buttons": {a.id: decidable(principal, a, remediator) for a in actions},
        "remediation_on": remediator is not None,
        "may_resolve": may(principal, Role.OPERATOR) and incident.state is not IncidentState.RESOLVED,
        "timeline": timeline(incident, findings, reports, actions),
        "notice": _notice(request.query_params.get("changed", "")[:64], incident, actions),
        "error": None,
    }


@router.get("/ui/incidents/{incident_id}")
def incident_page(request: Request, incident_id: str, viewer: Viewer) -> Response:
    check_id(incident_id, "an incident id", "inc-0123456789ab")
    return page(request, "incident.html", **incident_context(request, incident_id))


def _latest(request: Request, incident_id: str) -> Report:
    check_id(incident_id, "an incident id", "inc-0123456789ab")
    reports = request.app.state.store.reports_for(incident_id)
    if not reports:
        raise NotFound(f"incident {incident_id} has no report yet", hint="reports are written within seconds; retry")
    return reports[-1]


@router.get("/ui/incidents/{incident_id}/report.md")
def report_markdown(request: Request, incident_id: str, viewer: Viewer) -> Response:
    """The raw report as text: shown by the browser, never interpreted as HTML."""
    return PlainTextResponse(_latest(request, incident_id).markdown, media_type="text/plain; charset=utf-8")


@router.get("/ui/incidents/{incident_id}/report.json")
def report_json(request: Request, incident_id: str, viewer: Viewer) -> Response:
    return JSONResponse(_latest(request, incident_id).model_dump(mode="json"))


# -- decisions -------------------------------------------------------------------------------------------------


async def _step(request: Request, incident_id: str, action_id: str) -> Action:
    check_id(incident_id, "an incident id", "inc-0123456789ab")
    check_id(action_id, "an action id", "act-0123456789ab")
    action = await run_in_threadpool(request.app.state.store.get_action, action_id)
    if action.incident_id != incident_id:
        raise NotFound(f"action {action_id} is not a step of incident {incident_id}",
                       hint="open the incident the step belongs to")
    return action


async def _after(request: Request, incident_id: str, changed: str, do: Any) -> Response:
    """Run a decision; on success back to the incident (303), on a conflict the page again with the message."""
    try:
        await run_in_threadpool(do)
    except (Conflict, InputError) as exc:
        context = await run_in_threadpool(incident_context, request, incident_id)
        context["error"] = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
        return page(request, "incident.html", status_of(exc), **context)
    return RedirectResponse(f"/ui/incidents/{incident_id}?{urlencode({'changed': changed})}", status_code=303)


@router.post("/ui/incidents/{incident_id}/actions/{action_id}/approve")
async def approve(request: Request, incident_id: str, action_id: str) -> Response:
    who, _ = await posted(request, Role.OPERATOR, "approving a step")
    action = await _step(request, incident_id, action_id)
    rem = remediator_of(request)
    if who.role is Role.AGENT and action.kind not in rem.policy.guards.agent_may_approve:
        raise Forbidden(f"the agent may not approve {action.kind}", hint="an operator approves this step")
    request.state.audit_detail = {"via": "ui", "kind": action.kind, "incident": incident_id}
    return await _after(request, incident_id, action_id, lambda: rem.approve(action_id, who=who.name))


def _reason(form: dict[str, str]) -> str:
    reason = form.get("reason", "").strip()
    if not 1 <= len(reason) <= 500:
        raise InputError("give a reason of 1 to 500 characters", hint="say why, for the audit log and the team")
    return reason


@router.post("/ui/incidents/{incident_id}/actions/{action_id}/reject")
async def reject(request: Request, incident_id: str, action_id: str) -> Response:
    who, form = await posted(request, Role.OPERATOR, "rejecting a step")
    action = await _step(request, incident_id, action_id)
    rem = remediator_of(request)
    reason = _reason(form)
    request.state.audit_detail = {"via": "ui", "kind": action.kind, "incident": incident_id, "reason": reason}
    return await _after(request, incident_id, action_id, lambda: rem.reject(action_id, who=who.name, reason=reason))


@router.post("/ui/incidents/{incident_id}/resolve")
async def resolve(request: Request, incident_id: str) -> Response:
    who, form = await posted(request, Role.OPERATOR, "resolving an incident")
    check_id(incident_id, "an incident id", "inc-0123456789ab")
    reason = _reason(form)
    request.state.audit_detail = {"via": "ui", "reason": reason}
    desk = incidents_of(request)  # as the API's resolve: people are told
    return await _after(request, incident_id, "resolved", lambda: desk.resolve(incident_id, by=who.name, reason=reason))
