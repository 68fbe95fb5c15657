"""What every page of the web UI shares: its state on the app, rendering a page, and errors as pages.

The API answers errors as JSON (argus/api/errors.py). The UI's routes use `UiRoute`, which turns the same
errors into an HTML page with the same status, and a page that needs a login into a redirect to it; every
UI response gets headers that keep the page from running anything but our own script.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment

from argus.api.errors import Forbidden, Unauthorized
from argus.web.render import environment
from argus.web.sessions import LoginThrottle, Sessions
from core.errors import ArgusError, ConfigError, Conflict, InputError, NotConfigured, NotFound, SourceUnavailable
from core.types import utcnow

HOME = "/ui/incidents"
LOGIN = "/ui/login"
SECURITY_HEADERS = {
    # Our own stylesheet and script only: no inline script, no frames, forms post to us alone.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATUS: tuple[tuple[type[ArgusError], int], ...] = (
    (Unauthorized, 401), (Forbidden, 403), (NotConfigured, 503), (NotFound, 404), (Conflict, 409),
    (InputError, 400), (ConfigError, 400), (SourceUnavailable, 503),
)


@dataclass
class WebUi:
    """The UI's parts, kept on `app.state.web`. An entry point that has a data dir replaces the default with
    one whose secret survives restarts: `WebUi(Sessions(secret_in(settings.data_dir)))`."""

    sessions: Sessions
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    templates: Environment = field(default_factory=environment)
    clock: Callable[[], datetime] = utcnow
    refresh_s: int = 30  # how often the incident list reloads itself; 0: never

    @classmethod
    def ephemeral(cls) -> WebUi:
        """Sessions signed with a secret of this process only: they end when it stops."""
        return cls(Sessions(secrets.token_bytes(32)))


def web_of(request: Request) -> WebUi:
    return request.app.state.web


class LoginRequired(Exception):
    """No usable session: a page redirects to the login, a form post answers 401. A signal to UiRoute, not an
    error anyone sees."""


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a template with what every page shows: who is logged in, their CSRF token, the path."""
    web = web_of(request)
    session = getattr(request.state, "session", None)
    context.setdefault("title", "Argus")
    html = web.templates.get_template(template).render(
        principal=getattr(request.state, "principal", None),
        csrf=web.sessions.csrf(session) if session else "",
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


def error_page(request: Request, status: int, message: str, hint: str | None = None,
               problems: list[str] | None = None) -> HTMLResponse:
    titles = {400: "Bad request", 401: "Not logged in", 403: "Not allowed", 404: "Not found", 409: "Conflict",
              429: "Too many attempts", 503: "Not available"}
    return page(request, "error.html", status, title=titles.get(status, "Error"), status=status,
                message=message, hint=hint, problems=problems or [])


def status_of(exc: ArgusError) -> int:
    """The status the API gives the same error (argus/api/errors.py); 500 for the store's own failures."""
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)


def login_url(request: Request) -> str:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"{LOGIN}?next={quote(target, safe='')}"


class UiRoute(APIRoute):
    """A route whose errors are pages and whose responses carry SECURITY_HEADERS."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginRequired:
                if request.method == "GET":
                    response = RedirectResponse(login_url(request), status_code=303)
                else:
                    response = error_page(request, 401, "your session has ended: log in again",
                                          hint="the form was not sent; log in and send it again")
            except ArgusError as exc:
                response = error_page(request, status_of(exc), exc.message, exc.hint)
            except RequestValidationError as exc:
                problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                            for e in exc.errors()[:10]]
                response = error_page(request, 400, "the request is malformed", "fix the values listed", problems)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return guarded
