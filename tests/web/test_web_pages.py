"""The web page over a real SQLite store, through FastAPI's TestClient: who sees what, who may post what,
sessions (login, logout, revoked tokens, tampered and expired cookies), CSRF, hostile input, and that
text from incidents, reports and logs is always shown as text.

One file past 400 lines on purpose: the pages share one site fixture and one table of who may do what."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from argus.store.tokens import Role, allows
from argus.web import ROUTERS
from argus.web.sessions import LoginThrottle, Sessions
from argus.web.ui import WebUi
from core.types import (
    ActionState,
    Category,
    Evidence,
    Finding,
    IncidentState,
    Report,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
)
from tests.web.conftest import NODE_IP, SID, TOKEN_NAMES, Site, build_site, csrf_of, login

ROLES = (Role.VIEWER, Role.OPERATOR, Role.AGENT, Role.ADMIN)
INC = "{incident_id}"
# Every UI route and the role it needs (None: open). The first test fails when a route is missing here, so a
# new page or form cannot ship without a decision about who may use it.
UI_ROUTES: dict[str, Role | None] = {
    "GET /": None,
    "GET /ui": None,
    "GET /ui/": None,
    "GET /ui/login": None,
    "POST /ui/login": None,
    "GET /ui/{rest:path}": None,
    "POST /ui/logout": Role.VIEWER,
    "GET /ui/incidents": Role.VIEWER,
    "GET /ui/incidents/{incident_id}": Role.VIEWER,
    "GET /ui/incidents/{incident_id}/report.md": Role.VIEWER,
    "GET /ui/incidents/{incident_id}/report.json": Role.VIEWER,
    "POST /ui/incidents/{incident_id}/actions/{action_id}/approve": Role.OPERATOR,
    "POST /ui/incidents/{incident_id}/actions/{action_id}/reject": Role.OPERATOR,
    "POST /ui/incidents/{incident_id}/resolve": Role.OPERATOR,
    "GET /ui/nodes": Role.VIEWER,
    "GET /ui/nodes/{name}": Role.VIEWER,
    "GET /ui/jobs": Role.VIEWER,
}
PAGES = ["/ui/incidents", f"/ui/incidents/{INC}", f"/ui/incidents/{INC}/report.md", f"/ui/incidents/{INC}/report.json",
         "/ui/nodes", "/ui/nodes/gpu-07", "/ui/jobs"]


def client_for(site: Site, role: Role | None, **kwargs) -> TestClient:  # type: ignore[no-untyped-def]
    client = TestClient(site.app, raise_server_exceptions=False, **kwargs)
    if role is not None:
        response = login(client, site.tokens[role])
        assert response.status_code == 303, response.text
    return client


def page_of(site: Site, path: str) -> str:
    return path.replace(INC, site.incident_id)


def ui_routes() -> set[str]:
    return {f"{m} {r.path}" for router in ROUTERS for r in router.routes if isinstance(r, APIRoute) for m in r.methods}


def test_every_ui_route_has_a_role_and_the_matrix_holds(site: Site) -> None:
    assert ui_routes() == set(UI_ROUTES), "a UI route has no entry in UI_ROUTES (or one is stale)"
    assert not any(p == "/" or p.startswith("/ui") for p in site.app.openapi()["paths"]), "the UI is in the API schema"
    anonymous = client_for(site, None)
    planned = site.step("drain_node").id
    for key, need in UI_ROUTES.items():
        if need is None:
            continue
        method, template = key.split(" ")
        path = (template.replace(INC, "inc-000000000000").replace("{action_id}", planned)
                .replace("{name}", "gpu-07"))
        if method == "GET":
            response = anonymous.get(path, follow_redirects=False)
            assert response.status_code == 303 and response.headers["location"].startswith("/ui/login?next="), key
        else:
            assert anonymous.post(path, data={"reason": "x"}).status_code == 401, key
        for role in ROLES:
            client = client_for(site, role)
            if method == "GET":
                status = client.get(path.replace("inc-000000000000", site.incident_id)).status_code
                assert status == 200 or (path == "/ui/jobs" and status == 503), f"{key} as {role.value}: {status}"
                continue
            csrf = csrf_of(client.get("/ui/incidents").text)
            status = client.post(path, data={"csrf": csrf, "reason": "matrix"}, follow_redirects=False).status_code
            if allows(role, need):
                assert status not in (401, 403), f"{key} as {role.value}: {status}"
            else:
                assert status == 403, f"{key} as {role.value}: {status}"
    assert site.store.get_action(planned).state is ActionState.PLANNED  # every post above named a ghost incident


def test_anonymous_is_sent_to_the_login_page_and_back(site: Site) -> None:
    client = client_for(site, None)
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/incidents"
    target = page_of(site, f"/ui/incidents/{INC}")
    response = client.get(target, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"/ui/login?next={quote(target, safe='')}"
    form = client.get(response.headers["location"])
    assert form.status_code == 200 and 'type="password"' in form.text and f'value="{target}"' in form.text
    done = login(client, site.tokens[Role.VIEWER], next_page=target)
    assert done.status_code == 303 and done.headers["location"] == target
    cookie = done.headers["set-cookie"]
    assert "argus_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/ui" in cookie and "Secure" not in cookie  # plain http here; see the https test
    assert client.get(target).status_code == 200
    assert client.get("/ui/login", follow_redirects=False).status_code == 303  # logged in already
    [record] = [r for r in site.store.list_audit() if r.path == "/ui/login"]
    assert (record.actor, record.role, record.outcome, record.detail) == (
        "view-bob", "viewer", "ok", {"via": "ui", "event": "login"})


def test_the_session_cookie_is_secure_over_https(site: Site) -> None:
    client = TestClient(site.app, base_url="https://argus.example", raise_server_exceptions=False)
    response = login(client, site.tokens[Role.VIEWER])
    assert response.status_code == 303 and "Secure" in response.headers["set-cookie"]


def test_every_page_renders_for_a_viewer_who_sees_no_buttons(site: Site) -> None:
    client = client_for(site, Role.VIEWER)
    for path in PAGES:
        response = client.get(page_of(site, path))
        expected = 503 if path == "/ui/jobs" else 200  # Ray does not answer: a message, not an error
        assert response.status_code == expected, (path, response.text[:500])
        if path.endswith(".md") or path.endswith(".json"):
            continue
        assert "Content-Security-Policy" in response.headers and response.headers["Cache-Control"] == "no-store"
        assert "view-bob" in response.text and "viewer" in response.text
    incident = client.get(page_of(site, f"/ui/incidents/{INC}")).text
    assert ">Approve<" not in incident and ">Reject<" not in incident and ">Resolve<" not in incident
    assert "/approve" not in incident and "/reject" not in incident
    for step in site.actions:
        assert re.search(f'data-action="{step.id}".*?data-state="(\\w+)"', incident, re.S).group(1) == "planned"
    # the report, the evidence and the timeline are there
    assert "<h2>Summary</h2>" in incident and "node_lost" in incident and "missing too many heartbeats" in incident
    assert "Argus opened the incident" in incident and "keep_scene planned by policy" in incident
    jobs = client.get("/ui/jobs").text
    assert "Jobs cannot be listed now" in jobs and "cannot reach" in jobs
    nodes = client.get("/ui/nodes").text
    assert "gpu-07" in nodes and "argus.io/zone=a" in nodes and "draining" in nodes and "Ray's view" in nodes
    assert "cannot reach Ray state API" in nodes and "lost heartbeats" in client.get("/ui/nodes/gpu-07").text
    markdown = client.get(page_of(site, f"/ui/incidents/{INC}/report.md"))
    assert markdown.headers["content-type"].startswith("text/plain") and markdown.text.startswith("# node_lost")
    assert client.get(page_of(site, f"/ui/incidents/{INC}/report.json")).json()["category"] == "node_lost"


def test_without_a_control_plane_nodes_come_from_the_store_and_jobs_say_what_to_configure(tmp_path: Path) -> None:
    site = build_site(tmp_path, with_control=False)
    try:
        client = client_for(site, Role.VIEWER)
        nodes = client.get("/ui/nodes")
        assert nodes.status_code == 200 and "gpu-08" in nodes.text and "no control plane" in nodes.text
        jobs = client.get("/ui/jobs")
        assert jobs.status_code == 503 and "argus serve" in jobs.text
    finally:
        site.store.close()


def test_the_jobs_page_shows_the_queue_while_ray_is_down_and_a_user_sees_their_own(site: Site) -> None:
    from control.admission import Gang
    from control.queue import QueueEntry, QueueState

    now = datetime.now(timezone.utc)
    for sid, owner, state in (("grpo-alice", "alice", QueueState.QUEUED), ("sft-bob", "bob", QueueState.QUEUED),
                              ("huge-alice", "alice", QueueState.EXPIRED)):
        site.store.job_queue.add(QueueEntry(
            position=0, submission_id=sid, owner=owner, gang=Gang(2, 8, "h20"), request={"spec": {}}, state=state,
            enqueued_at=now, reason=f"waiting for 2 nodes × 8 GPUs in pool h20: {sid} has no room"))
    viewer = client_for(site, Role.VIEWER).get("/ui/jobs")
    assert viewer.status_code == 503 and "Jobs cannot be listed now" in viewer.text  # Ray's list: not reachable
    assert all(sid in viewer.text for sid in ("grpo-alice", "sft-bob", "huge-alice"))  # the queue: from the store
    assert "2 waiting for their gang to fit" in viewer.text and "grpo-alice has no room" in viewer.text
    assert "job-queued" in viewer.text and "EXPIRED" in viewer.text
    user = TestClient(site.app, raise_server_exceptions=False)
    assert login(user, site.store.create_token("alice", Role.USER, created_by="tests")[1]).status_code == 303
    mine = user.get("/ui/jobs").text
    assert "grpo-alice" in mine and "huge-alice" in mine and "sft-bob" not in mine


def test_a_training_anomaly_shows_the_series_that_fired_as_a_small_chart(site: Site) -> None:
    from argus.web.render import sparkline
    from detectors.training_health import TrainingHealthDetector

    detector = TrainingHealthDetector()
    found = []
    for step in range(1, 31):
        norm = "nan" if step == 30 else f"{1 + step / 100:.3f}"
        found += detector.detect([Signal(kind=SignalKind.LOG_LINE, source="/shared/jobs/grpo-9/logs/train.log",
                                         text=f"step:{step} - actor/grad_norm:{norm}",
                                         subject=Subject(kind=SubjectKind.JOB, id="grpo-9"))])
    [finding] = found
    incident, _ = site.store.record_finding(finding)
    html = client_for(site, Role.VIEWER).get(f"/ui/incidents/{incident.id}").text
    assert '<figure class="spark"><svg' in html and 'class="spark-bad"' in html
    assert "grad_norm, steps 11–30 (red: not a number)" in html
    # whatever the attrs hold, only numbers are drawn
    assert sparkline([[1, "<script>"], [2, 1.0], "x", [None, 3]], "<b>") == sparkline([[1, "nan"], [2, 1.0]], "<b>")
    assert "<b>" not in sparkline([[1, 0.5], [2, 1.0]], "<b>") and sparkline("junk") == ""


def test_without_remediation_steps_are_shown_and_not_decided(site: Site) -> None:
    from argus.api.app import create_app

    bare = Site(store=site.store, app=create_app(store=site.store), remediator=site.remediator, shared=site.shared,
                incident_id=site.incident_id, actions=site.actions, tokens=site.tokens)
    client = client_for(bare, Role.OPERATOR)
    html = client.get(f"/ui/incidents/{site.incident_id}").text
    assert "Remediation is not running" in html and ">Approve<" not in html and ">Resolve<" in html
    step = site.step("keep_scene")
    response = client.post(f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve", data={"csrf": csrf_of(html)})
    assert response.status_code == 503 and "argus serve" in response.text
    assert site.store.get_action(step.id).state is ActionState.PLANNED


def test_an_operator_approves_a_step_and_the_audit_log_names_the_token(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    url = page_of(site, f"/ui/incidents/{INC}")
    html = client.get(url).text
    step = site.step("keep_scene")
    action = f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve"
    assert f'action="{action}"' in html and ">Resolve<" in html
    response = client.post(action, data={"csrf": csrf_of(html)}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"{url}?changed={step.id}"
    approved = site.store.get_action(step.id)
    assert approved.state is ActionState.APPROVED and approved.result["approved_by"] == "op-alice"
    after = client.get(response.headers["location"]).text
    assert f"Step keep_scene ({step.id}) is approved." in after and f'action="{action}"' not in after
    [record] = [r for r in site.store.list_audit() if r.path == action]
    assert (record.actor, record.role, record.method, record.status, record.outcome) == (
        "op-alice", "operator", "POST", 303, "ok")
    assert record.detail["via"] == "ui" and record.detail["kind"] == "keep_scene"
    assert step.id in (record.target or "")
    # approving again is a conflict the page explains, and the audit log says it was rejected
    again = client.post(action, data={"csrf": csrf_of(html)}, follow_redirects=False)
    assert again.status_code == 409 and "is approved, not planned" in again.text
    assert site.store.list_audit()[0].outcome == "rejected"


def test_reject_and_resolve_need_a_reason_and_record_it(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    url = page_of(site, f"/ui/incidents/{INC}")
    csrf = csrf_of(client.get(url).text)
    step = site.step("drain_node")
    reject = f"/ui/incidents/{site.incident_id}/actions/{step.id}/reject"
    assert client.post(reject, data={"csrf": csrf, "reason": "  "}).status_code == 400
    assert client.post(reject, data={"csrf": csrf, "reason": "x" * 501}).status_code == 400
    assert site.store.get_action(step.id).state is ActionState.PLANNED
    done = client.post(reject, data={"csrf": csrf, "reason": "the node came back"}, follow_redirects=False)
    assert done.status_code == 303
    rejected = site.store.get_action(step.id)
    assert rejected.state is ActionState.REJECTED and rejected.result["rejected_by"] == "op-alice"
    assert "rejected by op-alice: the node came back" in client.get(done.headers["location"]).text
    resolve = f"/ui/incidents/{site.incident_id}/resolve"
    done = client.post(resolve, data={"csrf": csrf, "reason": "fixed by hand"}, follow_redirects=False)
    assert done.status_code == 303 and site.store.get_incident(site.incident_id).state is IncidentState.RESOLVED
    page = client.get(done.headers["location"]).text
    assert "The incident is resolved." in page and ">Resolve<" not in page
    assert site.app.state.incidents.events.drain(10)  # people are told, as by the API's resolve
    assert [(e.kind.value, e.detail) for e in site.told.events] == [
        ("resolved", {"by": "op-alice", "reason": "fixed by hand"})]


def test_a_viewer_cannot_approve_even_with_a_good_csrf_token(site: Site) -> None:
    client = client_for(site, Role.VIEWER)
    csrf = csrf_of(client.get("/ui/incidents").text)  # the logout form's: a valid token of this session
    step = site.step("keep_scene")
    response = client.post(f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve", data={"csrf": csrf})
    assert response.status_code == 403 and "needs operator" in response.text and "<html" in response.text
    assert site.store.get_action(step.id).state is ActionState.PLANNED
    record = site.store.list_audit()[0]
    assert (record.actor, record.role, record.outcome) == ("view-bob", "viewer", "refused")


def test_the_agent_may_approve_only_what_the_policy_lets_it(site: Site) -> None:
    client = client_for(site, Role.AGENT)
    html = client.get(page_of(site, f"/ui/incidents/{INC}")).text
    keep, drain = site.step("keep_scene"), site.step("drain_node")
    assert f"/actions/{keep.id}/approve" in html and f"/actions/{drain.id}/approve" not in html
    response = client.post(f"/ui/incidents/{site.incident_id}/actions/{drain.id}/approve", data={"csrf": csrf_of(html)})
    assert response.status_code == 403 and site.store.get_action(drain.id).state is ActionState.PLANNED


def test_a_missing_or_wrong_csrf_token_is_refused(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    other = client_for(site, Role.ADMIN)
    step = site.step("keep_scene")
    path = f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve"
    foreign = csrf_of(other.get("/ui/incidents").text)  # another session's token
    for data in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": foreign}, {"csrf": "x" * 5000}):
        response = client.post(path, data=data)
        assert response.status_code == 403 and "CSRF" in response.text, data
    assert client.post("/ui/logout", data={}).status_code == 403
    assert site.store.get_action(step.id).state is ActionState.PLANNED


def test_hostile_forms_are_refused_with_a_message(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    csrf = csrf_of(client.get("/ui/incidents").text)
    step = site.step("keep_scene")
    path = f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve"
    as_json = client.post(path, json={"csrf": csrf})
    assert as_json.status_code == 400 and "x-www-form-urlencoded" in as_json.text
    twice = client.post(path, content=f"csrf={csrf}&csrf={csrf}",
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert twice.status_code == 400 and "more than once" in twice.text
    big = client.post(path, data={"csrf": csrf, "pad": "x" * 20_000})
    assert big.status_code == 400 and "bytes" in big.text
    many = client.post(path, content="&".join(f"f{i}=1" for i in range(50)),
                       headers={"content-type": "application/x-www-form-urlencoded"})
    assert many.status_code == 400
    latin = client.post(path, content=b"csrf=\xff\xfe", headers={"content-type": "application/x-www-form-urlencoded"})
    assert latin.status_code == 400
    other = f"/ui/incidents/inc-000000000000/actions/{step.id}/approve"
    assert client.post(other, data={"csrf": csrf}).status_code == 404
    assert site.store.get_action(step.id).state is ActionState.PLANNED


def test_bad_and_hostile_query_params_and_ids_get_a_page_not_a_500(site: Site) -> None:
    client = client_for(site, Role.VIEWER)
    cases = {
        "/ui/incidents?state=bogus": (400, "is not one of: open, mitigating, resolved"),
        "/ui/incidents?category=%3Cscript%3E": (400, "is not one of"),
        "/ui/incidents?severity=fatal": (400, "severity"),
        "/ui/incidents?state=open&state=resolved": (400, "give it once"),
        "/ui/incidents?page=0": (400, "page"),
        "/ui/incidents?page=abc": (400, "page"),
        "/ui/incidents?page=99999999999999999999": (400, "page"),
        "/ui/incidents?colour=red": (400, "unknown filter"),
        f"/ui/incidents?subject={'x' * 300}": (400, "at most 256"),
        "/ui/incidents/%3Cscript%3Ealert(1)": (400, "is not an incident id"),
        "/ui/incidents/%3Cscript%3Ealert(1)%3C%2Fscript%3E": (404, "no such page"),
        f"/ui/incidents/{'a' * 65}": (400, "is not an incident id"),
        "/ui/incidents/inc-000000000000": (404, "does not exist"),
        "/ui/incidents/inc-000000000000/report.md": (404, "does not exist"),
        "/ui/nodes/GPU%2007": (400, "is not a node name"),
        "/ui/nodes/ghost": (404, "no node named"),
        "/ui/jobs?all=yes": (400, "all must be 0 or 1"),
        "/ui/no/such/page": (404, "no such page"),
    }
    for path, (status, text) in cases.items():
        response = client.get(path)
        assert response.status_code == status, (path, response.status_code, response.text[:300])
        assert text in response.text and response.headers["content-type"].startswith("text/html"), path
        assert "<script>" not in response.text, path
    hostile = client.get("/ui/incidents/%3Cscript%3Ealert(1)").text
    assert "&#39;&lt;script&gt;alert(1)&#39; is not an incident id" in hostile


def test_filters_paging_and_counts(site: Site) -> None:
    for n in range(60):
        severity = Severity.INFO if n % 3 else Severity.WARNING
        site.store.record_finding(Finding(category=Category.IDLE_GPU, reason="IdleGpus", severity=severity,
                                          subject=Subject(kind=SubjectKind.JOB, id=f"job-{n:02d}"),
                                          summary=f"job-{n:02d} holds idle GPUs"))
    client = client_for(site, Role.VIEWER)
    first = client.get("/ui/incidents", params={"category": "idle_gpu"}).text
    assert first.count('class="summary-link"') == 50 and "older →" in first and "page=2" in first
    second = client.get("/ui/incidents", params={"category": "idle_gpu", "page": 2}).text
    assert second.count('class="summary-link"') == 10 and "← newer" in second and "older →" not in second
    warning = client.get("/ui/incidents", params={"severity": "warning"}).text
    assert warning.count('class="summary-link"') == 20 and "<code>node_lost</code>" not in warning
    critical = client.get("/ui/incidents", params={"severity": "critical"}).text
    assert critical.count('class="summary-link"') == 1
    counts = re.findall(r'class="count">([^<]+)<', client.get("/ui/incidents").text)
    assert counts == ["61", "0", "0"]
    one = client.get("/ui/incidents", params={"subject": "job-07"}).text
    assert one.count('class="summary-link"') == 1 and "job-07 holds idle GPUs" in one
    empty = client.get("/ui/incidents", params={"state": "resolved"})
    assert empty.status_code == 200 and "No incidents match." in empty.text


def test_revoking_the_token_ends_the_session(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    csrf = csrf_of(client.get("/ui/incidents").text)
    site.store.revoke_token(TOKEN_NAMES[Role.OPERATOR])
    response = client.get("/ui/incidents", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"].startswith("/ui/login")
    step = site.step("keep_scene")
    post = client.post(f"/ui/incidents/{site.incident_id}/actions/{step.id}/approve", data={"csrf": csrf})
    assert post.status_code == 401 and site.store.get_action(step.id).state is ActionState.PLANNED
    assert login(client, site.tokens[Role.OPERATOR]).status_code == 401  # nor can it log in again


def test_tampered_and_foreign_cookies_are_no_session(site: Site) -> None:
    client = client_for(site, Role.OPERATOR)
    good = client.cookies.get("argus_session")
    token_id, expires, nonce, sig = good.split(".")
    admin_id = next(t.id for t in site.store.list_tokens() if t.role is Role.ADMIN)
    forged = [
        f"{token_id}.{expires}.{nonce}.{'0' * 64}",  # signature changed
        f"{admin_id}.{expires}.{nonce}.{sig}",  # another token's id under this signature
        f"{token_id}.{int(expires) + 10**6}.{nonce}.{sig}",  # expiry pushed out
        f"{token_id}.{expires}.{nonce}.{sig}x",
        "garbage", "", "a" * 5000, good.replace(".", ";"),
    ]
    other = TestClient(build_other_app(site), raise_server_exceptions=False)
    foreign = login(other, site.tokens[Role.OPERATOR]).cookies.get("argus_session")  # signed with another secret
    forged.append(foreign)
    for cookie in forged:
        probe = TestClient(site.app, raise_server_exceptions=False, cookies={"argus_session": cookie})
        response = probe.get("/ui/incidents", follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"].startswith("/ui/login"), cookie[:80]


def build_other_app(site: Site):  # type: ignore[no-untyped-def]
    from argus.api.app import create_app

    return create_app(store=site.store)  # a second Argus on the same store: its own session secret


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def test_sessions_expire_and_never_outlive_their_token(site: Site) -> None:
    clock = Clock()
    site.app.state.web = WebUi(Sessions(b"k" * 32, ttl_s=3600, clock=clock), clock=clock)
    client = TestClient(site.app, raise_server_exceptions=False)
    assert "Max-Age=3600" in login(client, site.tokens[Role.VIEWER]).headers["set-cookie"]
    assert client.get("/ui/incidents").status_code == 200
    clock.now += timedelta(seconds=3599)
    assert client.get("/ui/incidents").status_code == 200
    clock.now += timedelta(seconds=2)
    assert client.get("/ui/incidents", follow_redirects=False).status_code == 303
    # a token that expires in ten minutes gets a session of ten minutes
    soon = datetime.now(timezone.utc) + timedelta(minutes=10)
    _, token = site.store.create_token("short-lived", Role.VIEWER, created_by="tests", expires_at=soon)
    clock.now = datetime.now(timezone.utc)
    fresh = TestClient(site.app, raise_server_exceptions=False)
    response = login(fresh, token)
    max_age = int(re.search(r"Max-Age=(\d+)", response.headers["set-cookie"]).group(1))
    assert 0 < max_age <= 600


def test_logout_ends_the_session_even_for_a_copied_cookie(site: Site) -> None:
    client = client_for(site, Role.VIEWER)
    copied = client.cookies.get("argus_session")
    csrf = csrf_of(client.get("/ui/incidents").text)
    response = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui/login"
    assert 'argus_session=""' in response.headers["set-cookie"]
    thief = TestClient(site.app, raise_server_exceptions=False, cookies={"argus_session": copied})
    assert thief.get("/ui/incidents", follow_redirects=False).status_code == 303
    assert any(r.path == "/ui/logout" and r.actor == "view-bob" for r in site.store.list_audit())


def test_login_failures_are_told_plainly_throttled_and_audited(site: Site) -> None:
    site.app.state.web = WebUi(Sessions(b"k" * 32), throttle=LoginThrottle(max_failures=3, window_s=600))
    client = TestClient(site.app, raise_server_exceptions=False)
    for wrong in ("argus_00000000_" + "A" * 43, "not a token", "x" * 5000):
        response = login(client, wrong)
        assert response.status_code == 401 and "unknown, revoked or expired" in response.text
        assert wrong[:40] not in response.text  # the pasted value is not echoed back
    blocked = login(client, site.tokens[Role.OPERATOR])  # even the right token waits now
    assert blocked.status_code == 429 and int(blocked.headers["Retry-After"]) > 0
    records = [r for r in site.store.list_audit() if r.path == "/ui/login"]
    assert [r.outcome for r in records] == ["rejected", "refused", "refused", "refused"]
    assert all(r.actor == "anonymous" for r in records)
    assert not any("argus_00000000" in str(r.detail) for r in records)


def test_the_login_form_needs_its_own_csrf_token_and_next_stays_on_this_site(site: Site) -> None:
    client = TestClient(site.app, raise_server_exceptions=False)
    # a post from another site carries no login cookie and no token from our form
    forged = client.post("/ui/login", data={"token": site.tokens[Role.OPERATOR]}, follow_redirects=False)
    assert forged.status_code == 403 and "argus_session" not in forged.headers.get("set-cookie", "")
    for target in ("//evil.example/x", "https://evil.example", "/\\evil.example", "/ui/../v1/actions",
                   "javascript:alert(1)"):
        fresh = TestClient(site.app, raise_server_exceptions=False)
        response = login(fresh, site.tokens[Role.VIEWER], next_page=target)
        assert response.status_code == 303 and response.headers["location"] == "/ui/incidents", target


def hostile_incident(site: Site) -> str:
    finding = Finding(
        category=Category.USER_ERROR, reason="<img src=x onerror=alert(1)>",
        subject=Subject(kind=SubjectKind.JOB, id="job-x", name="<script>alert('subject')</script>"),
        summary="<script>alert('summary')</script> [click](javascript:alert(2))",
        evidence=(Evidence(source="<b>src</b>", text="</pre><script>alert('evidence')</script>", line=1),),
        attrs={"note": "<script>alert('attr')</script>"})
    incident, _ = site.store.record_finding(finding)
    site.store.add_report(Report(
        id="", incident_id=incident.id, category=Category.USER_ERROR, confidence=0.5, generator="tests",
        summary="<script>alert('report summary')</script>",
        markdown="# Report\n\n<script>alert('report')</script>\n\n<img src=x onerror=alert(3)>\n\n"
                 "[js](javascript:alert(4)) [data](data:text/html,<script>alert(5)</script>) "
                 "[JS](JaVaScRiPt:alert(6)) ![img](https://tracker.example/p.png) "
                 "[docs](https://docs.ray.io/) <javascript:alert(7)>\n\n"
                 "```\n</code></pre><script>alert(8)</script>\n```\n"))
    return incident.id


class Markup(HTMLParser):
    """Every tag and attribute of a page, to check that hostile text made none of its own."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_inert(html: str) -> None:
    tags = Markup(html).tags
    scripts = [a for t, a in tags if t == "script"]
    assert scripts == [{"src": "/ui/static/argus.js", "defer": None}], scripts
    assert not [t for t, _ in tags if t in ("img", "iframe", "object", "embed", "svg", "math", "base", "style")]
    assert all("charset" in a or a.get("name") == "viewport" for t, a in tags if t == "meta")
    assert not [(t, k) for t, a in tags for k in a if k.startswith("on")], "an event handler attribute"
    hrefs = [str(a.get("href") or a.get("action") or "") for _, a in tags]
    assert not [h for h in hrefs if h.lower().lstrip().startswith(("javascript:", "data:", "vbscript:"))], hrefs


def test_hostile_text_in_incidents_reports_and_evidence_is_shown_as_text(site: Site) -> None:
    incident_id = hostile_incident(site)
    client = client_for(site, Role.OPERATOR)
    for path in ("/ui/incidents", f"/ui/incidents/{incident_id}"):
        html = client.get(path).text
        assert_inert(html)
        assert "&lt;script&gt;alert(&#39;summary&#39;)&lt;/script&gt;" in html
    page = client.get(f"/ui/incidents/{incident_id}").text
    assert '<a href="https://docs.ray.io/" rel="nofollow noopener noreferrer">docs</a>' in page
    assert "&lt;script&gt;alert('report')&lt;/script&gt;" in page  # the report's raw HTML, as text
    assert "&lt;img src=x onerror=alert(3)&gt;" in page and "[js](javascript:alert(4))" in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#39;evidence&#39;)" in page
    assert "&lt;script&gt;alert(&#39;attr&#39;)&lt;/script&gt;" in page
    raw = client.get(f"/ui/incidents/{incident_id}/report.md")
    assert raw.headers["content-type"].startswith("text/plain") and raw.headers["x-content-type-options"] == "nosniff"


def test_a_report_from_hostile_log_lines_renders_them_as_text(site: Site) -> None:
    log = site.shared / "jobs" / SID / "logs" / "driver.log"
    log.write_text(log.read_text() + "2026-05-01 12:00:00,000 ERROR <script>alert('log')</script> "
                   "[reset](javascript:alert(1)) health check failed due to missing too many heartbeats\n")
    from argus.reports import ReportService
    from detectors.engine import load_rules
    from rca.engine import RcaEngine
    from rca.redact import Redactor

    [report] = ReportService(site.store, RcaEngine(load_rules([]), Redactor), site.shared).write(site.incident_id,
                                                                                                llm=False)
    assert "<script>alert('log')</script>" in report.markdown  # quoted as it was, in code spans and blocks
    html = client_for(site, Role.VIEWER).get(f"/ui/incidents/{site.incident_id}").text
    assert_inert(html)
    assert "&lt;script&gt;alert('log')&lt;/script&gt; [reset](javascript:alert(1))" in html and NODE_IP in html


def test_static_files_are_served_and_the_api_is_unchanged(site: Site) -> None:
    client = TestClient(site.app)
    css = client.get("/ui/static/argus.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"] and ".table-wrap" in css.text
    assert client.get("/ui/static/argus.js").status_code == 200
    assert client.get("/ui/static/../templates/base.html").status_code == 404
    # the API still answers with bearer tokens and JSON, and a UI cookie is no API credential
    api = TestClient(site.app, headers={"Authorization": f"Bearer {site.tokens[Role.VIEWER]}"})
    assert api.get("/v1/incidents").json()["items"]
    ui = client_for(site, Role.VIEWER)
    assert ui.get("/v1/incidents").status_code == 401


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.ADMIN])
def test_decisions_on_a_dry_run_step_are_a_message(tmp_path: Path, role: Role) -> None:
    site = build_site(tmp_path)
    try:
        from remediation.policy import Mode, Step

        incident = site.store.get_incident(site.incident_id)
        [dry] = site.remediator.plan(incident, steps=[Step(action="keep_scene")], requested_by="tests",
                                     mode=Mode.DRY_RUN)
        client = client_for(site, role)
        html = client.get(f"/ui/incidents/{site.incident_id}").text
        assert f"/actions/{dry.id}/approve" not in html  # a dry run has nothing to approve: no button
        response = client.post(f"/ui/incidents/{site.incident_id}/actions/{dry.id}/approve",
                               data={"csrf": csrf_of(html)})
        assert response.status_code == 409 and "is a dry run" in response.text
    finally:
        site.store.close()


def test_the_browser_test_fails_without_chromium_where_the_browser_is_required(monkeypatch, tmp_path: Path) -> None:
    from tests.web import test_web_browser

    monkeypatch.setattr(test_web_browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("ARGUS_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed"):
        test_web_browser._need_browser()
    monkeypatch.delenv("ARGUS_REQUIRE_BROWSER")
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        test_web_browser._need_browser()


def test_the_session_secret_is_kept_in_the_data_dir(tmp_path: Path) -> None:
    from argus.web.sessions import secret_in
    from core.errors import ConfigError

    first = secret_in(tmp_path / "data")
    assert first == secret_in(tmp_path / "data") and len(first) >= 32
    assert (tmp_path / "data" / "web-session.secret").stat().st_mode & 0o777 == 0o600
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError, match="web session secret"):
        secret_in(tmp_path / "file")
