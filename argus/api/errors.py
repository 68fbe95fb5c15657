"""Our errors as JSON: every error body is {"error": kind, "message": ..., "hint": ...}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from core.errors import ArgusError, ConfigError, InputError, NotFound, SourceUnavailable, StoreError


class Unauthorized(ArgusError):
    """No usable bearer token: missing, malformed, unknown, revoked or expired (401)."""


class Forbidden(ArgusError):
    """The token is valid but its role may not call this route (403)."""


_STATUS: tuple[tuple[type[ArgusError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (InputError, 400),
    (ConfigError, 400),
    (SourceUnavailable, 503),
    (StoreError, 500),
)


def error_body(kind: str, message: str, hint: str | None = None, **extra) -> dict:
    return {"error": kind, "message": message, "hint": hint, **extra}


def install(app: FastAPI) -> None:
    @app.exception_handler(ArgusError)
    async def _argus(_: Request, exc: ArgusError) -> JSONResponse:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        # RFC 6750: a 401 names the scheme the client should use.
        headers = {"WWW-Authenticate": 'Bearer realm="argus"'} if status == 401 else None
        return JSONResponse(error_body(type(exc).__name__, exc.message, exc.hint), status_code=status, headers=headers)

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
