"""Our errors as JSON: every error body is {"error": kind, "message": ..., "hint": ...}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from core.errors import (
    ArgusError,
    ConfigError,
    Conflict,
    InputError,
    NotAllowed,
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
    (NotAllowed, 403),
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
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it cannot parse at all (nested past the recursion limit, say) with a bare 400;
        # to a client that is a malformed body like any other: 422, in our shape.
        if exc.status_code == 400 and exc.detail == _FASTAPI_PARSE_ERROR:
            return JSONResponse(error_body("InvalidRequest", "the request body could not be parsed",
                                           "send one JSON object, nested at most a few levels"), status_code=422)
        kind = {404: "NotFound", 405: "MethodNotAllowed", 413: "BodyTooLarge"}.get(exc.status_code, "HTTPError")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return JSONResponse(error_body(kind, str(exc.detail), _HTTP_HINTS.get(exc.status_code)),
                            status_code=exc.status_code, headers=headers)

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


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path, asked of the routes themselves (Starlette's `matches`, as its
    router dispatches). Starlette's own Allow names the methods of the first route whose path matched, and FastAPI
    makes one route per method, so GET+POST /v1/nodes said "GET" alone (RFC 9110 wants all of them)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


class ErrorBody(BaseModel):
    """Every error the API answers, whatever its status. `problems` (422): each malformed field and what is wrong
    with it; some errors add fields of their own (a follower's NotLeader names the leader)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="the kind of error, e.g. NotFound, Conflict, SourceUnavailable")
    message: str = Field(description="what went wrong, naming the thing")
    hint: str | None = Field(default=None, description="what to do about it")
    problems: list[dict[str, str]] | None = None


_MEANING = {
    400: "the request is well formed but its values are not usable (the message says which)",
    401: "no usable bearer token",
    403: "the token's role may not call this route, or the remediation policy refuses the call now",
    404: "the thing named in the path does not exist",
    409: "the thing is not in a state that allows this now",
    413: "the body is over the limit",
    422: "the request is malformed (`problems` lists the fields)",
    500: "the database refused the change (the message says why)",
    503: "Argus cannot do this now: a source it needs (the database, Ray, the control plane) is down or not configured",
}
_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ERRORS_KEY = "x-argus-errors"  # a route's own error statuses, beside those its form implies (see document_errors)


def document_errors(app: FastAPI) -> None:
    """Each operation of the OpenAPI document lists every error status it can answer, with ErrorBody: 500 and 503
    everywhere (the database), 400 and 422 where it takes input, 401 and 403 where a token is needed, 404 where the
    path (or an `*_id` filter) names a thing, 409 and 413 where the call changes something, and what a route adds
    in its `openapi_extra` as `{ERRORS_KEY: [codes]}` (a signed link's 403, a body naming a job). Read from the
    document FastAPI generates (its security, path and method), so a route added later is documented too."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()  # FastAPI's, cached by it: what is added below is set, never appended, so it stays once
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorBody"] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                codes = {500, 503}
                if operation.get("parameters") or operation.get("requestBody"):
                    codes |= {400, 422}
                if operation.get("security"):
                    codes |= {401, 403}
                if "{" in path or any(p.get("in") == "query" and p.get("name", "").endswith("_id")
                                      for p in operation.get("parameters", ())):
                    codes.add(404)  # the thing the path (or an id filter) names may not exist
                if method.upper() in _MUTATING:
                    codes |= {409, 413}
                codes |= set(operation.pop(ERRORS_KEY, ()))
                responses = operation.setdefault("responses", {})
                for code in sorted(codes):
                    responses[str(code)] = {"description": _MEANING[code], "content": error}
        for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, which Argus never sends
            schemas.pop(unused, None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
