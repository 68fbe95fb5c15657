"""A site for the web page's tests, built through the real code paths: a SQLite store, an incident opened
from findings, its report written by the real ReportService (rules only), steps planned by a real
Remediator in approval mode (approving only changes state: nothing runs them here), registered nodes
moved through their states, and a control plane whose Ray does not answer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from argus.api.app import create_app
from argus.control_plane import ControlPlane, job_queue
from argus.incidents.bus import EventBus
from argus.incidents.desk import IncidentDesk
from argus.reports import ReportService
from argus.store.store import Store
from argus.store.tokens import Role
from control.jobs import JobController
from control.local import LocalRunner
from control.nodes import NodeSpec, NodeState
from core.types import Action, Category, Evidence, Finding, Severity, Subject, SubjectKind
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.redact import Redactor
from remediation.actions import Context
from remediation.policy import Mode, load_policy
from remediation.runner import Remediator
from stage.localstack.ports import free_port
from tests.support import RecordingSubscriber

SID = "grpo-20260501T120000Z-ab12"
NODE_IP = "10.0.0.7"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvHd5Yq4s1nE0CkW2m3n5b8xk9Zr7bq3u9Yp2sT6fQx"
TOKEN_NAMES = {Role.VIEWER: "view-bob", Role.OPERATOR: "op-alice", Role.AGENT: "ops-agent", Role.ADMIN: "root-carol"}
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Site:
    store: Store
    app: FastAPI
    remediator: Remediator
    shared: Path
    incident_id: str
    actions: list[Action]
    tokens: dict[Role, str] = field(default_factory=dict)
    told: RecordingSubscriber = field(default_factory=RecordingSubscriber)  # incident events the pages caused

    def step(self, kind: str) -> Action:
        return next(a for a in self.actions if a.kind == kind)


def job_folder(shared: Path) -> None:
    job = shared / "jobs" / SID
    for sub in ("config", "logs", "checkpoints/global_step_40"):
        (job / sub).mkdir(parents=True)
    (job / "config" / "jobspec.yaml").write_text(
        "name: grpo\nentrypoint: python train.py\nnnodes: 2\ngpus_per_node: 8\nowner: alice\n")
    (job / "logs" / "driver.log").write_text(
        "2026-05-01 11:58:00,000 INFO step:41 - loss:0.3\n"
        "2026-05-01 11:59:58,000 ERROR The actor died unexpectedly before finishing this task: "
        f"the node {NODE_IP} was marked dead because it missed too many heartbeats\n"
        "2026-05-01 11:59:58,500 ERROR health check failed due to missing too many heartbeats\n")


def register_nodes(store: Store, key_path: Path) -> None:
    registry = store.nodes()
    for name, ip, labels in (("gpu-07", NODE_IP, {"argus.io/zone": "a", "gpu": "h100"}),
                             ("gpu-08", "10.0.0.8", {"argus.io/zone": "b", "gpu": "h100"}),
                             ("gpu-09", "10.0.0.9", {})):
        spec = NodeSpec(name=name, host=ip, ssh_user="ray", ssh_key_path=str(key_path), host_key=HOST_KEY,
                        labels=labels, pool="h100", gpus=8)
        registry.add(spec, actor="root-carol", reason="registered for the test")
    registry.record_transition("gpu-07", NodeState.PENDING, NodeState.ONLINE, actor="argus", reason="joined",
                               ray_node_id="a" * 56)
    registry.record_transition("gpu-07", NodeState.ONLINE, NodeState.DRAINING, actor="op-alice",
                               reason="lost heartbeats")
    registry.record_transition("gpu-08", NodeState.PENDING, NodeState.ONLINE, actor="argus", reason="joined",
                               ray_node_id="b" * 56)


def build_site(tmp_path: Path, *, with_control: bool = True) -> Site:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    shared = tmp_path / "shared"
    job_folder(shared)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("not a real key: nothing logs in with it\n")
    register_nodes(store, keys / "id_ed25519")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: Ray's answers are "not reachable", at once
    jobs = JobController(dead, shared, request_timeout_s=2, code_roots=[shared])
    control = ControlPlane(jobs=jobs, registry=store.nodes(),
                           queue=job_queue(store.job_queue, jobs, store.nodes()), manager=None, ssh_key_dirs=(keys,))
    ctx = Context(jobs=jobs, registry=store.nodes(), nodes=None, dashboard_url=dead, gcs_address=None,
                  local=LocalRunner(), store=store)
    remediator = Remediator(store, load_policy(mode=Mode.APPROVAL), ctx)

    finding = Finding(
        category=Category.NODE_LOST, reason="RayNodeDead",
        subject=Subject(kind=SubjectKind.NODE, id="a" * 56, name=NODE_IP),
        summary=f"node {NODE_IP} died with ranks of {SID} on it", severity=Severity.CRITICAL,
        evidence=(Evidence(source="ray.state", text="state=DEAD: health check failed due to missing too many "
                                                    "heartbeats"),
                  Evidence(source=f"jobs/{SID}/logs/driver.log", line=2, text="The actor died unexpectedly")),
        first_seen=datetime(2026, 5, 1, 11, 59, 58, tzinfo=timezone.utc),
        attrs={"submission_id": SID, "node_ip": NODE_IP, "node_id": "a" * 56})
    incident, _ = store.record_finding(finding)
    actions = remediator.plan(incident)
    ReportService(store, RcaEngine(load_rules([]), Redactor), shared).write(incident.id, llm=False)
    told = RecordingSubscriber()
    app = create_app(store=store, control=control if with_control else None, remediator=remediator,
                     incidents=IncidentDesk(store, events=EventBus().start([told])))
    site = Site(store=store, app=app, remediator=remediator, shared=shared, incident_id=incident.id, actions=actions,
                told=told)
    for role, name in TOKEN_NAMES.items():
        site.tokens[role] = store.create_token(name, role, created_by="tests")[1]
    return site


@pytest.fixture
def site(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = build_site(tmp_path)
    yield s
    s.store.close()


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def login(client: httpx.Client, token: str, next_page: str | None = None) -> httpx.Response:
    """Log in through the form, as a browser does: GET the page (login cookie, CSRF), POST the token."""
    form_page = client.get("/ui/login", params={"next": next_page} if next_page else None)
    assert form_page.status_code == 200, form_page.text
    data = {"csrf": csrf_of(form_page.text), "token": token}
    if next_page:
        data["next"] = next_page
    return client.post("/ui/login", data=data, follow_redirects=False)
