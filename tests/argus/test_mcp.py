"""`argus mcp`: the MCP SDK's own client, over stdio (the real `argus mcp` subprocess) and streamable HTTP, drives a
lost-node incident through a real Argus API served by uvicorn: read, report, plan, approve. Tokens follow the REST
API's role matrix (a viewer is refused the approval) and the audit log names the caller and `via: mcp`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from argus.mcp_server import ArgusApi, build_mcp
from argus.store.tokens import Role
from argus.wiring import build_reports
from core.settings import load_settings
from core.types import Category, Evidence, Finding, Severity, Subject, SubjectKind
from tests.argus.test_api_control import Env, with_policy
from tests.helpers import served_app

ROOT = Path(__file__).resolve().parents[2]
DEAD_LINE = ("[2026-11-28 10:00:01,000 W 81 81] gcs_node_manager.cc:284: The node with node id: " + "0" * 56 +
             " and address: 10.0.0.11 and node name: 10.0.0.11 has been marked dead because the detector has missed "
             "too many heartbeats from it.")


class Cluster:
    """A real Argus API (remediation in approval mode, four registered nodes) with a lost node's incident and its
    deterministic report."""

    def __init__(self, tmp_path: Path) -> None:
        self.env = Env(tmp_path)
        with_policy(self.env)
        finding = Finding(category=Category.NODE_LOST, reason="NodeMarkedDeadMissedHeartbeats",
                          severity=Severity.CRITICAL, subject=Subject(kind=SubjectKind.NODE, id="0" * 56,
                                                                      name="10.0.0.11"),
                          summary="node 10.0.0.11 was marked dead after missing heartbeats",
                          evidence=(Evidence(source="gcs_server.out", text=DEAD_LINE),), attrs={"node_ip": "10.0.0.11"})
        self.incident, _ = self.env.store.record_finding(finding)
        settings = load_settings(None, data_dir=tmp_path / "data", shared_root=self.env.shared)
        build_reports(settings, self.env.store).write(self.incident.id, llm=False)

    def token(self, role: Role) -> str:
        return self.env.tokens[role]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.env.store.close()


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def data_of(result: Any) -> Any:
    assert not result.is_error, text_of(result)
    return result.structured_content if result.structured_content is not None else json.loads(text_of(result))


async def drive(client: Client, incident_id: str) -> dict[str, Any]:
    """What an agent does with a lost node: list, read, report, runbook, plan, approve."""
    tools = {t.name for t in (await client.list_tools()).tools}
    listed = data_of(await client.call_tool("list_incidents", {"state": "open"}))
    incident = data_of(await client.call_tool("get_incident", {"incident_id": incident_id}))
    report = text_of(await client.call_tool("get_report", {"incident_id": incident_id}))
    runbook = await client.read_resource("argus://runbooks/node_lost")
    planned = data_of(await client.call_tool("plan_actions", {"incident_id": incident_id,
                                                              "steps": ["keep_scene", "drain_node"]}))
    drain = next(a for a in planned["items"] if a["kind"] == "drain_node")
    approved = data_of(await client.call_tool("approve_action", {"action_id": drain["id"]}))
    waiting = data_of(await client.call_tool("job_queue", {"state": "queued"}))
    return {"tools": tools, "listed": listed, "incident": incident, "report": report, "queue": waiting,
            "runbook": "".join(getattr(c, "text", "") for c in runbook.contents), "approved": approved}


def check_driven(seen: dict[str, Any], incident_id: str) -> None:
    assert {"list_incidents", "get_incident", "get_report", "plan_actions", "approve_action", "reject_action",
            "resolve_incident", "list_nodes", "tail_job_logs", "job_queue"} <= seen["tools"]
    assert seen["queue"] == {"items": []}
    assert [i["id"] for i in seen["listed"]["items"]] == [incident_id]
    assert seen["incident"]["incident"]["category"] == "node_lost"
    assert "node_lost" in seen["report"] and "10.0.0.11" in seen["report"]
    assert "# Runbook: node_lost" in seen["runbook"] and "NodeMarkedDeadMissedHeartbeats" in seen["runbook"]
    assert seen["approved"]["action"]["state"] == "approved"


def audit_rows(cluster: Cluster) -> list[Any]:
    rows = cluster.env.store.audit_log.list(limit=1000)
    return [r for r in rows if r.path.startswith(("/v1/actions", "/v1/incidents"))]


def test_over_stdio_an_agent_reads_a_lost_node_and_approves_its_drain(cluster: Cluster) -> None:
    with served_app(cluster.env.app) as url:
        params = StdioServerParameters(command=sys.executable, args=["-m", "argus.cli", "mcp", "--url", url],
                                       env={**os.environ, "ARGUS_TOKEN": cluster.token(Role.OPERATOR),
                                            "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))

        async def session() -> dict[str, Any]:
            async with Client(params, read_timeout_seconds=60) as client:
                return await drive(client, cluster.incident.id)

        seen = asyncio.run(session())
    check_driven(seen, cluster.incident.id)
    rows = audit_rows(cluster)
    assert rows and all(r.actor == "t-operator" and r.detail.get("via") == "mcp" for r in rows), rows


def test_over_http_each_caller_brings_its_token_and_a_viewer_may_not_approve(cluster: Cluster) -> None:
    with served_app(cluster.env.app) as url:
        mcp_app = build_mcp(ArgusApi(url)).streamable_http_app()
        with served_app(mcp_app, lifespan="on") as mcp_url:

            async def as_role(role: Role | None) -> Client:
                import httpx2

                headers = {"Authorization": f"Bearer {cluster.token(role)}"} if role else {}
                from mcp.client.streamable_http import streamable_http_client

                return Client(streamable_http_client(f"{mcp_url}/mcp",  # type: ignore[arg-type]
                                                     http_client=httpx2.AsyncClient(headers=headers, timeout=60)))

            async def session() -> tuple[dict[str, Any], Any, Any, Any]:
                async with await as_role(Role.OPERATOR) as operator:
                    seen = await drive(operator, cluster.incident.id)
                    planned = data_of(await operator.call_tool("plan_actions", {"incident_id": cluster.incident.id,
                                                                                "steps": ["resubmit_job"]}))
                async with await as_role(Role.VIEWER) as viewer:
                    read = await viewer.call_tool("get_incident", {"incident_id": cluster.incident.id})
                    refused = await viewer.call_tool("approve_action", {"action_id": planned["items"][0]["id"]})
                async with await as_role(None) as nobody:
                    anonymous = await nobody.call_tool("list_incidents", {})
                return seen, read, refused, anonymous

            seen, read, refused, anonymous = asyncio.run(session())
    check_driven(seen, cluster.incident.id)
    assert not read.is_error
    assert refused.is_error and "403" in text_of(refused) and "operator" in text_of(refused), text_of(refused)
    assert anonymous.is_error and "Authorization: Bearer" in text_of(anonymous)
    rows = audit_rows(cluster)
    assert {(r.actor, r.status) for r in rows} >= {("t-operator", 200), ("t-viewer", 403)}
    assert all(r.detail.get("via") == "mcp" for r in rows)


@pytest.mark.parametrize("arguments", [
    {"incident_id": "x" * 65}, {"incident_id": "../../v1/tokens"}, {"incident_id": ""}, {},
    {"incident_id": "inc-1", "extra": "y" * 100_000},
])
def test_hostile_tool_arguments_are_refused_before_argus_is_called(arguments: dict[str, Any]) -> None:
    calls: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={})

    server = build_mcp(ArgusApi("http://argus.invalid", token="t", transport=httpx.MockTransport(record)))

    async def call() -> Any:
        async with Client(server) as client:
            return await client.call_tool("get_incident", arguments)

    result = asyncio.run(call())
    if "extra" in arguments:  # unknown arguments are ignored; the id is checked and the call made once
        assert not result.is_error and [c.url.path for c in calls] == ["/v1/incidents/inc-1"]
    else:
        assert result.is_error and calls == []


def test_the_metric_tools_ask_argus_for_described_queries_only() -> None:
    """query_metrics passes the description (Argus writes the PromQL: argus/metric_queries.py); a PromQL expression
    in place of a metric name is refused before Argus is called."""
    calls: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={"promql": "max by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "series": []})

    server = build_mcp(ArgusApi("http://argus.invalid", token="t", transport=httpx.MockTransport(record)))

    async def call(tool: str, arguments: dict[str, Any]) -> Any:
        async with Client(server) as client:
            return await client.call_tool(tool, arguments)

    answered = asyncio.run(call("query_metrics", {"metric": "DCGM_FI_DEV_GPU_UTIL", "match": ["Hostname=gpu-3"],
                                                  "agg": "max", "by": ["Hostname"], "minutes": 30}))
    assert data_of(answered)["promql"].startswith("max by (Hostname)")
    (asked,) = calls
    assert asked.url.path == "/v1/metrics/query_range"
    assert sorted(asked.url.params.multi_items()) == [
        ("agg", "max"), ("by", "Hostname"), ("fn", "none"), ("match", "Hostname=gpu-3"),
        ("metric", "DCGM_FI_DEV_GPU_UTIL"), ("minutes", "30")]
    assert asyncio.run(call("incident_metrics", {"incident_id": "inc-1"})) and calls[-1].url.path == \
        "/v1/incidents/inc-1/metrics"
    refused = asyncio.run(call("query_metrics", {"metric": 'sum(rate(up[5m])) or vector(1)'}))
    assert refused.is_error and len(calls) == 2


def test_argus_unreachable_or_refusing_is_said_with_what_to_do() -> None:
    refusing = httpx.MockTransport(lambda request: httpx.Response(
        404, json={"error": "NotFound", "message": "incident inc-0 not found", "hint": "list them"}))
    down = build_mcp(ArgusApi("http://127.0.0.1:9", token="t"))
    missing = build_mcp(ArgusApi("http://argus.invalid", token="t", transport=refusing))

    async def call(server: Any) -> str:
        async with Client(server) as client:
            result = await client.call_tool("get_incident", {"incident_id": "inc-0"})
            assert result.is_error
            return text_of(result)

    assert "did not answer" in asyncio.run(call(down)) and "argus mcp --url" in asyncio.run(call(down))
    said = asyncio.run(call(missing))
    assert "404 NotFound" in said and "incident inc-0 not found" in said and "list them" in said


@pytest.mark.llm
def test_a_small_agent_reads_the_open_incident_and_its_report_through_mcp(cluster: Cluster, llm_server: Any) -> None:
    """The stage's agent loop (langchain on the local llama-server) with a viewer token: it lists, takes the id from
    the list and fetches that incident's report; it is offered no tool that changes anything."""
    from stage.localstack.mcp_agent import run_agent

    with served_app(cluster.env.app) as url:
        server = build_mcp(ArgusApi(url, token=cluster.token(Role.VIEWER)))

        async def session() -> Any:
            async with Client(server) as client:
                return await run_agent(client, base_url=llm_server.base_url, model=llm_server.model,
                                       task="First call list_incidents with state open. Then call get_report with "
                                            "the id of the first incident it lists. Then answer with that "
                                            "incident's category.")

        transcript = asyncio.run(session())
    called = [(s.tool, s.ok) for s in transcript.steps]
    reports = [s for s in transcript.steps if s.tool == "get_report" and s.ok]
    assert ("list_incidents", True) in called, called
    assert reports and reports[0].arguments == {"incident_id": cluster.incident.id}, called
    assert "node_lost" in reports[0].result and "approve_action" not in {s.tool for s in transcript.steps}


def test_calls_in_one_event_loop_share_one_pooled_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's burst of tool calls reuses one client's connections; another event loop gets its own (a client's
    connections belong to the loop that opened them)."""
    import argus.mcp_server as mcp_module

    opened: list[httpx.AsyncClient] = []
    real = httpx.AsyncClient

    def counting(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
        opened.append(real(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(mcp_module.httpx, "AsyncClient", counting)
    api = ArgusApi("http://argus.invalid", token="t",
                   transport=httpx.MockTransport(lambda request: httpx.Response(200, json={"items": []})))
    server = build_mcp(api)

    async def burst() -> None:
        async with Client(server) as client:
            for _ in range(5):
                assert not (await client.call_tool("get_incident", {"incident_id": "inc-1"})).is_error
        await api.aclose()

    asyncio.run(burst())
    assert len(opened) == 1 and opened[0].is_closed
    asyncio.run(burst())
    assert len(opened) == 2
