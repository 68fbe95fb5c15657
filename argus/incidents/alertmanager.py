"""Alertmanager's alerts as findings, and filing one through the incident desk.

The body is Alertmanager's webhook format (version 4): `status`, `receiver`, `groupKey`, `alerts[]` with `status`,
`labels`, `annotations`, `startsAt`, `endsAt`, `fingerprint`. An alert of a rule Argus exported carries `category` and
`severity` labels and gets the fingerprint Argus's own evaluation of that rule gives (category, the subject from its
labels, the alert name), so the two land in one incident. A resolved alert resolves the open incident it opened, if
nothing else keeps it open. The webhook (argus/api/alerts.py) queues alerts; the filer
(argus/incidents/alert_filer.py) files them here.
"""

from __future__ import annotations

from typing import Annotated, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from argus.incidents.desk import IncidentDesk, Outcome
from collectors.metric_rules import subject_of
from core.types import Category, Evidence, Finding, IsoDateTime, Severity, fingerprint_of, utcnow

Text = Annotated[str, Field(max_length=4096)]


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[Annotated[str, Field(max_length=256)], Text] = Field(max_length=64)
    annotations: dict[Annotated[str, Field(max_length=256)], Text] = Field(default_factory=dict, max_length=64)
    startsAt: IsoDateTime  # noqa: N815 - Alertmanager's field names
    endsAt: IsoDateTime | None = None  # noqa: N815
    generatorURL: Text = ""  # noqa: N815
    fingerprint: Annotated[str, Field(max_length=64)] = ""


class AlertmanagerWebhook(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: Text = ""
    groupKey: Text = ""  # noqa: N815
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class AlertFiled(NamedTuple):
    """What filing one alert did: "opened", "reopened", "folded" (into an open incident, or as an echo),
    "resolved", or "no_incident" (a resolved alert whose incident was not open)."""

    outcome: str
    incident_id: str | None


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


def file_alert(desk: IncidentDesk, alert: Alert) -> AlertFiled:
    """File a firing alert through the desk (correlated and announced like Argus's own findings); resolve the
    incident a resolved alert opened."""
    finding = to_finding(alert)
    if alert.status == "firing":
        filed = desk.file(finding)
        if filed.outcome is Outcome.OPENED:
            return AlertFiled("opened", filed.incident.id)
        if filed.outcome is Outcome.REOPENED:  # the alert fired again soon after it resolved
            return AlertFiled("reopened", filed.incident.id)
        return AlertFiled("folded", filed.incident.id)
    incident = desk.store.find_open(finding.fingerprint)
    if incident is None:
        return AlertFiled("no_incident", None)
    desk.resolve(incident.id, by="alertmanager", reason=f"{finding.reason} resolved")
    return AlertFiled("resolved", incident.id)


def _subject_attrs(labels: dict[str, str]) -> dict[str, str]:
    out = {}
    if labels.get("submission_id"):
        out["submission_id"] = labels["submission_id"]
    ip = labels.get("ip") or labels.get("node_ip") or labels.get("instance", "").rsplit(":", 1)[0]
    if ip:
        out["node_ip"] = ip
    return out
