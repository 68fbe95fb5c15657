"""Each platform's payload, posted to a real local receiver that checks it against the documented format and
signature and answers as the platform does."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from argus.notify.delivery import deliver
from argus.notify.message import ApprovalLink, build_message, digest_of
from argus.notify.registry import build_channels
from argus.store.store import Store
from core.channels import ChannelConfig
from core.types import ActionState, Report, Severity
from tests.notify.conftest import (
    CANNOT_RESUBMIT,
    FROM_CHECKPOINT,
    KINDS,
    OOM,
    PUBLIC_URL,
    Clock,
    Sleeps,
    configs,
    open_incident,
    step,
)
from tests.notify.platforms import Platform, digest_text, feishu_markdown, texts
from tests.notify.test_event_schema import assert_valid_event

# Attack strings (not logs): every way a log line or an LLM could try to ping a whole group, plant a link or
# break the markup, around a real log line.
HOSTILE = (
    "@all @here @channel @everyone @所有人 <!channel> <!here> <@U024BE7LH> <at id=all></at> <at user_id=\"all\">x</at> "
    "<@wangqing> [click](https://evil.example/x) ![img](https://evil.example/i.png) <https://evil.example|login> "
    "<a href='https://evil.example'>a</a> <font color=\"warning\">fake</font> www.evil.example "
    "\u202egnp.exe\u202c \x1b[31mred\x1b[0m \x07\x08 zero\u200bwidth \r\n# heading\n> quote\n- list " + OOM
)
ONE_MB = "A" * (1024 * 1024)

MENTIONS = ["@all", "@here", "@channel", "@everyone", "@所有人", "<!channel>", "<!here>", "<@U024BE7LH>", "<at ",
            "<@wangqing>", "<a href", "<font color=\"warning\">fake"]
LINKS = ["https://evil.example", "](https", "<https", "www.evil"]


def _approval() -> ApprovalLink:
    return ApprovalLink("act-0123456789ab", "drain_node", "node-3",
                        f"{PUBLIC_URL}/ui/actions/act-0123456789ab?decision=approve",
                        f"{PUBLIC_URL}/ui/actions/act-0123456789ab?decision=reject")


def _plan():  # type: ignore[no-untyped-def]
    """A plan whose resubmit would bring one job back from its checkpoint and cannot bring another back."""
    return [step("keep_scene", preview="would keep the scene in /mnt/shared/jobs/grpo-7/scene/inc-1", n=0),
            step("resubmit_job", preview=FROM_CHECKPOINT, n=1),
            step("resubmit_job", state=ActionState.SKIPPED, message=CANNOT_RESUBMIT, dry_run=False, n=2)]


def _send(platform: Platform, item, clock: Clock, sleeps: Sleeps, client: httpx.Client, secret: str | None = "same"):
    config = ChannelConfig(kind=platform.kind, url=platform.url,
                           **({"secret": platform.secret if secret == "same" else secret} if platform.secret else {}))
    channel = build_channels([config])[0]
    return deliver(channel, item, client=client, clock=clock, sleep=sleeps)


@pytest.mark.parametrize("kind", KINDS)
def test_every_event_is_accepted_in_the_documented_format(kind, platforms, store: Store, clock, sleeps, client):
    platform = platforms[kind]
    incident = open_incident(store)
    report = store.add_report(Report(
        id="", incident_id=incident.id, category=incident.category, confidence=0.9, generator="deterministic",
        summary="GPU out of memory in the actor's forward pass", markdown="# report\n",
        data={"impact": {"job": "raysubmit_0000", "owner": "alice", "nodes": ["10.0.0.3"]}},
    ))
    items = [build_message(incident, event, report=report, approvals=[_approval()] if event == "approval_needed"
                           else None, public_url=PUBLIC_URL)
             for event in ("opened", "updated", "report_ready", "approval_needed", "resolved")]
    items.append(build_message(incident, "planned", actions=_plan(), public_url=PUBLIC_URL))
    items.append(build_message(incident, "step_finished", public_url=PUBLIC_URL, actions=[
        step("drain_node", state=ActionState.SUCCEEDED, message="node gpu-3 drained", dry_run=False)]))
    items.append(digest_of(items * 3, PUBLIC_URL))
    for item in items:
        outcome = _send(platform, item, clock, sleeps, client)
        assert outcome.ok, (outcome, platform.problems)
        assert outcome.attempts == 1
    assert platform.problems == []
    assert len(platform.received) == len(items)
    sent = json.dumps(platform.bodies(), ensure_ascii=False)
    assert f"{PUBLIC_URL}/v1/incidents/{incident.id}/report?format=markdown" in sent or kind == "webhook"
    assert "decision=approve" in sent and "decision=reject" in sent
    if kind == "webhook":  # every event the signed webhook sends is version 1 of the events' contract
        for body in platform.bodies():
            assert_valid_event(body)
    if kind != "webhook":
        assert re.search(r"(?<!\d)11\W{0,3} more incidents", sent)  # 21 items, 10 listed
        assert "CUDA out of memory" in json.dumps(platform.bodies()[-1], ensure_ascii=False)  # listed with its text


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_text_cannot_mention_link_or_overflow(kind, platforms, store: Store, clock, sleeps, client):
    platform = platforms[kind]
    hostile = open_incident(store, 1, summary=HOSTILE + ONE_MB,
                            attrs={"submission_id": "raysubmit_<!channel>", "owner": "@all <at id=all></at>",
                                   "node_ip": "[x](https://evil.example)"})
    # a step's own words quote Ray and the job's metadata: 10 kB of the same attack, on every step
    steps = [step("resubmit_job", state=ActionState.SKIPPED, message=HOSTILE + "B" * 10_000, dry_run=False, n=n)
             for n in range(8)]
    item = build_message(hostile, "opened", public_url=PUBLIC_URL, actions=steps)
    outcome = _send(platform, item, clock, sleeps, client)
    assert outcome.ok, (outcome, platform.problems)
    assert platform.problems == []
    (received,) = platform.received
    assert len(received["raw"]) < 64 * 1024  # 1 MB in, a bounded message out
    body = received["body"]
    if kind == "webhook":
        # The ops agent gets the incident as stored (JSON-escaped, for a program), only its summary cut.
        assert_valid_event(body)
        assert len(body["incident"]["summary"]) <= 16_000
        assert len(body["steps"]) == 6 and body["steps_more"] == 2
        for told in body["steps"]:
            assert len(told["text"]) <= 300 and "@all" not in told["text"] and "https://" not in told["text"]
        return
    rendered = [t for t in texts(body) if not t.startswith(("http://", "https://"))]
    joined = "\n".join(rendered)
    # Every link a client could follow is one of ours...
    assert all(url.startswith(PUBLIC_URL) for url in re.findall(r"https?://[^\s)\]|>\"']+", joined))
    # ...and with our own Markdown links taken out, nothing else can become one.
    joined = re.sub(r"\[[A-Za-z ]+\]\(" + re.escape(PUBLIC_URL) + r"[^)\s]*\)", "", joined)
    assert "torch.cuda.OutOfMemoryError: CUDA out of memory" in joined  # the log line itself still shows
    assert "resubmit_job (skipped)" in joined and "2 more steps" in joined  # the steps are told, cut
    # Slack's mrkdwn has no [text](url) links (its links are <url|text>, caught by "<https").
    links = [m for m in LINKS if not (kind == "slack" and m == "](https")]
    for marker in MENTIONS + links:
        assert marker not in joined, f"{kind} lets {marker!r} through"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e]", joined)
    if kind == "feishu":
        for md in feishu_markdown(body):  # untrusted text never reaches a Markdown component
            assert "raysubmit" not in md and "evil" not in md and "alice" not in md
    if kind == "slack":
        for t in rendered:
            assert "<" not in t and ">" not in t  # mrkdwn's only control characters, escaped
    if kind in ("dingtalk", "wecom"):
        md = body["markdown"].get("text") or body["markdown"].get("content")
        assert md.count("<font") == (1 if kind == "wecom" else 0)  # ours, on the severity
        assert "\n# heading" not in md and "\n> quote" not in md


def test_feishu_signature_is_checked_and_a_wrong_secret_is_not_retried(platforms, store, clock, sleeps, client):
    platform = platforms["feishu"]
    item = build_message(open_incident(store), "opened", public_url=PUBLIC_URL)
    outcome = _send(platform, item, clock, sleeps, client, secret="not-the-secret")
    assert not outcome.ok and outcome.code == "19021" and outcome.attempts == 1
    assert "sign match fail" in (outcome.error or "")
    assert platform.problems == ["sign"] and sleeps == []
    body = platform.received[0]["body"]
    assert set(body) >= {"timestamp", "sign"} and body["timestamp"].isdigit()


def test_dingtalk_signature_travels_url_encoded_in_the_query(platforms, store, clock, sleeps, client):
    platform = platforms["dingtalk"]
    item = build_message(open_incident(store), "opened", public_url=PUBLIC_URL)
    assert _send(platform, item, clock, sleeps, client).ok
    path = platform.received[0]["path"]
    assert re.search(r"[?&]timestamp=\d{13}&sign=[^&]+$", path) and "access_token=tok123" in path
    bad = _send(platform, item, clock, sleeps, client, secret="SECwrong")
    assert not bad.ok and bad.code == "310000" and bad.attempts == 1


def test_generic_webhook_is_signed_over_the_raw_body(platforms, store, clock, sleeps, client):
    platform = platforms["webhook"]
    item = build_message(open_incident(store), "opened", public_url=PUBLIC_URL)
    assert _send(platform, item, clock, sleeps, client).ok
    headers = {k.lower(): v for k, v in platform.received[0]["headers"].items()}
    assert headers["x-argus-signature"].startswith("sha256=") and len(headers["x-argus-signature"]) == 71
    assert str(platform.received[0]["body"]["sent_at"]) == headers["x-argus-timestamp"]
    bad = _send(platform, item, clock, sleeps, client, secret="wrong")
    assert not bad.ok and bad.status == 401 and bad.attempts == 1  # a 4xx is the receiver's verdict: no retry


def test_wecom_content_stays_within_4096_bytes_of_chinese_text(platforms, store, clock, sleeps, client):
    platform = platforms["wecom"]
    chinese = "显存不足：训练进程在第 1200 步被终止，" * 400  # 3 bytes a character in UTF-8
    steps = [step("resubmit_job", state=ActionState.SKIPPED, message=chinese, n=n) for n in range(6)]
    items = [build_message(open_incident(store, n, summary=chinese), "opened", public_url=PUBLIC_URL, actions=steps)
             for n in range(12)]
    for item in (items[0], digest_of(items, PUBLIC_URL)):
        assert _send(platform, item, clock, sleeps, client).ok
    assert platform.problems == []
    for body in platform.bodies():
        assert len(body["markdown"]["content"].encode()) <= 4096


def test_resolved_is_green_and_severity_picks_the_feishu_header_colour(platforms, store, clock, sleeps, client):
    platform = platforms["feishu"]
    warning = open_incident(store, 1, severity=Severity.WARNING)
    critical = open_incident(store, 2)
    for incident, event in ((warning, "opened"), (critical, "opened"), (critical, "resolved")):
        assert _send(platform, build_message(incident, event, public_url=PUBLIC_URL), clock, sleeps, client).ok
    assert [b["card"]["header"]["template"] for b in platform.bodies()] == ["orange", "red", "green"]


def test_channels_without_a_public_url_send_no_link_buttons(platforms, store, clock, sleeps, client):
    item = build_message(open_incident(store), "opened", public_url=None)
    for kind in ("feishu", "slack"):
        assert _send(platforms[kind], item, clock, sleeps, client).ok
    feishu, slack = platforms["feishu"].bodies()[0], platforms["slack"].bodies()[0]
    assert not [e for e in feishu["card"]["body"]["elements"] if e["tag"] == "button"]
    assert not [b for b in slack["blocks"] if b["type"] == "actions"]


def test_configs_name_the_problem_without_echoing_the_url():
    with pytest.raises(ValueError, match="must start with http") as err:
        ChannelConfig(kind="dingtalk", url="oapi.dingtalk.com/robot/send?access_token=SECRETTOKEN")
    assert "SECRETTOKEN" not in str(err.value)
    with pytest.raises(ValueError, match="no signing scheme"):
        ChannelConfig(kind="wecom", url="https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k", secret="s")
    with pytest.raises(ValueError, match="channel name"):
        ChannelConfig(kind="slack", url="https://hooks.slack.com/services/T/B/x", name="bad name!")
    assert ChannelConfig(kind="slack", url="https://hooks.slack.com/services/T/B/x").name == "slack"


def test_channel_names_must_be_unique(platforms):
    from core.errors import ConfigError

    twice = configs(platforms)[:1] * 2
    with pytest.raises(ConfigError, match="two notify channels are named 'feishu'"):
        build_channels(twice)


def test_slack_text_is_cut_after_escaping_without_splitting_an_entity():
    from argus.notify.slack import mrkdwn

    assert mrkdwn("a<b" * 100, 20) == "a&lt;ba&lt;ba&lt;ba…"
    assert len(mrkdwn("<" * 1000, 3000)) == 2997 and mrkdwn("<" * 1000, 3000).endswith("&lt;…")
    assert mrkdwn("hello", 200) == "hello"


@pytest.mark.parametrize("kind", KINDS)
def test_why_a_job_cannot_be_resubmitted_and_where_another_resumes_reach_every_channel(kind, platforms, store, clock,
                                                                                       sleeps, client):
    platform = platforms[kind]
    item = build_message(open_incident(store), "opened", public_url=PUBLIC_URL, actions=_plan())
    assert _send(platform, item, clock, sleeps, client).ok and platform.problems == []
    body = platform.bodies()[0]
    if kind == "webhook":
        told = {s["action_id"]: s for s in body["steps"]}
        assert told["act-000000000001"]["status"] == "dry run"
        assert told["act-000000000001"]["text"].startswith("would resubmit grpo-7 as grpo-7-r1 from checkpoint "
                                                           "global_step_40 (step 40)")
        assert told["act-000000000002"]["status"] == "skipped"
        assert "cannot be resubmitted safely: its runtime_env package" in told["act-000000000002"]["text"]
        return
    text = digest_text(kind, body)
    assert "Remediation" in text
    assert "resubmit_job (dry run): would resubmit grpo-7 as grpo-7-r1 from checkpoint global_step_40 (step 40)" \
        in text
    assert ("resubmit_job (skipped): job raysubmit_AbCdEf123456 cannot be resubmitted safely: its runtime_env "
            "package gcs:") in text
    assert "is gone from the GCS" in text
