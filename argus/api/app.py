"""The HTTP API: FastAPI routers over the store and the loop's health."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI

from argus import __version__
from argus.api import errors, health, incidents
from argus.api.auth import install_audit, require
from argus.exporter import ArgusMetrics, metrics_router
from argus.store.tokens import Role


def create_app(
    *, store: Any, health_provider: Callable[[], dict[str, Any]] | None = None, metrics: ArgusMetrics | None = None
) -> FastAPI:
    app = FastAPI(
        title="Argus",
        version=__version__,
        description="Incidents, reports and remediation for GPU training clusters on Ray.",
    )
    app.state.store = store
    app.state.health = health_provider
    errors.install(app)
    install_audit(app)
    # Health and /metrics are open (liveness probes, Prometheus scrapes; see argus/api/auth.py).
    app.include_router(health.router)
    app.include_router(incidents.router, dependencies=[Depends(require(Role.VIEWER))])
    if metrics is not None:
        app.include_router(metrics_router(metrics))
    return app
