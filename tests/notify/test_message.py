"""The channel-neutral message: what it says, and what untrusted text becomes before any channel sees it."""

from __future__ import annotations

import pytest

from argus.notify.message import (
    DIGEST_LISTED_MAX,
    STEP_TEXT_MAX,
    STEPS_MAX,
    SUMMARY_MAX,
    ApprovalLink,
    approval_links_for,
    build_message,
    digest_of,
    untrusted,
)
from core.types import ActionState, Report, Severity
from tests.notify.conftest import CANNOT_RESUBMIT, FROM_CHECKPOINT, OOM, PUBLIC_URL, open_incident, step


@pytest.mark.parametrize(("raw", "shown"), [
    ("ping @all and @Here", "ping @\u2060all and @\u2060Here"),
    ("@所有人 看这里", "@\u2060所有人 看这里"),
    ("see https://evil.example/x", "see https:/\u200b/evil.example/x"),
    ("go to www.evil.example", "go to www\u200b.evil.example"),
    ("a\r\n# heading\n> quote\tb", "a # heading > quote b"),
    ("\u202egnp.exe\u202c \x1b[31mred\x00", "gnp.exe [31mred"),
    ("zero\u200bwidth already\u2060joined", "zerowidth alreadyjoined"),
    (None, ""),
])
def test_untrusted_text_is_cleaned(raw, shown):
    assert untrusted(raw, 200) == shown


def test_untrusted_text_is_bounded_cheaply():
    assert len(untrusted("x" * 10_000_000, 50)) == 50
    assert untrusted("abcdef", 4) == "abc…"


def test_message_carries_job_node_owner_links_and_state(store):
    incident = open_incident(store, 7)
    message = build_message(incident, "opened", public_url=PUBLIC_URL + "/")
    assert message.title == "Argus · Incident opened: gpu_oom on job raysubmit_0007 (owner alice)"
    assert (message.job, message.node, message.owner) == ("raysubmit_0007", "10.0.0.3", "alice")
    assert message.incident_url == f"{PUBLIC_URL}/v1/incidents/{incident.id}"
    assert message.report_url == f"{PUBLIC_URL}/v1/incidents/{incident.id}/report?format=markdown"
    assert (message.severity, message.category, message.state) == (Severity.CRITICAL, "gpu_oom", "open")
    assert message.summary == untrusted(OOM, SUMMARY_MAX)


def test_report_impact_fills_what_the_incident_lacks(store):
    incident = open_incident(store, 1, attrs={})
    report = Report(id="rep-1", incident_id=incident.id, category=incident.category, confidence=0.9, summary="why",
                    markdown="#", generator="deterministic",
                    data={"impact": {"job": "raysubmit_x", "owner": "bob", "nodes": ["10.0.0.4", "10.0.0.5"]}})
    message = build_message(incident, "report_ready", report=report)
    # the incident's own subject names the job; the report adds the owner and the nodes it lacks
    assert (message.job, message.node, message.owner, message.report_summary) == (
        "raysubmit_0001", "10.0.0.4, 10.0.0.5", "bob", "why")
    assert message.title.endswith("on job raysubmit_0001 (owner bob)")
    assert message.incident_url is None and message.report_url is None  # no public URL configured


def test_approval_links_that_are_not_plain_http_urls_are_dropped(store):
    incident = open_incident(store)
    good = ApprovalLink("act-1", "drain_node", "node-3", "https://a.example/ok", "https://a.example/no")
    bad = ApprovalLink("act-2", "stop_job", "j", "javascript:alert(1)", "https://a.example/no")
    spaced = ApprovalLink("act-3", "stop_job", "j", "https://a.example/x) [y](https://evil", "https://a.example/no")
    message = build_message(incident, "approval_needed", approvals=[good, bad, spaced])
    assert [a.action_id for a in message.approvals] == ["act-1"]


def test_unknown_event_is_refused(store):
    with pytest.raises(ValueError, match="unknown notification event 'exploded'"):
        build_message(open_incident(store), "exploded")


def test_digest_lists_approvals_then_the_most_severe_and_counts_the_rest(store):
    warnings = [build_message(open_incident(store, n, severity=Severity.WARNING), "opened") for n in range(12)]
    critical = build_message(open_incident(store, 50), "opened")
    approval = build_message(open_incident(store, 60, severity=Severity.INFO), "approval_needed")
    digest = digest_of([*warnings, critical, approval], PUBLIC_URL)
    assert digest.items[0] is approval and digest.items[1] is critical
    assert len(digest.items) == DIGEST_LISTED_MAX and digest.more == 4 and digest.total == 14
    assert digest.title == "14 incident notifications, 1 critical"
    assert digest.list_url == f"{PUBLIC_URL}/v1/incidents?state=open"


def test_approval_links_come_from_the_signed_link_service(store):
    from argus.approval_links import ApprovalLinks
    from core.types import Action, ActionState, Subject, SubjectKind

    incident = open_incident(store)
    action = store.add_action(Action(
        id="", incident_id=incident.id, kind="drain_node", target=Subject(kind=SubjectKind.NODE, id="n1", name="gpu-3"),
        state=ActionState.PLANNED, idempotency_key=f"{incident.id}:drain", requested_by="policy"))
    signer = ApprovalLinks(b"s" * 32, PUBLIC_URL, clock=lambda: 1_000_000.0)
    (link,) = approval_links_for([action], signer)
    assert (link.action_id, link.kind, link.target) == (action.id, "drain_node", "gpu-3")
    assert signer.check(action.id, "approve", 1_003_600, link.approve_url.rsplit("sig=", 1)[1]) is None
    message = build_message(incident, "approval_needed", approvals=[link], public_url=PUBLIC_URL)
    assert message.approvals == (link,)  # signed links pass the URL check untouched


def test_steps_are_told_one_line_each_by_their_outcome_or_else_their_preview(store):
    incident = open_incident(store)
    actions = [
        step("keep_scene", state=ActionState.SUCCEEDED, dry_run=False, message="scene kept in /s (9 files)",
             preview="would keep the scene in /s", n=0),
        step("resubmit_job", preview=FROM_CHECKPOINT, n=1),
        step("resubmit_job", state=ActionState.SKIPPED, message=CANNOT_RESUBMIT, preview="would ...", n=2),
        step("drain_node", dry_run=False, n=3),  # no preview came: the step and its status only
    ]
    message = build_message(incident, "planned", actions=actions)
    assert message.label == "Remediation planned"
    lines = [s.line() for s in message.steps]
    assert lines[0] == "keep_scene (succeeded): scene kept in /s (9 files)"
    assert lines[1] == "resubmit_job (dry run): " + FROM_CHECKPOINT
    # the reason a job cannot come back, its package URL defanged like every URL in a message
    assert lines[2] == "resubmit_job (dry run): " + untrusted(CANNOT_RESUBMIT, STEP_TEXT_MAX)
    assert "cannot be resubmitted safely: its runtime_env package gcs:/\u200b/_ray_pkg_" in lines[2]
    assert lines[3] == "drain_node (waits for approval)"
    # the opening waiting for its plan tells it
    opening = build_message(incident, "opened").telling(message)
    assert opening.event == "opened" and opening.steps == message.steps


def test_a_hostile_step_is_cleaned_cut_and_counted(store):
    hostile = "@all <at id=all></at> [x](https://evil.example) \u202eevil\r\n# heading " + "A" * 10_000
    actions = [step("resubmit_job", state=ActionState.SKIPPED, message=hostile, n=n) for n in range(STEPS_MAX + 3)]
    message = build_message(open_incident(store), "planned", actions=actions)
    assert len(message.steps) == STEPS_MAX and message.steps_more == 3
    text = message.steps[0].text
    assert len(text) == STEP_TEXT_MAX and text.endswith("…")
    assert "@all" not in text and "https://" not in text and "\u202e" not in text and "\n" not in text
