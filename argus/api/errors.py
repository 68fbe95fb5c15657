"""Our errors as JSON: every error body is {"error": kind, "message": ..., "hint": ...}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import (
    ArgusError,
    ConfigError,
    Conflict,
    InputError,
    NotConfigured,
    NotFound,
    SourceUnavailable,
    StoreError,
)


class Unauthorized(ArgusError):
    """No usable bearer token: missing, malformed, unknown, revoked or expired (401)."""


class Forbidden(ArgusError):
    """The token is valid but its role may not call this route (403)."""


class GuardRefused(Forbidden):
    """The role may call the route, but the remediation policy's guards refuse this call now (403): the ops
    agent's direct mutations are held to them (argus/api/agent_policy.py)."""


_STATUS: tuple[tuple[type[ArgusError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotConfigured, 503),
    (NotFound, 404),
    (Conflict, 409),
    (InputError, 400),
    (ConfigError, 400),
    (SourceUnavailable, 503),
    (StoreError, 500),
)


_FASTAPI_PARSE_ERROR = "There was an error parsing the body"
_HTTP_HINTS = {404: "the API's routes are listed at /docs and /openapi.json",
               405: "the API's routes and their methods are listed at /docs",
               413: "send a smaller body: requests carry specs and reasons, not data"}


def error_body(kind: str, message: str, hint: str | None = None, **extra) -> dict:
    return {"error": kind, "message": message, "hint": hint, **extra}


def install(app: FastAPI) -> None:
    @app.exception_handler(ArgusError)
    async def _argus(_: Request, exc: ArgusError) -> JSONResponse:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        # RFC 6750: a 401 names the scheme the client should use.
        headers = {"WWW-Authenticate": 'Bearer realm="argus"'} if status == 401 else None
        return JSONResponse(error_body(type(exc).__name__, exc.message, exc.hint), status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it cannot parse at all (nested past the recursion limit, say) with a bare 400;
        # to a client that is a malformed body like any other: 422, in our shape.
        if exc.status_code == 400 and exc.detail == _FASTAPI_PARSE_ERROR:
            return JSONResponse(error_body("InvalidRequest", "the request body could not be parsed",
                                           "send one JSON object, nested at most a few levels"), status_code=422)
        kind = {404: "NotFound", 405: "MethodNotAllowed", 413: "BodyTooLarge"}.get(exc.status_code, "HTTPError")
        return JSONResponse(error_body(kind, str(exc.detail), _HTTP_HINTS.get(exc.status_code)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg", "")}
            for e in exc.errors()[:20]
        ]
        return JSONResponse(
            error_body("InvalidRequest", "the request is malformed", "fix the fields listed", problems=problems),
            status_code=422,
        )
