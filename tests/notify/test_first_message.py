"""A new incident is told in one message with its report and the steps that wait for approval: the opening waits
`first_message_wait_s` for them (they come a moment later from their own workers), and a report that finds the
opening still waiting in a digest joins it too. What comes after the opening left is told on its own. The five
platforms are real local receivers, the Store the real SQLite one, the clock moved by hand."""

from __future__ import annotations

from argus.notify.message import ApprovalLink
from argus.store.store import Store
from core.types import ActionState, Incident, IncidentState, Report
from tests.notify.conftest import CANNOT_RESUBMIT, KINDS, PUBLIC_URL, configs, open_incident, step
from tests.notify.platforms import digest_text

WAIT_S = 3.0
APPROVE = ApprovalLink("act-0123456789ab", "drain_node", "10.0.0.3", f"{PUBLIC_URL}/ui/a?do=approve",
                       f"{PUBLIC_URL}/ui/a?do=reject")


def report_of(store: Store, incident: Incident, summary: str = "CUDA out of memory in the actor update") -> Report:
    return store.add_report(Report(id="", incident_id=incident.id, category=incident.category, confidence=0.9,
                                   generator="deterministic", summary=summary, markdown="# r\n"))


def counts(platforms) -> set[int]:
    return {len(p.received) for p in platforms.values()}


def test_the_opening_waits_for_its_report_and_approvals_and_tells_them_in_one(platforms, store, make_dispatcher,
                                                                             clock):
    dispatcher = make_dispatcher(configs(platforms), first_message_wait_s=WAIT_S)
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened")
    assert counts(platforms) == {0} and set(dispatcher.pending().values()) == {1}
    clock.tick(0.5)
    assert dispatcher.notify_report(incident, report_of(store, incident))
    assert dispatcher.notify_approval(incident, [APPROVE])
    assert dispatcher.flush() and counts(platforms) == {0}  # still within the wait
    clock.tick(WAIT_S)
    assert dispatcher.flush() and counts(platforms) == {1}
    for kind, p in platforms.items():
        assert p.problems == [], (kind, p.problems)
        body = p.bodies()[0]
        if kind == "webhook":
            assert body["event"] == "incident.opened" and body["report_summary"].startswith("CUDA out of memory")
            assert body["approvals"][0]["approve"] == APPROVE.approve_url
            continue
        text = digest_text(kind, body)
        assert "CUDA out of memory in the actor update" in text and "drain_node" in text, kind
    rows = sorted((r for r in store.list_deliveries(incident_id=incident.id, limit=100) if r.channel == "slack"),
                  key=lambda r: r.id)
    assert sorted(r.event for r in rows) == ["approval_needed", "opened", "report_ready"]
    opened = next(r for r in rows if r.event == "opened")
    assert all(r.detail["folded_into"] == opened.key for r in rows if r is not opened)
    assert len(store.list_deliveries(incident_id=incident.id, limit=100)) == 3 * len(KINDS)

    # told: offering them again sends nothing; the resolve is the second and last message
    assert dispatcher.notify_report(incident, report_of(store, incident, "another"))  # a new report: its own message
    assert counts(platforms) == {2}
    assert dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED, by="argus:stall", reason="ok"),
                             "resolved")
    assert counts(platforms) == {3}


def test_without_a_report_the_opening_leaves_when_the_wait_ends_and_a_late_report_is_its_own(platforms, store,
                                                                                          make_dispatcher, clock):
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=WAIT_S)
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened")
    clock.tick(WAIT_S + 0.1)
    assert dispatcher.flush() and counts(chosen) == {1}
    assert "report_summary" not in chosen["webhook"].bodies()[0]
    assert dispatcher.notify_report(incident, report_of(store, incident))
    assert counts(chosen) == {2}


def test_a_report_joins_an_opening_waiting_in_a_storms_digest(platforms, store, make_dispatcher, clock):
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), group_window_s=30.0)  # no first-message wait: the digest holds it
    first, second = open_incident(store, 1), open_incident(store, 2)
    assert dispatcher.notify(first, "opened") and counts(chosen) == {1}
    assert dispatcher.notify(second, "opened") and counts(chosen) == {1}  # waits in the group window's digest
    assert dispatcher.notify_report(second, report_of(store, second, "host memory ran out on 10.0.0.3"))
    assert counts(chosen) == {1}
    clock.tick(31)
    assert dispatcher.flush() and counts(chosen) == {2}
    assert "host memory ran out on 10.0.0.3" in digest_text("slack", chosen["slack"].bodies()[1])


def test_close_sends_an_opening_still_waiting(platforms, store, make_dispatcher):
    chosen = {"slack": platforms["slack"]}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=60)
    assert dispatcher.notify(open_incident(store), "opened") and counts(chosen) == {0}
    dispatcher.close()
    assert counts(chosen) == {1}


def test_a_reopened_incident_is_not_held_as_a_first_message(platforms, store, make_dispatcher):
    chosen = {"slack": platforms["slack"]}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=60)
    incident = open_incident(store)
    assert dispatcher.notify(incident.model_copy(update={"attrs": {**incident.attrs, "reopened": 1}}), "opened")
    assert counts(chosen) == {1}


def test_a_resolve_within_the_wait_sends_the_opening_first(platforms, store, make_dispatcher, clock):
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=WAIT_S, group_window_s=0)
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened") and counts(chosen) == {0}
    clock.tick(1)
    assert dispatcher.notify(store.set_state(incident.id, IncidentState.RESOLVED, by="argus:stall"), "resolved")
    assert counts(chosen) == {2}
    assert [b["event"] for b in chosen["webhook"].bodies()] == ["incident.opened", "incident.resolved"]


def test_an_opening_leaves_once_its_report_and_plan_are_in_and_a_late_plan_is_waited_for(platforms, store,
                                                                                       make_dispatcher, clock):
    """The opening waits for what it was told to await, not a fixed time: a plan that takes longer than a few
    seconds (a loaded head, a slow Ray call) still joins it; once the report and the plan are in it leaves."""
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=60, group_window_s=0)
    awaits = frozenset({"report_ready", "planned"})
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened", awaits=awaits)
    assert dispatcher.notify_report(incident, report_of(store, incident))
    clock.tick(10)  # the report is in, the plan is not: it keeps waiting
    assert dispatcher.flush() and counts(chosen) == {0}
    assert dispatcher.notify_approval(incident, [APPROVE]) and counts(chosen) == {0}
    assert dispatcher.notify_planned(incident) and counts(chosen) == {1}  # all in: it leaves at once
    assert "drain_node" in digest_text("slack", chosen["slack"].bodies()[0])
    assert chosen["webhook"].bodies()[0]["approvals"][0]["approve"] == APPROVE.approve_url

    # a plan with nothing waiting releases it as well, and an opening whose plan never comes leaves at the limit
    quiet, lost = open_incident(store, 2), open_incident(store, 3)
    assert dispatcher.notify(quiet, "opened", awaits=awaits) and dispatcher.notify(lost, "opened", awaits=awaits)
    assert dispatcher.notify_report(quiet, report_of(store, quiet)) and dispatcher.notify_planned(quiet)
    assert counts(chosen) == {2}
    clock.tick(59)
    assert dispatcher.flush() and counts(chosen) == {2}
    clock.tick(1.5)
    assert dispatcher.flush() and counts(chosen) == {3}


def test_an_incident_merged_before_its_opening_left_is_not_told_at_all(platforms, store, make_dispatcher, clock):
    """Recorded in a soak: the job's line opened one incident, the GCS's line about the dead node another 0.8 s
    later, merged into the first a second after that; its opening waited in the storm's digest and left 30 s later
    about a fault already told (a third message for one fault). Merged before it left, it is not told at all; one
    merged after its opening left is told ended."""
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), group_window_s=30.0)
    job, node, later = open_incident(store, 1), open_incident(store, 2), open_incident(store, 3)
    assert dispatcher.notify(job, "opened") and counts(chosen) == {1}
    assert dispatcher.notify(node, "opened") and counts(chosen) == {1}  # waits in the group window's digest
    store.merge_into(node.id, job.id)
    assert dispatcher.notify(store.get_incident(node.id), "resolved")
    clock.tick(31)
    assert dispatcher.flush() and counts(chosen) == {1} and dispatcher.pending() == {"slack": 0, "webhook": 0}

    clock.tick(31)
    assert dispatcher.notify(later, "opened") and counts(chosen) == {2}  # its opening left at once
    store.merge_into(later.id, job.id)
    assert dispatcher.notify(store.get_incident(later.id), "resolved") and counts(chosen) == {3}
    ended = chosen["webhook"].bodies()[-1]
    assert ended["event"] == "incident.resolved" and f"merged into {job.id}" in str(ended)


def test_the_plan_is_told_in_the_opening_and_a_late_plan_on_its_own_once(platforms, store, make_dispatcher, clock):
    """The PLANNED event's steps, each with what it did or would do, or why not, are one line each in the opening;
    a plan that comes after the opening left is told on its own, once; an empty plan is not told."""
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=WAIT_S, group_window_s=0)
    plan = [step("keep_scene", preview="would keep the scene in /mnt/shared/jobs/grpo-7/scene/inc-1", n=0),
            step("resubmit_job", state=ActionState.SKIPPED, message=CANNOT_RESUBMIT, dry_run=False, n=1)]
    incident = open_incident(store)
    assert dispatcher.notify(incident, "opened", awaits=frozenset({"planned"})) and counts(chosen) == {0}
    assert dispatcher.notify_planned(incident, plan) and counts(chosen) == {1}  # all it awaited is in
    opening = chosen["webhook"].bodies()[0]
    assert opening["event"] == "incident.opened" and [s["kind"] for s in opening["steps"]] == ["keep_scene",
                                                                                              "resubmit_job"]
    assert "cannot be resubmitted safely" in opening["steps"][1]["text"]
    assert "resubmit_job (skipped): job raysubmit_AbCdEf123456 cannot be resubmitted safely" in digest_text(
        "slack", chosen["slack"].bodies()[0])
    assert dispatcher.notify_planned(incident, plan) and counts(chosen) == {1}  # told: not again

    late = open_incident(store, 1)
    assert dispatcher.notify(late, "opened")
    clock.tick(WAIT_S + 0.1)
    assert dispatcher.flush() and counts(chosen) == {2}
    assert dispatcher.notify_planned(late, plan) and counts(chosen) == {3}
    told = chosen["webhook"].bodies()[-1]
    assert told["event"] == "incident.planned" and "cannot be resubmitted safely" in told["steps"][1]["text"]
    assert "Remediation planned" in digest_text("slack", chosen["slack"].bodies()[-1])
    assert dispatcher.notify_planned(late, plan) and counts(chosen) == {3}
    assert dispatcher.notify_planned(open_incident(store, 2), []) and counts(chosen) == {3}  # nothing to tell


def test_a_storm_of_openings_leaves_nothing_parked_and_nothing_told_twice(platforms, store, make_dispatcher, clock):
    """Whether a message is already queued is one lookup in the lane's parked keys (a scan of the lane per offer made
    a storm's thousands of waiting openings cost their square): every key leaves that set when its message is sent
    or dropped, or it would be taken for queued forever."""
    chosen = {k: platforms[k] for k in ("slack", "webhook")}
    dispatcher = make_dispatcher(configs(chosen), first_message_wait_s=WAIT_S, group_window_s=30.0)
    incidents = [open_incident(store, n) for n in range(40)]
    for incident in incidents:
        assert dispatcher.notify(incident, "opened", awaits=frozenset({"report_ready"}))
    for incident in incidents[:10]:  # their reports join the openings still waiting
        assert dispatcher.notify_report(incident, report_of(store, incident, f"report of {incident.id}"))
    store.merge_into(incidents[39].id, incidents[0].id)  # merged before its opening left: dropped, never told
    assert dispatcher.notify(store.get_incident(incidents[39].id), "resolved")
    clock.tick(WAIT_S + 31)
    assert dispatcher.flush(force=True)
    assert dispatcher.pending() == {"slack": 0, "webhook": 0}
    assert all(not lane.parked for lane in dispatcher._lanes)
    posts = sum(len(p.received) for p in chosen.values())
    for incident in incidents[:39]:  # the same openings again: already told, so nothing is sent or parked
        assert dispatcher.notify(incident, "opened")
    assert dispatcher.flush(force=True) and sum(len(p.received) for p in chosen.values()) == posts
    assert all(not lane.parked for lane in dispatcher._lanes)
    for channel in chosen:  # the deliveries recorded: each opening once a channel; the merged one never
        told = [r.incident_id for r in store.list_deliveries(limit=1000)
                if r.channel == channel and r.event == "opened" and r.ok]
        assert sorted(told) == sorted(i.id for i in incidents[:39]), channel
