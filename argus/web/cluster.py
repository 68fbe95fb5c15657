"""The cluster pages: the node registry (states, labels, transitions, drains) beside Ray's own view of its
nodes, one node's history, and the jobs Ray runs. Ray not configured or not answering is a message on the
page (503), not an error page: the registry and the rest of the UI still work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from argus.web.access import Viewer
from argus.web.ui import UiRoute, page
from collectors.ray_api import RayStateApi
from control.nodes import NAME_RE, NodeRecord, NodeState, allowed_targets
from control.queue import QueueState
from core.errors import ArgusError, InputError, NotConfigured
from core.types import Action

QUEUE_ENDED_SHOWN = 10  # the jobs that left the queue without starting (expired, cancelled, failed) shown

router = APIRouter(route_class=UiRoute, include_in_schema=False)
RAY_TIMEOUT_S = 3.0
RECENT_DRAINS = 20
_NO_CONTROL = ("this Argus serves no control plane, so Ray is not asked",
               "start Argus with `argus serve` and ray_dashboard_url set")


def registry_of(request: Request) -> Any:
    """The node registry: the control plane's, else the store's (the same table), else None."""
    control = request.app.state.control
    if control is not None:
        return control.registry
    store = request.app.state.store
    return store.nodes() if hasattr(store, "nodes") else None  # a store without the node registry (tests)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def ray_nodes(request: Request) -> tuple[list[dict[str, Any]], tuple[str, str | None] | None]:
    """Ray's nodes as rows, or why there are none to show (message, hint)."""
    control = request.app.state.control
    if control is None:
        return [], _NO_CONTROL
    try:
        raw = RayStateApi(control.jobs.dashboard_url, RAY_TIMEOUT_S).call("list_nodes", detail=True)
    except ArgusError as exc:
        return [], (exc.message, exc.hint)
    rows = []
    for node in raw:
        resources = _get(node, "resources_total") or {}
        labels = _get(node, "labels") or {}
        rows.append({
            "id": str(_get(node, "node_id") or ""), "ip": str(_get(node, "node_ip") or ""),
            "name": str(_get(node, "node_name") or ""), "state": str(_get(node, "state") or ""),
            "head": bool(_get(node, "is_head_node")), "message": str(_get(node, "state_message") or ""),
            "gpus": resources.get("GPU", 0), "cpus": resources.get("CPU", 0),
            "labels": {str(k): str(v) for k, v in labels.items() if not str(k).startswith("ray.io/")},
        })
    return sorted(rows, key=lambda r: (not r["head"], r["ip"])), None


def _addresses(record: NodeRecord) -> set[str]:
    found = {record.name}
    if record.ray_node_id:
        found.add(record.ray_node_id)
    try:
        found.add(record.spec.ray_node_ip)
    except InputError:  # a host name without node_ip: Ray's address is not known here
        pass
    return found


def drains_of(actions: list[Action], record: NodeRecord | None = None) -> list[Action]:
    """The newest drain steps, of one node when `record` is given."""
    drains = [a for a in actions if a.kind == "drain_node"]
    if record is not None:
        names = _addresses(record)
        drains = [a for a in drains if a.target.id in names or (a.target.name or "") in names]
    return drains[-RECENT_DRAINS:][::-1]


def state_machine() -> list[tuple[str, list[str]]]:
    return [(s.value, sorted(t.value for t in allowed_targets(s))) for s in NodeState]


@router.get("/ui/nodes")
def nodes_page(request: Request, viewer: Viewer) -> Response:
    registry = registry_of(request)
    records = registry.list() if registry is not None else []
    last = {}
    for record in records:
        history = registry.transitions(record.name)
        last[record.name] = history[-1] if history else None
    ray_rows, ray_problem = ray_nodes(request)
    return page(request, "nodes.html", title="Nodes", records=records, last=last, ray_rows=ray_rows,
                ray_problem=ray_problem, drains=drains_of(request.app.state.store.list_actions()),
                machine=state_machine(), counts={s.value: sum(r.state is s for r in records) for s in NodeState})


@router.get("/ui/nodes/{name}")
def node_page(request: Request, name: str, viewer: Viewer) -> Response:
    if len(name) > 63 or not NAME_RE.fullmatch(name):
        raise InputError(f"{name[:70]!r} is not a node name", hint="names are lowercase letters, digits, '.' and '-'")
    registry = registry_of(request)
    if registry is None:
        raise NotConfigured("this Argus keeps no node registry", hint="start it with `argus serve`")
    record = registry.get(name)
    return page(request, "node.html", title=f"Node {name}", record=record, transitions=registry.transitions(name),
                next_states=sorted(s.value for s in allowed_targets(record.state)),
                drains=drains_of(request.app.state.store.list_actions(), record))


@router.get("/ui/jobs")
def jobs_page(request: Request, viewer: Viewer) -> Response:
    flag = request.query_params.getlist("all")
    if len(flag) > 1 or (flag and flag[0] not in ("", "0", "1")):
        raise InputError("all must be 0 or 1, given once", hint="/ui/jobs?all=1 also lists jobs not submitted by Argus")
    all_jobs = bool(flag) and flag[0] == "1"
    control = request.app.state.control
    if control is None:
        return page(request, "jobs.html", 503, title="Jobs", jobs=[], problem=_NO_CONTROL, all_jobs=all_jobs,
                    waiting=[], left=[])
    # the queue is in the store: shown even while Ray does not answer; a user's login sees that user's jobs only
    mine = viewer.scoped
    waiting = control.queue.store.list(states=[QueueState.QUEUED], owner=mine)
    left = control.queue.store.list(states=[QueueState.EXPIRED, QueueState.CANCELLED, QueueState.FAILED],
                                    owner=mine, limit=QUEUE_ENDED_SHOWN)[::-1]
    try:
        jobs = [j for j in control.jobs.list(all_jobs=all_jobs) if mine is None or j.owner == mine]
    except ArgusError as exc:
        return page(request, "jobs.html", 503, title="Jobs", jobs=[], problem=(exc.message, exc.hint),
                    all_jobs=all_jobs, waiting=waiting, left=left)
    return page(request, "jobs.html", title="Jobs", jobs=jobs, problem=None, all_jobs=all_jobs, waiting=waiting,
                left=left)
