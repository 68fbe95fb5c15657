"""The webhook events' contract, version 1: what Argus POSTs to a generic or signed webhook (the ops agent's endpoint).

Every body names its schema (`"schema": "argus.event.v1"`), so a receiver can refuse a version it does not know. The
JSON Schema (draft 2020-12) is generated from the models below and kept in `schemas/argus-event-v1.json` beside this
module, where receivers and tests read it (a test checks the file is what these models say, and that every event
the notifiers send validates against it). A change that removes or retypes a field is a new version (v2, a new
file); adding an optional field is not.

Events: incident.opened, .updated, .resolved, .report_ready, .approval_needed (with approve/reject links), .planned
(remediation's steps, with the outcomes of those already ended), .step_finished (one step ended: `steps` holds it,
with its final status and what it did or why not; added within v1), and incident.digest (several incidents in one
delivery when a channel's rate limit is reached). Signed deliveries (a channel with a secret) carry
`X-Argus-Timestamp` and `X-Argus-Signature: sha256=<HMAC-SHA256 of the raw body>`; the body's `sent_at` repeats the
timestamp.

    python -m argus.notify.event_schema > argus/notify/schemas/argus-event-v1.json   # after changing the models
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from core.types import Category, IncidentState, Severity

EVENT_SCHEMA = "argus.event.v1"
SCHEMA_FILE = Path(__file__).parent / "schemas" / "argus-event-v1.json"

EventName = Literal["incident.opened", "incident.updated", "incident.resolved", "incident.report_ready",
                    "incident.approval_needed", "incident.planned", "incident.step_finished"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class About(_Part):
    """What the incident is about, as people name it."""

    label: str | None = None
    job: str | None = None
    node: str | None = None
    owner: str | None = None
    entrypoint: str | None = None


class IncidentPart(BaseModel):
    """The incident as the API returns it (GET /v1/incidents/{id} has all of it); a body too large for a channel
    carries its id and a shortened summary only. Fields may be added within v1."""

    model_config = ConfigDict(extra="allow")

    id: str
    category: Category | None = None
    severity: Severity | None = None
    state: IncidentState | None = None
    summary: str | None = None
    reopened: int | None = Field(default=None, ge=0)


class StepLine(_Part):
    action_id: str
    kind: str
    status: str
    text: str


class Approval(_Part):
    action_id: str
    kind: str
    target: str
    approve: str | None
    reject: str | None


class IncidentEvent(_Part):
    schema_: Literal["argus.event.v1"] = Field(alias="schema")
    event: EventName
    incident: IncidentPart
    about: About | None = None
    link: str | None = None
    report: str | None = None
    report_summary: str | None = None
    resolution: str | None = None
    steps: list[StepLine] | None = None
    steps_more: int | None = Field(default=None, ge=0)
    approvals: list[Approval] | None = None
    sent_at: int | None = Field(default=None, description="unix seconds; signed deliveries only, as the timestamp "
                                                          "header")


class DigestEvent(_Part):
    schema_: Literal["argus.event.v1"] = Field(alias="schema")
    event: Literal["incident.digest"]
    items: list[IncidentEvent]
    more: int = Field(ge=0)
    list_: str | None = Field(default=None, alias="list", description="the incident list in the API")
    sent_at: int | None = None


def json_schema() -> dict[str, Any]:
    """The v1 JSON Schema: one incident's event, or a digest of several."""
    schema = TypeAdapter(IncidentEvent | DigestEvent).json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"urn:{EVENT_SCHEMA}",
            "title": "Argus webhook event, version 1", **schema}


def load_schema() -> dict[str, Any]:
    """The committed schema file, as receivers read it."""
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return loaded


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
