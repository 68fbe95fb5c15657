"""Signed approve/reject links: a GET shows and decides nothing, a POST with a good signature decides once,
and a changed, foreign or expired link is refused."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.approval_links import ApprovalLinks, load_secret
from argus.store.store import Store
from control.jobs import JobController
from control.local import LocalRunner
from core.types import ActionState, Category, Evidence, Finding, Severity, Subject, SubjectKind
from remediation.actions import Context
from remediation.policy import Mode, load_policy
from remediation.runner import Remediator
from stage.localstack.ports import free_port


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    dead = f"http://127.0.0.1:{free_port()}"
    ctx = Context(jobs=JobController(dead, tmp_path / "shared"), registry=store.nodes(), nodes=None,
                  dashboard_url=dead, gcs_address=None, local=LocalRunner(), store=store)
    remediator = Remediator(store, load_policy(mode=Mode.APPROVAL), ctx)
    finding = Finding(category=Category.NODE_LOST, reason="RayNodeDead",
                      subject=Subject(kind=SubjectKind.NODE, id="n1", name="10.0.0.7"), summary="node 10.0.0.7 died",
                      severity=Severity.CRITICAL, evidence=(Evidence(source="t", text="DEAD"),),
                      first_seen=datetime(2026, 5, 1, tzinfo=timezone.utc), attrs={"node_ip": "10.0.0.7"})
    incident, _ = store.record_finding(finding)
    actions = remediator.plan(incident)
    clock = Clock()
    links = ApprovalLinks(load_secret(tmp_path / "link.secret"), "http://argus:8600", ttl_s=600, clock=clock)
    app = create_app(store=store, remediator=remediator)
    app.state.approval_links = links
    yield store, actions, links, clock, TestClient(app, raise_server_exceptions=False)
    store.close()


def form_of(link: str) -> tuple[str, dict[str, str]]:
    parsed = urlparse(link)
    return parsed.path, {k: v[0] for k, v in parse_qs(parsed.query).items()}


def test_get_shows_and_post_decides_once(setup) -> None:
    store, actions, links, _, client = setup
    drain = next(a for a in actions if a.kind == "drain_node")
    path, fields = form_of(links.link(drain.id, "approve"))
    page = client.get(path, params=fields)
    assert page.status_code == 200 and "Approve drain_node on node 10.0.0.7?" in page.text and "<form" in page.text
    assert store.get_action(drain.id).state is ActionState.PLANNED  # looking decides nothing
    decided = client.post(path, data=fields)
    assert decided.status_code == 200 and decided.json()["action"]["state"] == "approved"
    assert decided.json()["action"]["result"]["approved_by"] == "signed link"
    assert client.post(path, data=fields).status_code == 409
    [record] = [r for r in store.list_audit(limit=5) if r.path.endswith("/decide") and r.status == 200]
    assert record.actor == "anonymous" and record.detail["via"] == "signed link"


def test_reject_link(setup) -> None:
    store, actions, links, _, client = setup
    path, fields = form_of(links.link(actions[0].id, "reject"))
    assert client.post(path, data=fields).json()["action"]["state"] == "rejected"


def test_changed_foreign_and_expired_links_are_refused(setup, tmp_path: Path) -> None:
    store, actions, links, clock, client = setup
    first, second = actions[0], actions[1]
    path, fields = form_of(links.link(first.id, "reject"))
    for bad in ({**fields, "decision": "approve"}, {**fields, "sig": "0" * 64}, {**fields, "expires": "1"}):
        assert client.post(path, data=bad).status_code == 403
    other_path, _ = form_of(links.link(second.id, "reject"))
    assert client.post(other_path, data=fields).status_code == 403  # a link for another step
    foreign = ApprovalLinks(load_secret(tmp_path / "other.secret"), "http://argus:8600", clock=clock)
    assert client.post(*form_of(foreign.link(first.id, "reject"))[:1], data=form_of(
        foreign.link(first.id, "reject"))[1]).status_code == 403
    clock.now += 601
    expired = client.post(path, data=fields)
    assert expired.status_code == 403 and "expired" in expired.json()["message"]
    assert all(a.state is ActionState.PLANNED for a in store.list_actions())


def test_the_secret_survives_a_restart(tmp_path: Path) -> None:
    assert load_secret(tmp_path / "s") == load_secret(tmp_path / "s")
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o600
