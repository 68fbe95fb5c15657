"""Argus for ops agents over the Model Context Protocol: `argus mcp` (stdio, or streamable HTTP with `--http`).

Why the MCP server is a client of Argus's REST API, not a second door into the store: every tool call is one REST
call carrying the caller's own token, so MCP follows exactly the REST API's role matrix (a viewer token reads, an
operator or agent token plans, approves and resolves, the remediation policy's guards apply to an agent) and is
audited the same way (the audit row names the token's owner, with `via: mcp`). It needs no database and no Ray: it
runs beside the agent (stdio, the token from ARGUS_TOKEN) or as a small service of its own (HTTP, each request's
`Authorization: Bearer` header forwarded; a request without one is refused, never served with someone else's).

Tools: incidents (list, read with findings, the report in Markdown, resolve), remediation steps (list, plan,
approve, reject), nodes and jobs (list, a job's log tail), Argus's health. Resources: one runbook per failure
category (`argus://runbooks/{category}`: what the rules that decide it look for and the recommended actions).
Prompt: `triage_incident`, the order in which an agent should read and act on one incident.
"""

from __future__ import annotations

import asyncio
import weakref
from functools import cache
from typing import Annotated, Any, Literal

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from argus.api.auth import VIA_HEADER, bearer_token
from core.types import Category

MAX_LOG_LINES = 2000
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
ACT = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

IncidentId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                  description="an incident id as list_incidents gives it")]
ActionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                description="a step id as list_actions or plan_actions gives it")]
Reason = Annotated[str, Field(min_length=1, max_length=500, description="why, in words people read in the audit log")]


class ArgusApi:
    """Argus's REST API as the tools call it: one request per call, with the caller's token, over one pooled client
    per event loop (an agent's burst of calls reuses its connections instead of opening one each)."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`token`: the one caller's token (stdio); over HTTP each request brings its own and this stays None."""
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.transport = transport
        # A client's connections belong to the loop that opened them: one client per loop, forgotten with the loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()

    def client(self) -> httpx.AsyncClient:
        """This event loop's client, opened on first use (no token in it: each call sends its caller's)."""
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None or found.is_closed:
            found = self._clients[loop] = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s,
                                                            transport=self.transport)
        return found

    async def aclose(self) -> None:
        """Close this event loop's client (the others close with their loops)."""
        found = self._clients.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found.aclose()

    async def call(self, ctx: Context | None, method: str, path: str, *, params: dict[str, Any] | None = None,
                   body: Any = None, accept: str = "application/json") -> Any:
        token = self.token_of(ctx)
        headers = {"Authorization": f"Bearer {token}", "Accept": accept, VIA_HEADER: "mcp"}
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            answer = await self.client().request(method, path, params=query, json=body, headers=headers)
        except httpx.HTTPError as err:
            raise ToolError(f"Argus at {self.base_url} did not answer {method} {path}: {err}; is `argus serve` "
                            "running there (argus mcp --url)?") from None
        if answer.status_code >= 400:
            raise ToolError(_error_text(answer, method, path))
        if accept != "application/json":
            return answer.text
        return answer.json()

    def token_of(self, ctx: Context | None) -> str:
        request = _http_request(ctx)
        if request is not None:  # HTTP: the caller's own token, or nothing
            token = bearer_token(request.headers.get("authorization"))
            if token is None:
                raise ToolError("this MCP server needs your Argus token: send `Authorization: Bearer <token>` "
                                "(create one with `argus tokens create NAME --role viewer|operator|agent`)")
            return token
        if not self.token:
            raise ToolError("no Argus token: set ARGUS_TOKEN for `argus mcp` (create one with "
                            "`argus tokens create NAME --role viewer|operator|agent`)")
        return self.token


def _http_request(ctx: Context | None) -> Any:
    if ctx is None:
        return None
    try:
        return ctx.request_context.request
    except (ValueError, AttributeError):  # stdio, or outside a request
        return None


def _error_text(answer: httpx.Response, method: str, path: str) -> str:
    try:
        body = answer.json()
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("message"):
        hint = f" ({body['hint']})" if body.get("hint") else ""
        return f"Argus refused {method} {path} with {answer.status_code} {body.get('error', '')}: " \
               f"{body['message']}{hint}"
    return f"Argus answered {answer.status_code} to {method} {path}: {answer.text[:300]}"


def build_mcp(api: ArgusApi) -> MCPServer:
    """The MCP server: tools, runbooks and the triage prompt over `api`."""
    mcp: MCPServer = MCPServer(
        "argus", title="Argus",
        instructions="Argus watches GPU training jobs on Ray: read open incidents and their reports first, then plan "
                     "or approve remediation steps. Facts come from the report's evidence; say which line you rely on.")

    @mcp.tool(annotations=READ)
    async def list_incidents(ctx: Context,
                             state: Literal["open", "mitigating", "resolved"] | None = None,
                             category: Category | None = None,
                             limit: Annotated[int, Field(ge=1, le=200)] = 20) -> dict[str, Any]:
        """Incidents, newest first: id, category, severity, state, subject (job or node), summary."""
        return await api.call(ctx, "GET", "/v1/incidents", params={
            "state": state, "category": category.value if category else None, "limit": limit})

    @mcp.tool(annotations=READ)
    async def get_incident(ctx: Context, incident_id: IncidentId) -> dict[str, Any]:
        """One incident and the findings (detector outputs with their evidence lines) folded into it."""
        return await api.call(ctx, "GET", f"/v1/incidents/{incident_id}")

    @mcp.tool(annotations=READ)
    async def get_report(ctx: Context, incident_id: IncidentId) -> str:
        """The incident's root-cause report in Markdown: verdict, evidence lines, timeline, recommended actions and
        what Argus did."""
        return str(await api.call(ctx, "GET", f"/v1/incidents/{incident_id}/report", accept="text/markdown"))

    @mcp.tool(annotations=CHANGE)
    async def resolve_incident(ctx: Context, incident_id: IncidentId, reason: Reason) -> dict[str, Any]:
        """Mark the incident resolved (needs an operator or agent token); people are told."""
        return await api.call(ctx, "POST", f"/v1/incidents/{incident_id}:resolve", body={"reason": reason})

    @mcp.tool(annotations=READ)
    async def list_actions(ctx: Context, incident_id: IncidentId | None = None,
                           state: Literal["planned", "approved", "running", "succeeded", "failed", "rejected",
                                          "skipped"] | None = None) -> dict[str, Any]:
        """Remediation steps (of one incident, or all): kind, state, dry run or not, preview of what it would do."""
        return await api.call(ctx, "GET", "/v1/actions", params={"incident_id": incident_id, "state": state})

    @mcp.tool(annotations=CHANGE)
    async def plan_actions(ctx: Context, incident_id: IncidentId,
                           steps: Annotated[list[str] | None, Field(max_length=10, description=(
                               "step kinds to propose (e.g. keep_scene, drain_node, resubmit_job); "
                               "omit for the remediation policy's own plan"))] = None) -> dict[str, Any]:
        """Plan remediation steps for the incident: the policy's plan, or the steps given. Steps wait for approval
        unless the policy runs them itself."""
        body = {"plan": "policy"} if not steps else {"steps": [{"action": kind} for kind in steps]}
        return await api.call(ctx, "POST", f"/v1/incidents/{incident_id}/actions", body=body)

    @mcp.tool(annotations=ACT)
    async def approve_action(ctx: Context, action_id: ActionId) -> dict[str, Any]:
        """Approve a planned step (operator; an agent token only for the kinds the policy lets agents approve).
        Argus runs it within its guards (rate limits, protected nodes and jobs)."""
        return await api.call(ctx, "POST", f"/v1/actions/{action_id}:approve")

    @mcp.tool(annotations=CHANGE)
    async def reject_action(ctx: Context, action_id: ActionId, reason: Reason) -> dict[str, Any]:
        """Reject a planned step; it never runs."""
        return await api.call(ctx, "POST", f"/v1/actions/{action_id}:reject", body={"reason": reason})

    @mcp.tool(annotations=READ)
    async def list_nodes(ctx: Context) -> dict[str, Any]:
        """The registered GPU nodes: state (online, draining, offline...), pool, GPUs, labels."""
        return await api.call(ctx, "GET", "/v1/nodes")

    @mcp.tool(annotations=READ)
    async def list_jobs(ctx: Context) -> dict[str, Any]:
        """The jobs Argus knows (submitted through it or adopted from Ray): submission id, state, owner."""
        return await api.call(ctx, "GET", "/v1/jobs")

    @mcp.tool(annotations=READ)
    async def job_queue(ctx: Context, state: Literal["all", "queued", "started", "finished", "expired", "cancelled",
                                                     "failed"] = "all") -> dict[str, Any]:
        """Argus's job queue, oldest first: each job's gang (nodes × GPUs in a pool), its state and the reason it
        waits or waited ("waiting for 2 nodes × 8 GPUs in pool h20: 1 node has 8 free")."""
        return await api.call(ctx, "GET", "/v1/jobs/queue", params={"state": None if state == "all" else state})

    @mcp.tool(annotations=READ)
    async def tail_job_logs(ctx: Context, submission_id: Annotated[str, Field(
                                min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")],
                            lines: Annotated[int, Field(ge=1, le=MAX_LOG_LINES)] = 200) -> str:
        """The last `lines` lines of a job's driver log, as Ray keeps it."""
        text = str(await api.call(ctx, "GET", f"/v1/jobs/{submission_id}/logs", accept="text/plain"))
        return "\n".join(text.splitlines()[-lines:])

    @mcp.tool(annotations=READ)
    async def incident_metrics(ctx: Context, incident_id: IncidentId) -> dict[str, Any]:
        """GPU and host readings of the incident's nodes from 15 minutes before it to 2 minutes after: per node,
        GPU utilisation, memory, temperature, power, the last Xid and host memory (min, max, last)."""
        return await api.call(ctx, "GET", f"/v1/incidents/{incident_id}/metrics")

    @mcp.tool(annotations=READ)
    async def query_metrics(
            ctx: Context,
            metric: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$", description=(
                "one metric, e.g. DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, ray_node_mem_used"))],
            match: Annotated[list[str], Field(max_length=10, description=(
                "exact label matchers, label=value or label!=value, e.g. Hostname=gpu-3"))] = [],  # noqa: B006
            fn: Literal["none", "rate", "increase", "avg_over_time", "max_over_time", "min_over_time"] = "none",
            agg: Literal["none", "avg", "max", "min", "sum", "count"] = "none",
            by: Annotated[list[str], Field(max_length=5, description="labels the aggregation keeps")] = [],  # noqa: B006
            minutes: Annotated[int, Field(ge=1, le=1440)] = 15,
            end: Annotated[str | None, Field(description="RFC 3339 end of the range; default now")] = None,
    ) -> dict[str, Any]:
        """One metric's series over the last `minutes` (or up to `end`), read-only through Argus: Argus writes the
        PromQL (returned as `promql`), at most 50 series of 1000 points."""
        return await api.call(ctx, "GET", "/v1/metrics/query_range", params={
            "metric": metric, "match": match or None, "fn": fn, "agg": agg, "by": by or None, "minutes": minutes,
            "end": end})

    @mcp.tool(annotations=READ)
    async def argus_health(ctx: Context) -> dict[str, Any]:
        """What Argus can and cannot see now (Ray, Prometheus, the database) and its alert inbox."""
        return await api.call(ctx, "GET", "/v1/health")

    @mcp.resource("argus://runbooks/{category}", mime_type="text/markdown",
                  description="What decides a failure category and what to do about it.")
    def runbook(category: str) -> str:
        try:
            return runbook_text(Category(category))
        except ValueError:
            raise ResourceError(f"no runbook for {category!r}; categories: "
                                f"{', '.join(c.value for c in Category)}") from None

    @mcp.prompt(title="Triage an incident")
    def triage_incident(incident_id: IncidentId) -> str:
        """The order in which to read and act on one incident."""
        return (f"Triage Argus incident {incident_id}.\n"
                f"1. get_incident {incident_id}: its category, subject and findings.\n"
                f"2. get_report {incident_id}: the verdict and the evidence lines it rests on; quote the lines you "
                "rely on, and say so where the report says the evidence is thin.\n"
                f"3. Read the runbook argus://runbooks/<category> for that category.\n"
                f"4. list_actions incident_id={incident_id}: what is planned or already ran. If nothing is planned, "
                "plan_actions with the policy's plan. Approve a step only when the evidence supports it and its "
                "preview touches what the report names; otherwise leave it for a person and say why.\n"
                "5. Resolve the incident only when the job runs again or the node is back, and say what you saw.")

    return mcp


@cache
def runbook_text(category: Category) -> str:
    """The category's runbook: the recommended actions (rca/actions.yaml) and what the rules deciding it read
    (detectors/rules), from the data both already hold."""
    from detectors.engine import load_rules
    from rca.actions import load_catalog

    actions = load_catalog().by_category.get(category, ())
    rules = [r for r in load_rules().rules if r.category is category and r.permanent]
    lines = [f"# Runbook: {category.value}", "", "## What to do", ""]
    lines += [f"- {a.text}" for a in actions] or ["- (no recommended action is defined)"]
    lines += ["", "## What Argus reads as this failure (its rules; the first fitting one decides)", ""]
    for rule in sorted(rules, key=lambda r: -r.priority)[:40]:
        what = " ".join((rule.description or "").split())
        then = f" Then: {' '.join(rule.action.split())}" if rule.action else ""
        lines.append(f"- **{rule.reason}**: {what}{then}")
    return "\n".join(lines) + "\n"
