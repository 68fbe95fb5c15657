"""Flapping is one incident: a fault that ends and comes back within the reopen window reopens its incident,
counted, announced as an update; remediation is not planned again; webhooks hear every change and IM at most one
message per renotify interval. Real SQLite stores, the real desk and bus, the real loop with the real disk-space
detector, a real webhook receiver and a real local Slack receiver."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk, Outcome, ordinal
from argus.incidents.events import EventKind
from argus.incidents.subscribers import RemediationSubscriber
from argus.pipeline import Pipeline
from argus.store.store import Store
from argus.wiring import build_control, build_dispatcher, build_incidents, build_remediator
from core.errors import ConfigError
from core.settings import load_settings
from core.types import Category, Finding, IncidentState, Severity, Subject, SubjectKind
from detectors.disk_space import DiskSpaceDetector
from stage.localstack.ports import free_port
from stage.localstack.webhook_receiver import WebhookReceiver
from tests.argus.test_cli import run as run_cli
from tests.argus.test_recoveries import GB, Feed, storage
from tests.notify.platforms import Platform, digest_text
from tests.support import Clock, RecordingSubscriber

T0 = datetime.now(timezone.utc)  # the correlator looks back 30 minutes from now


def node_lost(node_ip: str = "10.0.0.9") -> Finding:
    return Finding(category=Category.NODE_LOST, reason="RayNodeDead", severity=Severity.CRITICAL,
                   subject=Subject(kind=SubjectKind.NODE, id="n" * 56, name=node_ip),
                   summary=f"node {node_ip} died", first_seen=T0, detected_at=T0, attrs={"node_ip": node_ip})


def xid(node_ip: str = "10.0.0.9") -> Finding:
    """A GPU that keeps falling off the bus: the fault that flaps. (A lost node does not: a Ray node id dies once,
    and the desk files a late finding about it with its incident; argus/incidents/desk.py.)"""
    return Finding(category=Category.GPU_HARDWARE, reason="XidError", severity=Severity.CRITICAL,
                   subject=Subject(kind=SubjectKind.GPU, id="GPU-0f3a", name=node_ip),
                   summary=f"GPU 3 on {node_ip} reported Xid 79", first_seen=T0, detected_at=T0,
                   attrs={"node_ip": node_ip})


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def timed_store(tmp_path: Path, clock: Clock):  # type: ignore[no-untyped-def]
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    yield s
    s.close()


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_the_desk_reopens_a_recently_resolved_incident_and_announces_it_as_an_update(timed_store, clock) -> None:
    recorder = RecordingSubscriber()
    desk = IncidentDesk(timed_store, events=EventBus().start([recorder]), correlator=Correlator(timed_store),
                        reopen_window_s=1800)
    try:
        first = desk.file(xid())
        assert first.outcome is Outcome.OPENED
        desk.resolve(first.incident.id, by="alice", reason="node rebooted")  # a person's resolve counts too
        clock.tick(120)
        back = xid()
        again = desk.file(back)
        assert again.outcome is Outcome.REOPENED and again.incident.id == first.incident.id
        assert again.incident.state is IncidentState.OPEN and again.incident.reopened == 1
        assert desk.file(xid()).outcome is Outcome.FOLDED  # open again: repeats fold as always

        desk.resolve(first.incident.id, by="argus:lost_node", reason="node 10.0.0.9 is ALIVE again")
        clock.tick(60)
        assert desk.file(xid()).incident.reopened == 2

        desk.resolve(first.incident.id, by="argus:lost_node", reason="node 10.0.0.9 is ALIVE again")
        clock.tick(1801)  # past the window: history, a new incident
        late = desk.file(xid())
        assert late.outcome is Outcome.OPENED and late.incident.id != first.incident.id

        assert desk.events.drain(10)
        kinds = [(e.kind, e.incident.id == first.incident.id) for e in recorder.events]
        assert kinds == [(EventKind.OPENED, True), (EventKind.RESOLVED, True), (EventKind.UPDATED, True),
                         (EventKind.RESOLVED, True), (EventKind.UPDATED, True), (EventKind.RESOLVED, True),
                         (EventKind.OPENED, False)]
        reopened = recorder.events[2]
        assert reopened.finding == back
        assert reopened.detail == {"by": "argus", "reason": "reopened (1st time): GPU 3 on 10.0.0.9 reported Xid 79",
                                   "reopened": 1}
        assert recorder.events[4].detail["reason"] == "reopened (2nd time): GPU 3 on 10.0.0.9 reported Xid 79"
    finally:
        desk.events.close()


def test_a_desk_without_a_reopen_window_opens_a_new_incident_and_a_negative_one_is_refused(timed_store) -> None:
    desk = IncidentDesk(timed_store)
    first = desk.file(xid())
    desk.resolve(first.incident.id, by="alice")
    assert desk.file(xid()).outcome is Outcome.OPENED
    with pytest.raises(ValueError, match="reopen_window_s"):
        IncidentDesk(timed_store, reopen_window_s=-1)
    with pytest.raises(ConfigError, match="reopen_window_s"):
        load_settings(reopen_window_s=-5)
    with pytest.raises(ConfigError, match="renotify_interval_s"):
        load_settings(renotify_interval_s=-1)


def test_the_cli_shows_the_reopen_count(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    incident, _ = store.file_finding(node_lost())
    store.set_state(incident.id, IncidentState.RESOLVED)
    assert store.file_finding(node_lost(), reopen_within_s=1800)[1] == "reopened"
    store.close()
    env = {"ARGUS_DATA_DIR": str(tmp_path)}
    shown = run_cli("incidents", "show", incident.id, env=env)
    assert shown.returncode == 0 and "seen 2x, reopened 1x" in shown.stdout, shown.stderr
    as_json = run_cli("incidents", "show", incident.id, "--json", env=env)
    assert json.loads(as_json.stdout)["incident"]["reopened"] == 1


def test_a_reopened_incident_is_not_planned_again(tmp_path: Path) -> None:
    """The real runner in approval mode: the opening plans the policy's steps and asks for approval once; the
    reopening of the same incident asks nothing and plans nothing more."""
    (tmp_path / "shared" / "jobs").mkdir(parents=True)
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "shared", remediation_mode="approval",
                             ray_dashboard_url=f"http://127.0.0.1:{free_port()}", request_timeout_s=2)
    store = Store(settings.effective_database_url)
    recorder = RecordingSubscriber()
    bus = EventBus()
    remediator = build_remediator(settings, store, build_control(settings, store))
    bus.start([RemediationSubscriber(remediator, bus), recorder])
    desk = IncidentDesk(store, events=bus, reopen_window_s=settings.reopen_window_s)
    try:
        first = desk.file(xid())
        assert bus.drain(30)
        planned = store.list_actions(first.incident.id)
        assert planned, "the policy plans steps for a GPU's Xid"
        desk.resolve(first.incident.id, by="argus:lost_node", reason="node 10.0.0.9 is ALIVE again")
        assert desk.file(xid()).outcome is Outcome.REOPENED
        assert bus.drain(30)
        assert store.list_actions(first.incident.id) == planned
        assert [e.kind for e in recorder.events] == [EventKind.OPENED, EventKind.APPROVAL_NEEDED, EventKind.PLANNED,
                                                     EventKind.RESOLVED, EventKind.UPDATED]
    finally:
        bus.close()
        store.close()


def test_a_flapping_disk_is_one_incident_and_im_is_told_within_its_limit(tmp_path: Path, store: Store,
                                                                         webhook_receiver: WebhookReceiver) -> None:
    """Wired as `argus serve` wires it (settings name a webhook and a Slack channel): shared storage fills, is
    cleaned up, fills again and is cleaned up again, minutes apart. One incident, reopened once; the webhook hears
    all four changes; Slack hears the opening and the first resolve at once, and the reopening and its resolve,
    within the renotify interval, as one message."""
    slack = Platform("slack").start()
    clock = Clock(T0)
    settings = load_settings(data_dir=tmp_path, webhook_urls=[f"{webhook_receiver.url}/agent"],
                             notify_channels=[{"kind": "slack", "url": slack.url, "name": "ops-slack"}],
                             reopen_window_s=1800, renotify_interval_s=900)
    dispatcher = build_dispatcher(settings, store)
    assert dispatcher is not None
    desk = build_incidents(settings, store, dispatcher=dispatcher)
    feed = Feed()
    pipeline = Pipeline(collectors=[feed], detectors=[DiskSpaceDetector(clock=clock)], incidents=desk, clock=clock)
    # GB free of 1000, a sample a minute: 3% (under the 5% floor), 6%, 40% (clear), then 3% again and 40% again
    frees = [30, 30, 60, 60, 400, 400, 400, 30, 30, 400]
    try:
        ticks = []
        for minute, free in enumerate(frees):
            clock.now = T0 + timedelta(minutes=minute)
            feed.batches = [[storage(free * GB, clock.now)]]
            ticks.append(pipeline.run_once())
        [incident] = [i for t in ticks for i in t.opened]
        assert incident.category is Category.DISK_FULL
        [reopened] = ticks[7].reopened
        assert reopened.id == incident.id and reopened.reopened == 1
        assert [(n, i.id) for n, t in enumerate(ticks) for i in t.resolved] == [(5, incident.id), (9, incident.id)]
        [stored] = store.list_incidents()
        assert (stored.id, stored.state, stored.reopened) == (incident.id, IncidentState.RESOLVED, 1)

        assert desk.events.drain(30)
        events = [p["body"]["event"] for p in webhook_receiver.received]
        assert events == ["incident.opened", "incident.resolved", "incident.updated", "incident.resolved"]
        assert [p["body"]["incident"]["reopened"] for p in webhook_receiver.received] == [0, 0, 1, 1]

        assert len(slack.received) == 2  # the reopening and its resolve wait: told a moment ago, not 900 s
        assert dispatcher.pending() == {"ops-slack": 1}
    finally:
        desk.events.close()
        dispatcher.close()  # shutting down tells what waits rather than lose it
        slack.receiver.stop()
    assert len(slack.received) == 3 and slack.problems == []
    text = digest_text("slack", slack.bodies()[-1])
    assert "Incident resolved" in text and "reopened 1 time" in text and "2 changes since the last message" in text
    rows = store.list_deliveries(incident_id=incident.id)
    assert sorted(r.event for r in rows) == ["opened", "resolved", "resolved", "updated"] and all(r.ok for r in rows)
