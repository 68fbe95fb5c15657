"""Alertmanager's webhook: alerts from the rules Argus exports (and any others) become findings, filed
through the same deduplication as Argus's own detections.

The body is Alertmanager's webhook format (version 4): `status`, `receiver`, `groupKey`, `alerts[]` with
`status`, `labels`, `annotations`, `startsAt`, `endsAt`, `fingerprint`. An alert of a rule Argus exported
carries `category` and `severity` labels and gets the fingerprint Argus's own evaluation of that rule gives
(category, the subject from its labels, the alert name), so the two land in one incident. A resolved alert
resolves the open incident it opened, if nothing else keeps it open. Both go through the incident desk, so
webhooks, IM, reports and remediation hear of them as of any other incident. Configure Alertmanager with
`http_config.authorization.credentials: <an Argus operator token>`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from argus.api.auth import require
from argus.api.state import incidents_of
from argus.incidents.desk import IncidentDesk, Outcome
from argus.store.tokens import Role
from collectors.metric_rules import subject_of
from core.types import Category, Evidence, Finding, Severity, fingerprint_of, utcnow

router = APIRouter(tags=["alerts"])
Text = Annotated[str, Field(max_length=4096)]


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[Annotated[str, Field(max_length=256)], Text] = Field(max_length=64)
    annotations: dict[Annotated[str, Field(max_length=256)], Text] = Field(default_factory=dict, max_length=64)
    startsAt: datetime  # noqa: N815 - Alertmanager's field names
    endsAt: datetime | None = None  # noqa: N815
    generatorURL: Text = ""  # noqa: N815
    fingerprint: Annotated[str, Field(max_length=64)] = ""


class AlertmanagerWebhook(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: Text = ""
    groupKey: Text = ""  # noqa: N815
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


def to_finding(alert: Alert) -> Finding:
    labels = alert.labels
    name = labels.get("alertname", "AlertmanagerAlert")[:120]
    try:
        category = Category(labels.get("category", "unknown"))
    except ValueError:
        category = Category.UNKNOWN
    try:
        severity = Severity(labels.get("severity", "warning"))
    except ValueError:
        severity = Severity.WARNING
    subject = subject_of(labels)
    summary = alert.annotations.get("summary") or alert.annotations.get("description") or name
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))[:1000]
    return Finding(
        category=category, reason=name, subject=subject, summary=summary[:1000], severity=severity,
        confidence=0.9 if category is not Category.UNKNOWN else 0.5,
        evidence=(Evidence(source="alertmanager", text=f"{name} {alert.status}: {shown}", at=alert.startsAt),),
        first_seen=alert.startsAt, detected_at=utcnow(),
        recommended_action=alert.annotations.get("action"),
        fingerprint=fingerprint_of(category, subject, name),
        attrs={"labels": dict(labels), "alertmanager_fingerprint": alert.fingerprint,
               "generator_url": alert.generatorURL, **_subject_attrs(labels)},
    )


def _subject_attrs(labels: dict[str, str]) -> dict[str, str]:
    out = {}
    if labels.get("submission_id"):
        out["submission_id"] = labels["submission_id"]
    ip = labels.get("ip") or labels.get("node_ip") or labels.get("instance", "").rsplit(":", 1)[0]
    if ip:
        out["node_ip"] = ip
    return out


@router.post("/v1/alerts/alertmanager", dependencies=[Depends(require(Role.OPERATOR))])
async def alertmanager(request: Request, body: Annotated[AlertmanagerWebhook, Body()]) -> dict[str, Any]:
    """File firing alerts through the incident desk (correlated and announced like Argus's own findings); a
    resolved alert resolves the incident it opened."""
    desk = incidents_of(request)
    return await run_in_threadpool(_file_all, request, desk, body)


def _file_all(request: Request, desk: IncidentDesk, body: AlertmanagerWebhook) -> dict[str, Any]:
    """A webhook's alerts, filed in one worker thread (one hop off the event loop per request, not per alert)."""
    opened, reopened, folded, resolved = [], [], 0, []
    for alert in body.alerts:
        finding = to_finding(alert)
        if alert.status == "firing":
            filed = desk.file(finding)
            if filed.outcome is Outcome.OPENED:
                opened.append(filed.incident.id)
            elif filed.outcome is Outcome.REOPENED:  # the alert fired again soon after it resolved
                reopened.append(filed.incident.id)
            else:
                folded += 1
        else:
            incident = desk.store.find_open(finding.fingerprint)
            if incident is not None:
                desk.resolve(incident.id, by="alertmanager", reason=f"{finding.reason} resolved")
                resolved.append(incident.id)
    request.state.audit_detail = {"group": body.groupKey[:200], "opened": opened, "reopened": reopened,
                                  "resolved": resolved}
    return {"opened": opened, "reopened": reopened, "folded": folded, "resolved": resolved}
