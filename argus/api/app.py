"""The HTTP API: FastAPI routers over the store and the loop's health."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI

from argus import __version__
from argus.api import actions, agents, alerts, errors, health, jobs, nodes, ops
from argus.api import incidents as incident_routes
from argus.api import metric_queries as metric_routes
from argus.api.auth import install_audit, require
from argus.api.limits import MAX_BODY_BYTES, BodyLimit, InFlight
from argus.control_plane import ControlPlane
from argus.exporter import ArgusMetrics, metrics_router
from argus.incidents.alert_filer import LOCAL_HOLDER, AlertFiler
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.store.tokens import Role
from argus.web import install as install_web
from argus.web.ui import WebUi
from core.readers import Readers

if TYPE_CHECKING:
    from argus.agents.inbox import AgentInbox
    from argus.approval_links import ApprovalLinks
    from argus.leader import LeaderView
    from argus.metric_queries import MetricQueries
    from argus.store.store import Store
    from remediation.runner import Remediator


def create_app(
    *,
    store: Store,
    health_provider: Callable[[], dict[str, Any]] | None = None,
    metrics: ArgusMetrics | None = None,
    control: ControlPlane | None = None,
    remediator: Remediator | None = None,
    incidents: IncidentDesk | None = None,
    approval_links: ApprovalLinks | None = None,
    web: WebUi | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    node_agents: AgentInbox | None = None,
    leader: Callable[[], LeaderView] | None = None,
    alert_filer: AlertFiler | None = None,
    readers: Readers | None = None,
    metric_queries: MetricQueries | None = None,
) -> FastAPI:
    """The API. Without `control` the job, node and ops routes answer 503 (NotConfigured), as the remediation
    routes do without `remediator`. `incidents`: the desk that files and resolves incidents and tells its
    subscribers; by default one over `store` that tells nobody. `leader`: this replica's view of the leader lease
    (argus/leader.py), None for a single replica. `alert_filer`: files the alerts Alertmanager's webhook queues (by
default one over `store` and the desk, started by the first webhook). `readers`: where the requests being answered are
counted, for the background workers that give way to them (core/readers.py); the default filer's too.
`metric_queries`: series read through Argus from its Prometheus (503 without). Routes read these through
argus/api/state.py."""
    app = FastAPI(
        title="Argus",
        version=__version__,
        description="Incidents, reports and remediation for GPU training clusters on Ray.",
    )
    app.state.store = store
    app.state.health = health_provider
    app.state.control = control
    app.state.remediator = remediator
    app.state.incidents = incidents or IncidentDesk(store, correlator=Correlator(store))
    app.state.alert_filer = alert_filer or AlertFiler(store, app.state.incidents, holder=LOCAL_HOLDER)
    app.state.approval_links = approval_links
    app.state.agents = node_agents
    app.state.leader = leader
    app.state.metric_queries = metric_queries
    errors.install(app)
    install_audit(app)
    # Health and /metrics are open (liveness probes, Prometheus scrapes; see argus/api/auth.py).
    app.include_router(health.router)
    app.include_router(incident_routes.router, dependencies=[Depends(require(Role.VIEWER))])
    # Each route of these declares its own role: reads need viewer, steps operator, registering a node admin.
    app.include_router(jobs.router)
    app.include_router(nodes.router)
    app.include_router(ops.router)
    app.include_router(metric_routes.router)
    app.include_router(actions.router)
    app.include_router(alerts.router)
    if node_agents is not None:  # an Argus without node agents does not serve their routes (nor document them)
        app.include_router(agents.router)  # node agents' batches (node_agent token) and their list (viewer)
    if metrics is not None:
        app.include_router(metrics_router(metrics))
    install_web(app, web)  # the web page under /ui (and GET / leading there), out of the OpenAPI schema
    errors.document_errors(app)  # every route's error statuses in the OpenAPI document, with the error model
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: the outermost of ours
    reading = readers or Readers()
    app.add_middleware(InFlight, count=reading, background=frozenset({alerts.ALERTMANAGER_PATH}))
    if app.state.alert_filer.readers is None:
        app.state.alert_filer.readers = reading
    return app
