"""The job, node and ops routes over a real SQLite store with no Ray behind them: who may call what, what
is refused before anything runs (hostile JobSpecs and node values, bodies too large), and the audit log.

The routes' effects on a real Ray cluster and sshd are in test_api_control_real.py.

One file past 400 lines on purpose: one role matrix and one environment (store, control plane, tokens) serve the
tests of every job, node and ops route, and other test files import them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from argus.agents.inbox import AgentInbox
from argus.api.app import create_app
from argus.control_plane import ControlPlane, job_queue
from argus.store.store import Store
from argus.store.tokens import Role, allows
from control.jobs import JobController
from control.local import LocalRunner
from control.node_manager import NodeManager
from control.nodes import NodeState
from core.types import Action, ActionState, Category, Evidence, Finding, Severity, Subject, SubjectKind
from remediation.actions import Context
from remediation.policy import Guards, Mode, Policy
from remediation.runner import Remediator
from stage.localstack.ports import free_port

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvHd5Yq4s1nE0CkW2m3n5b8xk9Zr7bq3u9Yp2sT6fQx"
ROLES = (Role.VIEWER, Role.OPERATOR, Role.AGENT, Role.ADMIN, Role.NODE_AGENT, Role.USER)

# Every route of the control plane and the role it needs. The test below fails when a route is missing
# here, so a new route cannot ship without a decision about who may call it.
ROUTE_ROLES: dict[str, Role] = {
    "GET /v1/incidents": Role.VIEWER,
    "GET /v1/incidents/{incident_id}": Role.VIEWER,
    "GET /v1/incidents/{incident_id}/report": Role.VIEWER,
    "POST /v1/incidents/{incident_id}:resolve": Role.OPERATOR,
    "POST /v1/incidents/{incident_id}/actions": Role.OPERATOR,
    "GET /v1/actions": Role.VIEWER,
    "GET /v1/actions/{action_id}": Role.VIEWER,
    "POST /v1/actions/{action_id}:approve": Role.OPERATOR,
    "POST /v1/actions/{action_id}:reject": Role.OPERATOR,
    "POST /v1/alerts/alertmanager": Role.OPERATOR,
    "POST /v1/jobs": Role.USER,  # a user submits as themself (owner alice for the user token below)
    "GET /v1/jobs": Role.VIEWER,
    "GET /v1/jobs/queue": Role.VIEWER,
    "GET /v1/jobs/{submission_id}": Role.VIEWER,
    "POST /v1/jobs/{submission_id}/stop": Role.USER,
    "GET /v1/jobs/{submission_id}/logs": Role.VIEWER,
    "POST /v1/nodes": Role.ADMIN,
    "GET /v1/nodes": Role.VIEWER,
    "GET /v1/nodes/{name}": Role.VIEWER,
    "POST /v1/nodes/{name}/join": Role.OPERATOR,
    "POST /v1/nodes/{name}/drain": Role.OPERATOR,
    "POST /v1/nodes/{name}/undrain": Role.OPERATOR,
    "POST /v1/nodes/{name}/offline": Role.OPERATOR,
    "POST /v1/nodes/{name}/reset": Role.OPERATOR,
    "POST /v1/nodes/{name}/probe": Role.OPERATOR,
    "POST /v1/ops/cleanup_job_artifacts": Role.OPERATOR,
    "GET /v1/metrics/query_range": Role.VIEWER,
    "GET /v1/incidents/{incident_id}/metrics": Role.VIEWER,
    "GET /v1/agents": Role.VIEWER,
    "POST /v1/agents/batch": Role.NODE_AGENT,  # Argus's node agents send lines; that token can do nothing else
}
# The routes whose agent calls meet the remediation policy's guards (argus/api/agent_policy.py): the agent's role
# may call them, so a 403 there must be the policy's (GuardRefused), never the role's.
AGENT_GUARDED = {"POST /v1/jobs/{submission_id}/stop", "POST /v1/nodes/{name}/drain", "POST /v1/nodes/{name}/offline"}
# Open: health and metrics (probes, scrapes); the signed-link pages, whose signature is their credential.
OPEN_ROUTES = {"GET /v1/health", "GET /v1/leader", "GET /metrics", "GET /v1/actions/{action_id}/decide",
               "POST /v1/actions/{action_id}/decide"}
PARAMS = {"{incident_id}": "inc-000000000000", "{submission_id}": "ghost-1", "{name}": "ghost",
          "{action_id}": "act-000000000000"}


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.shared = tmp_path / "shared"
        self.code = self.shared / "common" / "code"
        self.code.mkdir(parents=True)
        self.keys = tmp_path / "keys"
        self.keys.mkdir()
        self.key = self.keys / "id_ed25519"
        self.key.write_text("not a real key: registering does not read it\n")
        self.store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: Ray calls fail fast as unavailable
        jobs = JobController(dead, self.shared, request_timeout_s=2, code_roots=[self.shared])
        registry = self.store.nodes()
        manager = NodeManager(registry, gcs_address="127.0.0.1:1", dashboard_url=dead, join_timeout_s=2)
        self.control = ControlPlane(jobs=jobs, registry=registry, queue=job_queue(self.store.job_queue, jobs, registry),
                                    manager=manager, ssh_key_dirs=(self.keys,))
        self.app = create_app(store=self.store, control=self.control, node_agents=AgentInbox())
        self.tokens = {role: self.store.create_token(f"t-{role.value}", role, created_by="tests",
                                                     user="alice" if role is Role.USER else None)[1] for role in ROLES}

    def client(self, role: Role | None) -> TestClient:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        return TestClient(self.app, headers=headers, raise_server_exceptions=False)

    def node_body(self, **over: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"name": "gpu-07", "host": "10.0.0.7", "ssh_user": "ray", "ssh_key_path": str(self.key),
                                "host_key": HOST_KEY, "labels": {"argus.io/zone": "a"}, "pool": "h100", "gpus": 8}
        body.update(over)
        return body

    def job_body(self, **over: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"name": "sft", "entrypoint": "python -m train", "owner": "alice"}
        body.update(over)
        return body


@pytest.fixture
def env(tmp_path: Path):
    e = Env(tmp_path)
    yield e
    e.store.close()


def bodies(env: Env) -> dict[str, Any]:
    return {
        "POST /v1/jobs": env.job_body(),
        "POST /v1/jobs/{submission_id}/stop": {"reason": "test"},
        "POST /v1/nodes": env.node_body(name="matrix-node"),
        "POST /v1/ops/cleanup_job_artifacts": {"submission_id": "ghost-1", "keep_last": 1},
        "POST /v1/agents/batch": {"node_id": "n1", "node_ip": "10.0.0.1", "lines": []},
        "POST /v1/incidents/{incident_id}/actions": {"plan": "policy"},
        "POST /v1/incidents/{incident_id}:resolve": {"reason": "test"},
        "POST /v1/actions/{action_id}:reject": {"reason": "test"},
        "POST /v1/alerts/alertmanager": {"version": "4", "status": "firing", "alerts": [
            {"status": "resolved", "labels": {"alertname": "X"}, "startsAt": "2026-01-01T00:00:00Z"}]},
        **{f"POST /v1/nodes/{{name}}/{step}": {"reason": "test"} for step in
           ("join", "drain", "undrain", "offline", "reset")},
    }


def api_routes(app) -> set[str]:
    """Every documented route as "METHOD path" (FastAPI nests included routers, so read its OpenAPI)."""
    return {f"{m.upper()} {path}" for path, ops in app.openapi()["paths"].items() for m in ops}


# the query a route needs to be answered at all (its required parameters)
QUERIES: dict[str, dict[str, str]] = {"GET /v1/metrics/query_range": {"metric": "up"}}


def test_every_route_has_a_role_and_the_matrix_holds(env: Env) -> None:
    routes = api_routes(env.app)
    assert routes - OPEN_ROUTES == set(ROUTE_ROLES), "a route has no entry in ROUTE_ROLES (or one is stale)"
    body_of = bodies(env)
    for key, need in ROUTE_ROLES.items():
        method, template = key.split(" ")
        path = template
        for param, value in PARAMS.items():
            path = path.replace(param, value)
        kwargs: dict[str, Any] = {"json": body_of[key]} if key in body_of else {}
        if key in QUERIES:
            kwargs["params"] = QUERIES[key]
        assert env.client(None).request(method, path, **kwargs).status_code == 401, key
        for role in ROLES:
            response = env.client(role).request(method, path, **kwargs)
            status = response.status_code
            if allows(role, need) and role is Role.AGENT and key in AGENT_GUARDED and status == 403:
                assert response.json()["error"] == "GuardRefused", f"{key} as agent: {response.text}"
            elif allows(role, need):
                assert status not in (401, 403, 422), f"{key} as {role.value}: {status}"
            else:
                assert status == 403, f"{key} as {role.value}: {status}"


def test_openapi_documents_the_control_plane_with_bearer_auth(env: Env) -> None:
    spec = env.client(None).get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/nodes/{name}/undrain", "/v1/ops/cleanup_job_artifacts"} <= set(spec["paths"])
    submit = spec["paths"]["/v1/jobs"]["post"]
    assert submit["security"] and "JobSpec" in json.dumps(submit["requestBody"])


def test_without_a_control_plane_the_routes_say_what_to_configure(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        _, token = store.create_token("v", Role.VIEWER, created_by="tests")
        client = TestClient(create_app(store=store), headers={"Authorization": f"Bearer {token}"})
        response = client.get("/v1/jobs")
        assert response.status_code == 503 and "argus serve" in response.json()["hint"]
    finally:
        store.close()


def test_node_steps_without_a_gcs_address_are_503_with_the_setting_to_set(env: Env) -> None:
    env.app.state.control = ControlPlane(jobs=env.control.jobs, registry=env.control.registry, queue=env.control.queue,
                                         manager=None,
                                         ssh_key_dirs=(env.keys,))
    response = env.client(Role.OPERATOR).post("/v1/nodes/ghost/drain", json={"reason": "x"})
    assert response.status_code == 503 and "ARGUS_RAY_GCS_ADDRESS" in response.json()["hint"]
    assert env.client(Role.VIEWER).get("/v1/nodes").status_code == 200


# ---- jobs: refused before Ray is asked ----------------------------------------------------------------


@pytest.mark.parametrize(
    "over",
    [
        {"name": "../../etc"}, {"name": "a b"}, {"name": ""}, {"name": "x" * 41},
        {"owner": "Robert'); DROP TABLE jobs;--"}, {"owner": "../root"},
        {"submission_id": "../../escape"}, {"submission_id": "id\n"}, {"submission_id": "a/b"},
        {"entrypoint": ""}, {"entrypoint": "python\x00 -c 1"}, {"entrypoint": "x" * 20_000},
        {"code_path": "relative/dir"}, {"code_path": "/opt/code:/evil"}, {"code_path": "/opt/$HOME"},
        {"code_path": "/opt/../etc"}, {"working_dir": "/tmp/a b"},
        {"env": {"PYTHONPATH": "/evil"}}, {"env": {"RAY_ADDRESS": "x"}}, {"env": {"lower": "x"}},
        {"env": {"A": "x\x00"}}, {"env": {f"K{i}": "v" for i in range(200)}},
        {"labels": {"ray.io/node-id": "x"}}, {"labels": {"a": "b c"}}, {"pool": "h100; reboot"},
        {"nnodes": 0}, {"nnodes": "2"}, {"gpus_per_node": 99}, {"timeout_s": -1}, {"resume": "yes"},
        {"workload": "mining"}, {"unknown_field": 1},
    ],
)
def test_hostile_job_specs_are_422_and_nothing_is_created(env: Env, over: dict[str, Any]) -> None:
    response = env.client(Role.OPERATOR).post("/v1/jobs", json=env.job_body(**over))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "InvalidRequest" and body["problems"]
    assert not (env.shared / "jobs").exists()


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'"spec"', b"\xff\xfe", b'{"name": ' * 5000])
def test_malformed_job_bodies_are_422(env: Env, raw: bytes) -> None:
    response = env.client(Role.OPERATOR).post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text


def test_code_outside_the_code_roots_is_refused(env: Env, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sneaky = env.code / "sneaky"
    sneaky.symlink_to(outside, target_is_directory=True)
    client = env.client(Role.OPERATOR)
    for path in (outside, sneaky):
        response = client.post("/v1/jobs", json=env.job_body(code_path=str(path)))
        assert response.status_code == 403, response.text  # the admin's code roots do not allow it
        assert "outside the allowed code roots" in response.json()["message"]
    missing = client.post("/v1/jobs", json=env.job_body(code_path=str(env.code / "absent")))
    assert missing.status_code == 404 and "not a directory" in missing.json()["message"]
    assert not (env.shared / "jobs").exists()


def test_ray_down_queues_the_job_with_the_reason_naming_the_dashboard(env: Env) -> None:
    response = env.client(Role.OPERATOR).post("/v1/jobs", json=env.job_body(code_path=str(env.code)))
    assert response.status_code == 202, response.text  # accepted into the queue: it starts when Ray answers again
    job = response.json()["job"]
    assert job["status"] == "QUEUED" and job["state"] == "queued" and job["job_dir"] is None
    assert "cannot be read" in job["queue"]["reason"] and env.control.jobs.dashboard_url in job["queue"]["reason"]
    assert not (env.shared / "jobs").exists()  # its folder is made when it starts
    listed = env.client(Role.VIEWER).get("/v1/jobs/queue").json()["items"]
    assert [j["submission_id"] for j in listed] == [job["submission_id"]]
    # stopped while queued: it leaves the queue, and Ray (still down) is not asked
    stopped = env.client(Role.OPERATOR).post(f"/v1/jobs/{job['submission_id']}/stop", json={"reason": "not now"})
    assert stopped.status_code == 200 and stopped.json()["job"]["state"] == "cancelled"
    assert env.client(Role.VIEWER).get("/v1/jobs/queue", params={"state": "queued"}).json()["items"] == []


@pytest.mark.parametrize("sid", ["a%2Fb", "..", "x" * 65, "bad%0Aid", "%00"])
def test_hostile_submission_ids_in_paths_are_refused(env: Env, sid: str) -> None:
    status = env.client(Role.OPERATOR).post(f"/v1/jobs/{sid}/stop", json={"reason": "x"}).status_code
    assert status in (404, 422)


def test_a_body_over_the_limit_is_413_and_chunked_ones_too(env: Env) -> None:
    client = env.client(Role.OPERATOR)
    big = json.dumps(env.job_body(entrypoint="x" * (2 * 1024 * 1024)))
    response = client.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "BodyTooLarge"

    def chunks():
        yield b'{"name": "sft", "owner": "alice", "entrypoint": "'
        for _ in range(40):
            yield b"y" * 64 * 1024
        yield b'"}'

    response = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "BodyTooLarge"
    headers = {"content-length": "abc", "content-type": "application/json"}
    lying = client.post("/v1/jobs", content=b"{}", headers=headers)
    assert lying.status_code == 413 and "not a size" in lying.json()["message"]


# ---- nodes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over",
    [
        {"name": "gpu;reboot"}, {"name": "GPU-07"}, {"name": "-gpu"}, {"name": "n" * 64}, {"name": "gpu\u043e7"},
        {"name": "gpu 07"}, {"host": "$(reboot)"}, {"host": "10.0.0.7; id"}, {"host": "-oProxyCommand=id"},
        {"ssh_user": "root;id"}, {"ssh_user": "-l"}, {"ssh_port": 0}, {"ssh_port": "22"},
        {"ssh_key_path": "../../etc/shadow"}, {"ssh_key_path": "/keys/id rsa"},
        {"host_key": "ssh-ed25519 not-base64!"}, {"labels": {"a": "b;c"}}, {"labels": {"ray.io/x": "y"}},
        {"pool": "H100 pool"}, {"gpus": 17}, {"ray_bin": "ray; rm -rf /"}, {"ray_temp_dir": "/tmp/$(id)"},
        {"resources": {"GPU": 1}}, {"node_ip": "10.0.0.300"}, {"extra": True},
    ],
)
def test_hostile_node_specs_are_422_and_nothing_is_registered(env: Env, over: dict[str, Any]) -> None:
    response = env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body(**over))
    assert response.status_code == 422, response.text
    assert env.control.registry.list() == []


@pytest.mark.parametrize("name", ["gpu;reboot", "GPU", "a%20b", "n" * 64, "x%0A", "%2E%2E"])
def test_hostile_node_names_in_paths_are_refused(env: Env, name: str) -> None:
    client = env.client(Role.OPERATOR)
    assert client.get(f"/v1/nodes/{name}").status_code in (404, 422)
    assert client.post(f"/v1/nodes/{name}/drain", json={"reason": "x"}).status_code in (404, 422)


@pytest.mark.parametrize("reason", ["", "a;b", "$(id)", "line\nbreak", "x" * 181, "naïve"])
def test_reasons_that_ray_would_refuse_are_422(env: Env, reason: str) -> None:
    env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body())
    response = env.client(Role.OPERATOR).post("/v1/nodes/gpu-07/join", json={"reason": reason})
    assert response.status_code == 422
    assert env.control.registry.get("gpu-07").state.value == "pending"


def test_register_list_get_and_a_key_outside_the_key_folders(env: Env, tmp_path: Path) -> None:
    admin = env.client(Role.ADMIN)
    created = admin.post("/v1/nodes", json=env.node_body())
    assert created.status_code == 201, created.text
    assert created.json()["node"]["state"] == "pending"
    assert admin.post("/v1/nodes", json=env.node_body()).status_code == 409  # the name is taken

    elsewhere = tmp_path / "elsewhere_key"
    elsewhere.write_text("x")
    refused = admin.post("/v1/nodes", json=env.node_body(name="gpu-08", ssh_key_path=str(elsewhere)))
    assert refused.status_code == 403 and "outside the SSH key folders" in refused.json()["message"]
    escape = admin.post("/v1/nodes", json=env.node_body(name="gpu-09", ssh_key_path=str(env.keys / "absent")))
    assert escape.status_code == 404 and "not a file" in escape.json()["message"]

    viewer = env.client(Role.VIEWER)
    assert [n["name"] for n in viewer.get("/v1/nodes").json()["items"]] == ["gpu-07"]
    one = viewer.get("/v1/nodes/gpu-07").json()
    assert one["node"]["spec"]["pool"] == "h100"
    assert one["transitions"] == [{"from": None, "to": "pending", "actor": "t-admin",
                                   "reason": "registered through the API", "at": one["transitions"][0]["at"]}]
    assert viewer.get("/v1/nodes/absent").status_code == 404


def test_out_of_order_steps_are_409_and_run_nothing(env: Env) -> None:
    env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body())
    operator = env.client(Role.OPERATOR)
    for step in ("drain", "undrain", "reset"):
        response = operator.post(f"/v1/nodes/gpu-07/{step}", json={"reason": "too early"})
        assert response.status_code == 409, (step, response.text)
        assert "pending" in response.json()["message"]
    assert env.control.registry.get("gpu-07").state.value == "pending"


def test_a_step_the_node_cannot_do_is_502_with_the_outcome_and_the_node_failed(env: Env) -> None:
    env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body())
    response = env.client(Role.OPERATOR).post("/v1/nodes/gpu-07/join", json={"reason": "first join"})
    assert response.status_code == 502
    body = response.json()
    assert body["error"] == "NodeStepFailed" and body["ok"] is False and body["state"] == "failed"
    assert "Ray dashboard" in body["message"]
    history = env.client(Role.VIEWER).get("/v1/nodes/gpu-07").json()["transitions"]
    assert [(t["from"], t["to"], t["actor"]) for t in history] == [(None, "pending", "t-admin"),
                                                                    ("pending", "failed", "t-operator")]


def test_mutations_are_audited_with_who_what_and_result(env: Env) -> None:
    env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body())
    env.client(Role.VIEWER).post("/v1/nodes/gpu-07/drain", json={"reason": "nope"})
    env.client(Role.OPERATOR).post("/v1/nodes/gpu-07/drain", json={"reason": "xid 79"})
    env.client(Role.OPERATOR).post("/v1/nodes/gpu-07/join", json={"reason": "join"})
    env.client(None).post("/v1/jobs", json=env.job_body())
    records = list(reversed(env.store.list_audit(limit=10)))
    assert [(r.actor, r.method, r.path, r.status, r.outcome) for r in records] == [
        ("t-admin", "POST", "/v1/nodes", 201, "ok"),
        ("t-viewer", "POST", "/v1/nodes/gpu-07/drain", 403, "refused"),
        ("t-operator", "POST", "/v1/nodes/gpu-07/drain", 409, "rejected"),
        ("t-operator", "POST", "/v1/nodes/gpu-07/join", 502, "failed"),
        ("anonymous", "POST", "/v1/jobs", 401, "refused"),
    ]
    assert records[0].detail == {"node": "gpu-07", "host": "10.0.0.7"}
    assert json.loads(records[3].target) == {"name": "gpu-07"}
    assert records[3].detail["ok"] is False and records[3].detail["state"] == "failed"


def test_cleanup_refuses_bad_requests(env: Env) -> None:
    client = env.client(Role.OPERATOR)
    for body in ({"submission_id": "../x", "keep_last": 1}, {"submission_id": "a", "keep_last": 0},
                 {"submission_id": "a", "keep_last": "all"}, {"submission_id": "a", "extra": 1}, {}):
        assert client.post("/v1/ops/cleanup_job_artifacts", json=body).status_code == 422, body


# ---- the agent within the policy (argus/api/agent_policy.py) ----------------------------------------------


class RayListsNoNode(NodeManager):
    """Ray answers and lists no live node: a drain then needs nothing from Ray and succeeds."""

    def _list_ray_nodes(self) -> list[dict[str, Any]]:
        return []


# Lets the agent drain and stop by itself, within limits each test below runs into one at a time.
AGENT_GUARDS = Guards(max_per_hour={"drain_node": 2, "stop_job": 5}, max_per_node_per_hour=5, min_drain_interval_s=0,
                      max_drained_share=0.5, protected_nodes=["10.0.0.13"], protected_jobs=["prod-*"],
                      agent_may_approve=["keep_scene", "drain_node", "stop_job"])


def with_policy(env: Env, guards: Guards = AGENT_GUARDS, *, nodes: int = 4) -> list[str]:
    """Remediation with `guards` and a Ray that lists no node behind the API; `nodes` registered nodes online,
    gpu-11 (10.0.0.11) on; their names."""
    dead = env.control.jobs.dashboard_url
    manager = RayListsNoNode(env.control.registry, gcs_address="127.0.0.1:1", dashboard_url=dead, join_timeout_s=2)
    env.app.state.control = ControlPlane(jobs=env.control.jobs, registry=env.control.registry, queue=env.control.queue,
                                         manager=manager,
                                         ssh_key_dirs=(env.keys,))
    ctx = Context(jobs=env.control.jobs, registry=env.control.registry, nodes=manager, dashboard_url=dead,
                  gcs_address=None, local=LocalRunner(), store=env.store, request_timeout_s=2)
    env.app.state.remediator = Remediator(env.store, Policy(mode=Mode.APPROVAL, guards=guards), ctx)
    names = [f"gpu-{11 + i}" for i in range(nodes)]
    for i, name in enumerate(names):
        created = env.client(Role.ADMIN).post("/v1/nodes", json=env.node_body(name=name, host=f"10.0.0.{11 + i}"))
        assert created.status_code == 201, created.text
        env.control.registry.record_transition(name, NodeState.PENDING, NodeState.ONLINE, actor="tests",
                                               reason="joined", ray_node_id=f"{i:056x}")
    return names


def drain(env: Env, role: Role, name: str, step: str = "drain"):
    return env.client(role).post(f"/v1/nodes/{name}/{step}", json={"reason": "xid 79"})


def assert_guard_refused(response, guard: str, *words: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["error"] == "GuardRefused" and f"guard {guard}" in body["message"], body
    assert all(w in body["message"] for w in words), body
    assert "POST /v1/incidents/{id}/actions" in body["hint"], body


def direct_actions(env: Env) -> list[Action]:
    return [a for a in env.store.list_actions() if a.incident_id is None]


def test_an_admitted_agent_drain_is_recorded_and_counts_toward_the_rate_limit(env: Env) -> None:
    with_policy(env, AGENT_GUARDS.model_copy(update={"max_per_hour": {"drain_node": 1}}))
    first = drain(env, Role.AGENT, "gpu-11")
    assert first.status_code == 200, first.text
    [action] = direct_actions(env)
    assert first.json()["action_id"] == action.id
    assert (action.kind, action.state, action.requested_by, action.dry_run) == (
        "drain_node", ActionState.SUCCEEDED, "t-agent", False)
    assert (action.target.kind, action.target.id, action.target.name) == (SubjectKind.NODE, f"{0:056x}", "10.0.0.11")
    assert env.control.registry.get("gpu-11").state is NodeState.DRAINING

    second = drain(env, Role.AGENT, "gpu-12")
    assert_guard_refused(second, "max_per_hour", "rate limit: 1 drain_node in the last hour (at most 1)")
    assert env.control.registry.get("gpu-12").state is NodeState.ONLINE
    assert len(direct_actions(env)) == 1  # a refusal is no step: it counts for nothing
    # people are not bound: the operator drains the same node, past the agent's budget
    assert drain(env, Role.OPERATOR, "gpu-12").status_code == 200
    assert env.control.registry.get("gpu-12").state is NodeState.DRAINING
    assert len(direct_actions(env)) == 1

    records = list(reversed(env.store.list_audit(limit=3)))
    assert [(r.actor, r.path, r.status, r.outcome) for r in records] == [
        ("t-agent", "/v1/nodes/gpu-11/drain", 200, "ok"), ("t-agent", "/v1/nodes/gpu-12/drain", 403, "refused"),
        ("t-operator", "/v1/nodes/gpu-12/drain", 200, "ok")]
    assert records[0].detail["action"] == action.id
    assert records[1].detail["guard"] == "max_per_hour" and records[1].detail["kind"] == "drain_node"


def test_remediation_steps_and_agent_drains_share_one_budget(env: Env) -> None:
    with_policy(env, AGENT_GUARDS.model_copy(update={"max_per_hour": {"drain_node": 1}}))
    finding = Finding(category=Category.NODE_LOST, reason="RayNodeDead",
                      subject=Subject(kind=SubjectKind.NODE, id="n9", name="10.0.0.99"), summary="node died",
                      severity=Severity.CRITICAL, evidence=(Evidence(source="t", text="DEAD"),),
                      attrs={"node_ip": "10.0.0.99"})
    incident, _ = env.store.record_finding(finding)
    env.store.add_action(Action(id="", incident_id=incident.id, kind="drain_node",
                                target=Subject(kind=SubjectKind.NODE, id="n9", name="10.0.0.99"),
                                state=ActionState.SUCCEEDED, idempotency_key="k-1", requested_by="policy",
                                dry_run=False))
    assert_guard_refused(drain(env, Role.AGENT, "gpu-11"), "max_per_hour", "1 drain_node in the last hour")
    assert drain(env, Role.OPERATOR, "gpu-11").status_code == 200


def test_an_agent_drain_past_the_drained_share_is_refused(env: Env) -> None:
    with_policy(env, AGENT_GUARDS.model_copy(update={"max_drained_share": 0.25}))
    assert drain(env, Role.OPERATOR, "gpu-11").status_code == 200  # 1 of 4 out: at the limit
    assert_guard_refused(drain(env, Role.AGENT, "gpu-12"), "max_drained_share",
                         "take 2 of 4 nodes out (at most 25% of the cluster)")
    assert_guard_refused(drain(env, Role.AGENT, "gpu-12", "offline"), "max_drained_share",
                         "(taking a node offline is checked as drain_node)")
    assert env.control.registry.get("gpu-12").state is NodeState.ONLINE
    assert direct_actions(env) == []
    assert drain(env, Role.OPERATOR, "gpu-12").status_code == 200


def test_an_agent_drain_of_a_protected_node_is_refused(env: Env) -> None:
    with_policy(env)
    for step in ("drain", "offline"):
        assert_guard_refused(drain(env, Role.AGENT, "gpu-13", step), "protected_nodes",
                             "node gpu-13 is protected by the policy")  # protected by its address
    assert env.control.registry.get("gpu-13").state is NodeState.ONLINE
    assert direct_actions(env) == []
    assert drain(env, Role.OPERATOR, "gpu-13").status_code == 200
    assert env.control.registry.get("gpu-13").state is NodeState.DRAINING


def test_an_agent_drain_the_policy_keeps_for_people_is_refused_saying_to_propose_it(env: Env) -> None:
    with_policy(env, AGENT_GUARDS.model_copy(update={"agent_may_approve": ["keep_scene", "resubmit_job"]}))
    refused = drain(env, Role.AGENT, "gpu-11")
    assert_guard_refused(refused, "agent_may_approve", "the agent may not drain_node without a person's approval",
                         "keep_scene, resubmit_job")
    assert '{"steps": [{"action": "drain_node"}]}' in refused.json()["hint"]
    assert env.control.registry.get("gpu-11").state is NodeState.ONLINE
    assert direct_actions(env) == []
    assert drain(env, Role.OPERATOR, "gpu-11").status_code == 200
    assert drain(env, Role.ADMIN, "gpu-12").status_code == 200


def test_an_agent_stop_of_a_protected_job_is_refused(env: Env) -> None:
    with_policy(env)
    refused = env.client(Role.AGENT).post("/v1/jobs/prod-7/stop", json={"reason": "idle GPUs"})
    assert_guard_refused(refused, "protected_jobs", "job prod-7 is protected by the policy")
    assert direct_actions(env) == []
    # the operator passes the guards and reaches Ray (which is down here: 503, not 403)
    assert env.client(Role.OPERATOR).post("/v1/jobs/prod-7/stop", json={"reason": "idle GPUs"}).status_code == 503
    # an unprotected job: admitted, and recorded as failed when Ray does not answer (so it counts for nothing)
    admitted = env.client(Role.AGENT).post("/v1/jobs/sft-1/stop", json={"reason": "idle GPUs"})
    assert admitted.status_code == 503, admitted.text
    [action] = direct_actions(env)
    assert (action.kind, action.target.id, action.state) == ("stop_job", "sft-1", ActionState.FAILED)
    assert env.control.jobs.dashboard_url in action.result["message"]


def test_without_remediation_the_agent_meets_the_built_in_policy(env: Env) -> None:
    # the built-in policy lets the agent approve keep_scene and resubmit_job only: it stops no job by itself
    assert env.app.state.remediator is None
    assert_guard_refused(env.client(Role.AGENT).post("/v1/jobs/sft-1/stop", json={"reason": "x"}),
                         "agent_may_approve", "stop_job")
    assert env.client(Role.OPERATOR).post("/v1/jobs/sft-1/stop", json={"reason": "x"}).status_code == 503


def test_a_direct_step_a_restart_left_running_is_failed_never_repeated(env: Env) -> None:
    with_policy(env)
    left = env.store.add_action(Action(id="", incident_id=None, kind="drain_node",
                                       target=Subject(kind=SubjectKind.NODE, id="gpu-11"), state=ActionState.RUNNING,
                                       idempotency_key="direct:x", requested_by="t-agent", dry_run=False))
    [moved] = env.app.state.remediator.recover()
    assert moved.id == left.id and moved.state is ActionState.FAILED and "not repeated" in moved.result["message"]
