"""The webhook events' contract (argus/notify/event_schema.py): the committed JSON Schema is what the models say,
every event the generic and signed webhooks send validates against it (tests/notify/test_channels.py sends each
kind and a digest through a real receiver), and it refuses what is not an Argus v1 event."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import jsonschema
import pytest

from argus.notify.event_schema import EVENT_SCHEMA, json_schema, load_schema
from argus.notify.webhook import WebhookNotifier, incident_payload
from core.types import Category, Finding, Incident, Severity, Subject, SubjectKind

VALIDATOR = jsonschema.Draft202012Validator(load_schema())


def assert_valid_event(body: dict[str, Any]) -> None:
    errors = sorted(VALIDATOR.iter_errors(body), key=str)
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]]


def test_the_committed_schema_is_what_the_models_say() -> None:
    jsonschema.Draft202012Validator.check_schema(load_schema())
    assert load_schema() == json_schema(), (
        "argus/notify/schemas/argus-event-v1.json is stale: regenerate it with "
        "`python -m argus.notify.event_schema > argus/notify/schemas/argus-event-v1.json`")


def an_incident(store: Any) -> Incident:
    finding = Finding(category=Category.NODE_LOST, reason="NodeMarkedDeadMissedHeartbeats", severity=Severity.CRITICAL,
                      subject=Subject(kind=SubjectKind.NODE, id="n" * 56, name="10.0.0.7"),
                      summary="node 10.0.0.7 died", attrs={"node_ip": "10.0.0.7", "submission_id": "raysubmit_1"})
    incident, _ = store.record_finding(finding)
    return incident


def recording_webhook() -> tuple[WebhookNotifier, list[dict[str, Any]]]:
    """The generic webhook, delivering to a receiver that keeps each body it is sent."""
    bodies: list[dict[str, Any]] = []

    def receive(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(204)

    notifier = WebhookNotifier("http://receiver.invalid/hook", public_url="https://argus.example",
                               client=httpx.Client(transport=httpx.MockTransport(receive)))
    return notifier, bodies


@pytest.mark.parametrize("event", ["opened", "updated", "resolved"])
def test_the_generic_webhook_sends_v1_events(store, event: str) -> None:
    incident = an_incident(store)
    notifier, bodies = recording_webhook()
    assert notifier.notify(incident, event)
    (body,) = bodies
    assert body["schema"] == EVENT_SCHEMA and body["event"] == f"incident.{event}"
    assert_valid_event(body)


@pytest.mark.parametrize("broken", [
    lambda b: b.pop("schema"),
    lambda b: b.update(schema="argus.event.v2"),
    lambda b: b.update(event="incident.exploded"),
    lambda b: b["incident"].pop("id"),
    lambda b: b["incident"].update(category="cosmic_rays"),
    lambda b: b.update(surprise=True),
])
def test_what_is_not_a_v1_event_is_refused(store, broken: Any) -> None:
    body = copy.deepcopy(incident_payload(an_incident(store), "opened", link="https://argus.example/v1/incidents/x"))
    assert_valid_event(copy.deepcopy(body))
    broken(body)
    assert list(VALIDATOR.iter_errors(body))


def test_a_step_that_ended_is_sent_to_the_generic_webhook_as_a_v1_event(store) -> None:
    """The ops agent approved a step and waits for its end: incident.step_finished carries it, final status and all."""
    from argus.incidents.events import IncidentEvent
    from argus.incidents.subscribers import NotifierSubscriber
    from core.types import Action, ActionState

    incident = an_incident(store)
    notifier, bodies = recording_webhook()
    drained = Action(id="act-000000000007", incident_id=incident.id, kind="drain_node", target=incident.subject,
                     state=ActionState.FAILED, idempotency_key=f"{incident.id}:policy:0:drain_node",
                     requested_by="policy", dry_run=False, result={"message": "ray drain-node refused: node is dead"})
    NotifierSubscriber(notifier).receive(IncidentEvent.step_finished(incident, drained))
    (body,) = bodies
    assert body["event"] == "incident.step_finished"
    assert body["steps"] == [{"action_id": "act-000000000007", "kind": "drain_node", "status": "failed",
                              "text": body["steps"][0]["text"]}]
    assert "ray drain-node refused: node is dead" in body["steps"][0]["text"]
    assert_valid_event(body)
