"""The Dispatcher against the five platforms played by real local receivers, with the real Store as its log."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from argus.notify.dispatcher import Dispatcher, TokenBucket
from argus.notify.message import ApprovalLink
from argus.store.store import Store
from core.channels import ChannelConfig
from core.types import Category, IncidentState, Report, Severity
from stage.localstack.ports import free_port
from stage.localstack.webhook_receiver import Reply
from tests.notify.conftest import KINDS, PUBLIC_URL, configs, open_incident
from tests.notify.platforms import (
    DINGTALK_TOO_FAST,
    SLACK_INVALID_BLOCKS,
    SLACK_RATE_LIMITED,
    WECOM_FREQ,
    WECOM_TOO_LONG,
    digest_text,
)


def _deliveries(store: Store, **kw):
    return store.list_deliveries(limit=1000, **kw)


def test_an_opened_incident_reaches_every_channel_once_and_is_recorded(platforms, store, make_dispatcher):
    dispatcher = make_dispatcher(configs(platforms))
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened") is True
    for kind, p in platforms.items():
        assert len(p.received) == 1, kind
        assert p.problems == [], (kind, p.problems)
    rows = _deliveries(store, incident_id=incident.id)
    assert sorted(r.channel for r in rows) == sorted(KINDS)
    assert all(r.ok and r.attempts == 1 and r.status == 200 and r.event == "opened" for r in rows)


def test_dedup_holds_across_a_restart_on_the_same_store(platforms, store, make_dispatcher, tmp_path: Path, clock):
    incident = open_incident(store)
    assert make_dispatcher(configs(platforms)).notify(incident, "opened")
    # A new process: a new Store on the same database file and a new Dispatcher.
    reopened = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    try:
        again = make_dispatcher(configs(platforms), log=reopened)
        assert again.notify(incident, "opened") is True
        assert all(len(p.received) == 1 for p in platforms.values())
        # A state change is a new notification; the same state again is not.
        mitigating = store.set_state(incident.id, IncidentState.MITIGATING)
        assert again.notify(mitigating, "updated") and again.notify(mitigating, "updated")
        resolved = store.set_state(incident.id, IncidentState.RESOLVED)
        clock.tick(60)  # past the grouping window: the resolve goes out on its own
        assert again.notify(resolved, "resolved") and again.notify(resolved, "resolved")
    finally:
        reopened.close()
    assert all(len(p.received) == 3 for p in platforms.values())
    assert platforms["feishu"].bodies()[-1]["card"]["header"]["template"] == "green"


def test_a_storm_of_100_incidents_in_2_seconds_is_a_handful_of_messages(platforms, store, make_dispatcher, clock):
    dispatcher = make_dispatcher(configs(platforms), group_window_s=30.0)
    incidents = []
    for n in range(100):
        incidents.append(open_incident(store, n, severity=Severity.CRITICAL if n % 10 == 0 else Severity.WARNING))
        assert dispatcher.notify(incidents[-1], "opened")
        clock.tick(0.02)
    assert all(len(p.received) == 1 for p in platforms.values())  # the first at once, the rest wait
    assert set(dispatcher.pending().values()) == {99}
    clock.tick(30)
    assert dispatcher.flush()
    for kind, p in platforms.items():
        assert len(p.received) == 2, kind
        assert p.problems == [], (kind, p.problems)
        if kind != "webhook":
            text = digest_text(kind, p.bodies()[1])
            assert re.search(r"(?<!\d)89\W{0,3} more incidents", text), kind  # 99 grouped, 10 listed
            assert "/v1/incidents?state=open" in text
    webhook_digest = platforms["webhook"].bodies()[1]
    assert webhook_digest["event"] == "incident.digest" and len(webhook_digest["items"]) == 10
    assert webhook_digest["more"] == 89
    rows = _deliveries(store)
    assert len(rows) == 500 and all(r.ok for r in rows)  # every incident event recorded on every channel
    assert sum(1 for r in rows if r.detail.get("kind") == "digest") == 99 * 5


def test_what_the_rate_limit_holds_back_is_folded_into_the_next_digest(platforms, store, make_dispatcher, clock):
    slack = platforms["slack"]
    dispatcher = make_dispatcher(configs({"slack": slack}), group_window_s=0.0, rate_per_minute=4)
    incidents = [open_incident(store, n) for n in range(30)]
    for incident in incidents:
        dispatcher.notify(incident, "report_ready")  # not "opened": these are held by the rate limit alone
    assert len(slack.received) == 1 and dispatcher.pending() == {"slack": 29}
    assert dispatcher.flush() and len(slack.received) == 1  # no token yet: still held, nothing dropped
    clock.tick(20)  # (4 - 1) a minute: one token
    assert dispatcher.flush()
    assert len(slack.received) == 2 and dispatcher.pending() == {"slack": 0}
    text = digest_text("slack", slack.bodies()[1])
    assert "19* more incidents" in text and f"{PUBLIC_URL}/v1/incidents?state=open" in text
    assert slack.problems == []
    assert len(_deliveries(store)) == 30


def test_token_bucket_never_exceeds_the_platform_count_in_a_minute():
    bucket = TokenBucket(20, now=0.0)  # DingTalk and WeCom: 20 a minute
    sent = [t for t in (i * 0.5 for i in range(240)) if bucket.take(t)]  # offered every half second for 2 minutes
    for start in sent:
        assert sum(1 for t in sent if start <= t < start + 60) <= 20
    assert len(sent) >= 30  # and it does not starve either


def test_500_then_429_is_retried_with_backoff_and_retry_after(platforms, store, make_dispatcher, sleeps):
    slack = platforms["slack"]
    slack.script = [Reply(500, "internal_error"), Reply(429, SLACK_RATE_LIMITED, {"Retry-After": "3"})]
    dispatcher = make_dispatcher(configs({"slack": slack}), attempts=4, backoff_s=1.0)
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened") is True
    assert sleeps == [1.0, 3.0]  # doubled backoff would be 2 s; Slack asked for 3
    (row,) = _deliveries(store)
    assert row.ok and row.attempts == 3 and row.status == 200


def test_platform_error_codes_in_a_200_are_retried(platforms, store, make_dispatcher, sleeps):
    platforms["dingtalk"].script = [Reply(200, DINGTALK_TOO_FAST)]
    platforms["wecom"].script = [Reply(200, WECOM_FREQ)]
    platforms["slack"].script = [Reply(200, "rate_limited")]
    chosen = {k: platforms[k] for k in ("dingtalk", "wecom", "slack")}
    dispatcher = make_dispatcher(configs(chosen))
    assert dispatcher.notify(open_incident(store), "opened")
    rows = {r.channel: r for r in _deliveries(store)}
    assert {k: (r.ok, r.attempts) for k, r in rows.items()} == {k: (True, 2) for k in chosen}
    assert all(len(p.received) == 2 and p.problems == [] for p in chosen.values())


def test_permanent_refusals_are_not_retried_and_are_recorded(platforms, store, make_dispatcher, sleeps):
    platforms["wecom"].script = [Reply(200, WECOM_TOO_LONG)]
    platforms["slack"].script = [Reply(400, SLACK_INVALID_BLOCKS)]
    chosen = {k: platforms[k] for k in ("feishu", "wecom", "slack")}
    cfgs = configs(chosen, feishu={"secret": "rotated-away"})  # the group's bot has another secret now
    dispatcher = make_dispatcher(cfgs)
    assert dispatcher.notify(open_incident(store), "opened") is False
    rows = {r.channel: r for r in _deliveries(store)}
    assert all(not r.ok and r.attempts == 1 for r in rows.values()), rows
    assert rows["feishu"].detail["platform_code"] == "19021" and "sign match fail" in rows["feishu"].error
    assert rows["wecom"].detail["platform_code"] == "40058"
    assert rows["slack"].status == 400 and "invalid_blocks" in rows["slack"].error
    assert sleeps == []


def test_a_receiver_that_is_down_is_recorded_as_failed_and_nothing_is_raised(store, make_dispatcher, clock, sleeps):
    port = free_port()  # nothing listens there
    token = "TOKEN-THAT-MUST-NOT-LEAK"
    config = ChannelConfig(kind="dingtalk", url=f"http://127.0.0.1:{port}/robot/send?access_token={token}",
                           secret="SECx", name="team-dingtalk")
    dispatcher = make_dispatcher([config], attempts=3, backoff_s=0.5, cooldown_s=60)
    first, second = open_incident(store, 1), open_incident(store, 2)
    assert dispatcher.notify(first, "opened") is False
    (row,) = _deliveries(store)
    assert not row.ok and row.attempts == 3 and row.status is None and row.channel == "team-dingtalk"
    assert "ConnectError" in row.error and token not in row.error and str(port) not in row.error
    assert sleeps == [0.5, 1.0]
    # While it cools down, later events wait instead of costing the loop another retry sequence each.
    clock.tick(40)
    assert dispatcher.notify(second, "updated") is True
    assert len(_deliveries(store)) == 1 and dispatcher.pending() == {"team-dingtalk": 1}


def test_a_connection_dropped_mid_request_is_retried(platforms, store, make_dispatcher):
    platforms["feishu"].script = [Reply(drop=True)]
    dispatcher = make_dispatcher(configs({"feishu": platforms["feishu"]}))
    assert dispatcher.notify(open_incident(store), "opened")
    (row,) = _deliveries(store)
    assert row.ok and row.attempts == 2


def test_channel_filters_on_severity_and_category(platforms, store, make_dispatcher, clock):
    chosen = {k: platforms[k] for k in ("feishu", "wecom")}
    cfgs = configs(chosen, wecom={"min_severity": "critical", "categories": ["gpu_oom", "node_lost"]})
    dispatcher = make_dispatcher(cfgs, group_window_s=0)
    dispatcher.notify(open_incident(store, 1, severity=Severity.WARNING), "opened")
    dispatcher.notify(open_incident(store, 2, category=Category.DISK_FULL), "opened")
    clock.tick(60)
    dispatcher.notify(open_incident(store, 3), "opened")
    assert len(platforms["feishu"].received) == 3
    assert len(platforms["wecom"].received) == 1


def test_report_and_approval_notifications(platforms, store, make_dispatcher, clock):
    chosen = {k: platforms[k] for k in ("feishu", "slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), group_window_s=0)
    incident = open_incident(store)
    report = store.add_report(Report(
        id="", incident_id=incident.id, category=incident.category, confidence=0.95, generator="deterministic",
        summary="CUDA out of memory in the actor update; the job had 3.00 GiB to allocate", markdown="# r\n"))
    approve = ApprovalLink("act-0123456789ab", "drain_node", "10.0.0.3", f"{PUBLIC_URL}/ui/a?do=approve",
                           f"{PUBLIC_URL}/ui/a?do=reject")
    assert dispatcher.notify_report(incident, report)
    assert dispatcher.notify_report(incident, report)  # the same report: not again
    clock.tick(10)
    assert dispatcher.notify_approval(incident, [approve], report=report)
    for kind, p in chosen.items():
        assert len(p.received) == 2 and p.problems == [], (kind, p.problems)
    feishu_buttons = [e for e in platforms["feishu"].bodies()[1]["card"]["body"]["elements"] if e["tag"] == "button"]
    assert [(b["text"]["content"], b["behaviors"][0]["default_url"]) for b in feishu_buttons[:2]] == [
        ("Approve", approve.approve_url), ("Reject", approve.reject_url)]
    assert platforms["webhook"].bodies()[1]["approvals"][0]["approve"] == approve.approve_url
    assert platforms["webhook"].bodies()[0]["report_summary"].startswith("CUDA out of memory")


def test_a_broken_delivery_log_never_reaches_the_caller(platforms, store, make_dispatcher, tmp_path: Path):
    dispatcher = make_dispatcher(configs({"slack": platforms["slack"]}))
    incident = open_incident(store)
    with sqlite3.connect(tmp_path / "argus.db") as db:  # the table is gone: every store call fails
        db.execute("DROP TABLE notification_deliveries")
    assert dispatcher.notify(incident, "opened") is True  # delivered; only the record failed (and was logged)
    assert len(platforms["slack"].received) == 1


def test_unknown_events_are_refused_without_raising(platforms, store, make_dispatcher):
    dispatcher = make_dispatcher(configs({"slack": platforms["slack"]}))
    assert dispatcher.notify(open_incident(store), "exploded") is False
    assert platforms["slack"].received == []


def test_the_flusher_thread_sends_a_due_digest(platforms, store, make_dispatcher, clock):
    slack = platforms["slack"]
    dispatcher = make_dispatcher(configs({"slack": slack}), group_window_s=5)
    for n in range(3):
        dispatcher.notify(open_incident(store, n), "opened")
    assert len(slack.received) == 1
    dispatcher.start(interval_s=0.05)
    try:
        clock.tick(6)
        slack.receiver.wait_for(lambda item: "grouped" in str(item["body"]) or "incident notifications"
                                in str(item["body"]), timeout=10, what="the digest")
    finally:
        dispatcher.close()
    assert len(slack.received) == 2 and dispatcher.pending() == {"slack": 0}


def test_dispatcher_is_a_notifier():
    from core.ports import Notifier

    assert isinstance(Dispatcher([], _NoLog()), Notifier)


class _NoLog:
    """Only for the protocol check above: no delivery is made."""

    def record_delivery(self, **kw):
        raise AssertionError("not called")

    def delivery_sent(self, key):
        return False
