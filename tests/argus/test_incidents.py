"""The one way in for incidents: the desk files and resolves, the bus tells every subscriber off the caller's
thread. Real SQLite store, real HTTP receivers, the real API and loop."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk, Outcome
from argus.incidents.events import EventKind, IncidentEvent
from argus.incidents.subscribers import NotifierSubscriber
from argus.notify.webhook import WebhookNotifier
from argus.pipeline import Pipeline
from argus.store.store import Store
from argus.wiring import build_incidents
from core.errors import NotFound
from core.readers import GIVE_WAY_MAX_S, Readers
from core.settings import load_settings
from core.types import (
    Category,
    Evidence,
    Finding,
    IncidentState,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
)
from detectors.stall import StallDetector
from stage.localstack.webhook_receiver import Reply, WebhookReceiver
from tests.helpers import wait_until
from tests.support import Clock, RecordingSubscriber

T0 = datetime.now(timezone.utc)  # the correlator looks back 30 minutes from now


def job_failure(sid: str, category: Category = Category.GPU_OOM, reason: str = "CudaOutOfMemory") -> Finding:
    return Finding(category=category, reason=reason, subject=Subject(kind=SubjectKind.JOB, id=sid),
                   summary=f"{reason} in {sid}", severity=Severity.CRITICAL, first_seen=T0, detected_at=T0,
                   evidence=(Evidence(source=f"jobs/{sid}/logs/rank0.log", line=3, text=reason),))


class Replay:
    """A detector that emits the findings it is given, one batch per tick."""

    name = "replay"

    def __init__(self, *batches: list[Finding]) -> None:
        self.batches = list(batches)

    def detect(self, signals: object) -> list[Finding]:
        return self.batches.pop(0) if self.batches else []


def operator(store: Store, app: FastAPI) -> TestClient:
    _, token = store.create_token("am", "operator", created_by="tests")
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def alert(status: str, **labels: str) -> dict:
    return {"status": status, "labels": {"alertname": "GpuMemoryNearlyFull", "category": "gpu_oom",
                                         "severity": "critical", **labels},
            "annotations": {"summary": "GPU memory nearly full"}, "startsAt": "2026-11-24T09:00:00Z"}


def webhook_body(status: str, *alerts: dict) -> dict:
    return {"version": "4", "status": status, "receiver": "argus", "groupKey": "{}:{}", "alerts": list(alerts)}


# -- the Alertmanager route goes through the desk ------------------------------------------------------------------


def test_an_alertmanager_incident_reaches_webhooks_as_opened_then_resolved(tmp_path, store):
    """Wired as `argus serve` wires it: settings name a webhook; the alert's incident is announced to it."""
    with WebhookReceiver() as receiver:
        settings = load_settings(data_dir=tmp_path, webhook_urls=[f"{receiver.url}/agent"])
        desk = build_incidents(settings, store, public_url="http://argus.example:8080")
        try:
            client = operator(store, create_app(store=store, incidents=desk))
            labels = {"submission_id": "raysubmit_am1", "node_ip": "10.0.0.7"}
            fired = client.post("/v1/alerts/alertmanager", json=webhook_body("firing", alert("firing", **labels)))
            assert fired.status_code == 200
            [incident_id] = fired.json()["opened"]
            opened = receiver.wait_for(lambda p: p["body"]["event"] == "incident.opened", what="incident.opened")
            assert opened["path"] == "/agent" and opened["body"]["incident"]["id"] == incident_id
            assert opened["body"]["link"] == f"http://argus.example:8080/v1/incidents/{incident_id}"

            again = client.post("/v1/alerts/alertmanager", json=webhook_body("firing", alert("firing", **labels)))
            assert again.json() == {"opened": [], "reopened": [], "folded": 1, "resolved": [], "queued": 0}
            done = client.post("/v1/alerts/alertmanager", json=webhook_body("resolved", alert("resolved", **labels)))
            assert done.json()["resolved"] == [incident_id]
            resolved = receiver.wait_for(lambda p: p["body"]["event"] == "incident.resolved", what="resolved")
            assert resolved["body"]["incident"]["state"] == "resolved"
            assert desk.events.drain(30)
            assert [p["body"]["event"] for p in receiver.received] == ["incident.opened", "incident.resolved"]
        finally:
            desk.events.close()


def test_an_alert_about_a_job_whose_root_cause_is_open_is_filed_as_its_echo(store):
    """The route uses the correlator like the loop: an NCCL alert on a job with an open GPU OOM is an echo."""
    recorder = RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    root = desk.file(job_failure("raysubmit_echo"))
    client = operator(store, create_app(store=store, incidents=desk))
    body = webhook_body("firing", alert("firing", alertname="NcclSlow", category="nccl_error",
                                        submission_id="raysubmit_echo"))
    answer = client.post("/v1/alerts/alertmanager", json=body).json()
    assert answer["opened"] == [] and answer["folded"] == 1
    assert {f.reason for f in store.findings_for(root.incident.id)} == {"CudaOutOfMemory", "NcclSlow"}
    assert desk.events.drain(10)
    assert [(e.kind, e.incident.id) for e in recorder.events] == [(EventKind.OPENED, root.incident.id)]


# -- a slow receiver never delays detection ----------------------------------------------------------------------


def test_a_receiver_that_hangs_does_not_delay_the_next_tick(store):
    entered, release = threading.Event(), threading.Event()

    def hang(post: dict) -> Reply:
        entered.set()
        release.wait(120)  # holds the request open until the test lets go
        return Reply()

    with WebhookReceiver(reply=hang) as receiver:
        webhook = WebhookNotifier(receiver.url, timeout_s=180, attempts=1)
        bus = EventBus().start([NotifierSubscriber(webhook)])
        desk = IncidentDesk(store, events=bus, correlator=Correlator(store))
        pipeline = Pipeline(collectors=[], detectors=[Replay([job_failure("raysubmit_a")],
                                                             [job_failure("raysubmit_b")])], incidents=desk)
        try:
            ticks: list = []
            first = threading.Thread(target=lambda: ticks.append(pipeline.run_once()))
            first.start()
            first.join(60)
            assert not first.is_alive(), "the tick waited for the webhook"
            assert entered.wait(60), "the webhook was never called"
            second = pipeline.run_once()  # the receiver still holds the first POST open
            assert not release.is_set() and receiver.received == []
            assert [i.subject.id for i in ticks[0].opened] == ["raysubmit_a"]
            assert [i.subject.id for i in second.opened] == ["raysubmit_b"]
            assert bus.pending()["webhook"] == 2  # the hung delivery and the one behind it
        finally:
            release.set()
        assert bus.drain(60)
        sent = [p["body"]["incident"]["subject"]["id"] for p in receiver.received]
        assert sent == ["raysubmit_a", "raysubmit_b"]  # in order, nothing lost
        bus.close()


# -- the bus --------------------------------------------------------------------------------------------------------


class Exploding:
    name = "exploding"

    def __init__(self) -> None:
        self.calls = 0

    def receive(self, event: IncidentEvent) -> None:
        self.calls += 1
        raise RuntimeError("bug in a subscriber")


def test_a_failing_subscriber_neither_stops_others_nor_itself(store):
    recorder, broken = RecordingSubscriber(), Exploding()
    desk = IncidentDesk(store, events=EventBus().start([broken, recorder]))
    ids = [desk.file(job_failure(f"raysubmit_{n}")).incident.id for n in range(3)]
    assert desk.events.drain(10)
    assert [e.incident.id for e in recorder.events] == ids and broken.calls == 3


def test_events_published_before_start_are_delivered_at_start(store):
    bus = EventBus()
    desk = IncidentDesk(store, events=bus)
    filed = desk.file(job_failure("raysubmit_early"))
    recorder = RecordingSubscriber()
    bus.start([recorder])
    assert bus.drain(10) and [e.incident.id for e in recorder.events] == [filed.incident.id]
    with pytest.raises(RuntimeError, match="started once"):
        bus.start([])


def test_subscribers_give_way_while_people_read_the_api(store):
    readers = Readers()
    received: list[float] = []

    class Timed:
        name = "timed"

        def receive(self, event: IncidentEvent) -> None:
            received.append(time.monotonic())

    bus = EventBus(readers=readers).start([Timed()])
    desk = IncidentDesk(store, events=bus)
    readers.now = 1  # someone reads the API the whole time: each event waits GIVE_WAY_MAX_S, then goes out anyway
    sent = time.monotonic()
    desk.file(job_failure("raysubmit_read"))
    assert bus.drain(10) and len(received) == 1 and received[0] - sent >= GIVE_WAY_MAX_S * 0.9
    bus.close()


def test_subscriber_names_are_unique():
    with pytest.raises(ValueError, match="unique"):
        EventBus().start([RecordingSubscriber(), RecordingSubscriber()])


def test_a_full_mailbox_drops_and_counts_instead_of_blocking(store):
    release = threading.Event()

    class Stuck:
        name = "stuck"

        def receive(self, event: IncidentEvent) -> None:
            release.wait(60)

    bus = EventBus(capacity=2).start([Stuck()])
    desk = IncidentDesk(store, events=bus)
    for n in range(6):  # one is being handled, two wait, the rest find the mailbox full
        desk.file(job_failure(f"raysubmit_full{n}"))
    wait_until("the drops to be counted", lambda: bus.dropped()["stuck"] >= 3, timeout=10, interval=0.05)
    assert bus.dropped()["stuck"] in (3, 4)  # 4 when the first was not yet taken out when the sixth came
    release.set()
    assert bus.drain(10)
    bus.close()


# -- the desk -------------------------------------------------------------------------------------------------------


def test_filing_returns_what_happened(store):
    recorder = RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]), correlator=Correlator(store))
    first = desk.file(job_failure("raysubmit_f"))
    again = desk.file(job_failure("raysubmit_f"))
    echo = desk.file(job_failure("raysubmit_f", Category.NCCL_ERROR, "NcclRemoteError"))
    assert (first.outcome, again.outcome, echo.outcome) == (Outcome.OPENED, Outcome.FOLDED, Outcome.ECHO)
    assert again.incident.id == echo.incident.id == first.incident.id and again.incident.occurrences == 2
    assert desk.events.drain(10)
    [opened] = recorder.events
    assert opened.kind is EventKind.OPENED and opened.finding is not None and opened.finding.reason == "CudaOutOfMemory"


def test_resolving_announces_once_and_names_who_and_why(store):
    recorder = RecordingSubscriber()
    desk = IncidentDesk(store, events=EventBus().start([recorder]))
    incident = desk.file(job_failure("raysubmit_r")).incident
    assert desk.resolve(incident.id, by="ops", reason="node replaced").state is IncidentState.RESOLVED
    desk.resolve(incident.id, by="ops", reason="again")  # nothing changed: nobody is told twice
    with pytest.raises(NotFound):
        desk.resolve("inc-000000000000", by="ops")
    assert desk.events.drain(10)
    assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.RESOLVED]
    assert recorder.events[1].detail == {"by": "ops", "reason": "node replaced"}
    mitigating = desk.set_state(incident.id, IncidentState.MITIGATING, by="argus")  # reopened: an update
    assert mitigating.state is IncidentState.MITIGATING
    assert desk.events.drain(10) and recorder.events[-1].kind is EventKind.UPDATED


# -- a fault that ends closes its incident ---------------------------------------------------------------------------


class Feed:
    """A collector over signals the test hands it, one batch per tick."""

    name = "feed"

    def __init__(self) -> None:
        self.batches: list[list[Signal]] = []

    def collect(self) -> list[Signal]:
        return self.batches.pop(0) if self.batches else []


def running(sid: str) -> Signal:
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", subject=Subject(kind=SubjectKind.JOB, id=sid),
                  attrs={"status": "RUNNING", "submission_id": sid})


def step(sid: str, n: int, at: datetime) -> Signal:
    return Signal(kind=SignalKind.LOG_LINE, source=f"jobs/{sid}/logs/driver.log", line=n, text=f"step:{n} - loss:0.5",
                  observed_at=at, subject=Subject(kind=SubjectKind.JOB, id=sid), attrs={"stream": "job-logs"})


def test_a_stall_that_ends_closes_its_incident_and_webhooks_hear_why(store):
    """The real stall detector through the real loop: 5 steps 10 s apart, silence, the incident opens; a step
    comes again, the detector tells the recovery and the desk resolves the incident, announced with its reason."""
    sid, clock = "raysubmit_resumes", Clock(T0)
    feed = Feed()
    feed.batches = [[running(sid), step(sid, n, T0 + timedelta(seconds=10 * n))] for n in range(1, 6)]
    with WebhookReceiver() as receiver:
        bus = EventBus().start([NotifierSubscriber(WebhookNotifier(receiver.url, attempts=1))])
        desk = IncidentDesk(store, events=bus, correlator=Correlator(store))
        pipeline = Pipeline(collectors=[feed], detectors=[StallDetector(min_stall_s=30, factor=3, clock=clock)],
                            incidents=desk, clock=clock)
        try:
            for n in range(1, 6):
                clock.now = T0 + timedelta(seconds=10 * n)
                assert pipeline.run_once().opened == []
            clock.now = T0 + timedelta(seconds=50 + 31)
            feed.batches = [[running(sid)]]
            [incident] = pipeline.run_once().opened
            assert incident.category is Category.NCCL_HANG

            clock.now = T0 + timedelta(seconds=90)
            feed.batches = [[running(sid), step(sid, 6, clock.now)]]
            tick = pipeline.run_once()
            assert [i.id for i in tick.resolved] == [incident.id] and tick.opened == []
            [recovery] = tick.recoveries
            assert "progress resumed" in recovery.reason and "step:6" in recovery.reason
            closed = store.get_incident(incident.id)
            assert closed.state is IncidentState.RESOLVED

            resolved = receiver.wait_for(lambda p: p["body"]["event"] == "incident.resolved", what="resolved")
            assert resolved["body"]["incident"]["id"] == incident.id
            clock.now = T0 + timedelta(seconds=95)
            feed.batches = [[running(sid), step(sid, 7, clock.now)]]
            assert pipeline.run_once().resolved == []  # told once
        finally:
            bus.close()
