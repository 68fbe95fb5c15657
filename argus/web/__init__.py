"""The web page served by `argus serve` under /ui: incidents with their reports and steps, nodes and jobs.

Server-rendered (Jinja2, no CDN, one stylesheet and one small script of our own), behind the API's tokens
(argus/web/access.py). `install(app)` mounts it on the API's app; its routes stay out of the OpenAPI schema.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.staticfiles import StaticFiles

from argus.web import cluster, incidents, login
from argus.web.render import STATIC
from argus.web.ui import UiRoute, WebUi, error_page

_fallback = APIRouter(route_class=UiRoute, include_in_schema=False)


@_fallback.get("/ui/{rest:path}")
def not_a_page(request: Request, rest: str) -> Response:
    return error_page(request, 404, "there is no such page", hint="start from the incident list at /ui/incidents")


ROUTERS = (login.router, incidents.router, cluster.router, _fallback)  # the fallback last: it matches any /ui path


def install(app: FastAPI, web: WebUi | None = None) -> None:
    """Mount the UI: its static files, its pages, and `GET /` leading to them."""
    app.state.web = web or WebUi.ephemeral()
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")  # before the fallback route
    for router in ROUTERS:
        app.include_router(router)
