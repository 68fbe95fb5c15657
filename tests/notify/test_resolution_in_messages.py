"""A resolved incident says who resolved it and why, wherever it is told: recorded on the incident by the store (the
API and the web page show it), in every IM channel's payload as the platform receives it (a real local receiver
checking each documented format), and in the webhook; a reopened incident no longer carries the old resolution."""

from __future__ import annotations

import pytest

from argus.incidents.desk import IncidentDesk
from argus.notify.message import build_message
from argus.store.store import Store
from core.types import RESOLUTION, Category, Finding, IncidentState, Recovery, Severity, Subject, SubjectKind
from tests.notify.conftest import KINDS, PUBLIC_URL, send
from tests.notify.platforms import texts

SID = "pretrain-20261122T084034Z-eff5"
WHY = "progress resumed (steps) at step 120 <@U123> *bold*"


def hang(store: Store) -> Finding:
    return Finding(category=Category.NCCL_HANG, reason="TrainingStalled", severity=Severity.CRITICAL,
                   subject=Subject(kind=SubjectKind.JOB, id=SID, name="pretrain"),
                   summary=f"Job {SID} made no progress for 60 s", attrs={"submission_id": SID})


def recovered(store: Store):
    desk = IncidentDesk(store)
    finding = hang(store)
    desk.file(finding)
    closed = desk.recover(Recovery(fingerprint=finding.fingerprint, reason=WHY, detector="stall"))
    assert closed is not None and closed.state is IncidentState.RESOLVED
    return closed


def test_the_store_records_who_resolved_and_why_and_a_reopening_clears_it(store: Store) -> None:
    closed = recovered(store)
    record = store.get_incident(closed.id).attrs[RESOLUTION]
    assert record["by"] == "argus:stall" and record["reason"] == WHY and record["at"]
    assert closed.resolution == f"by argus:stall: {WHY}"
    reopened = store.set_state(closed.id, IncidentState.OPEN)
    assert RESOLUTION not in reopened.attrs and reopened.resolution is None
    person = store.set_state(closed.id, IncidentState.RESOLVED, by="alice", reason="x" * 5000)
    assert person.attrs[RESOLUTION]["by"] == "alice" and len(person.attrs[RESOLUTION]["reason"]) == 500


def test_a_resolution_without_a_reason_still_says_who(store: Store) -> None:
    finding = hang(store)
    incident, _ = store.record_finding(finding)
    assert store.set_state(incident.id, IncidentState.RESOLVED, by="alertmanager").resolution == "by alertmanager"
    assert store.set_state(incident.id, IncidentState.OPEN).resolution is None


@pytest.mark.parametrize("kind", KINDS)
def test_each_channel_tells_why_the_incident_was_resolved(kind, platforms, store, clock, sleeps, client):
    platform = platforms[kind]
    closed = recovered(store)
    body = send(platform, build_message(closed, "resolved", public_url=PUBLIC_URL), clock, sleeps, client)
    if kind == "webhook":
        assert body["resolution"] == f"by argus:stall: {WHY}"
        assert body["incident"]["attrs"][RESOLUTION]["reason"] == WHY
        return
    shown = "\n".join(texts(body))
    assert "Resolved" in shown and "argus:stall" in shown and "progress resumed (steps) at step 120" in shown
    assert "<@U123>" not in shown  # the reason is untrusted text: escaped like every other field


def test_an_open_incident_message_has_no_resolution(store: Store) -> None:
    incident, _ = store.record_finding(hang(store))
    assert build_message(incident, "opened", public_url=PUBLIC_URL).resolution is None
