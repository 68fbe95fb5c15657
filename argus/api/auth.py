"""Who may call what: bearer tokens with roles, and the audit log of every mutating call.

Routes declare the role they need with `Depends(require(Role.X))` (or on a router's `dependencies`).
`GET /v1/health`, `GET /v1/leader` and `GET /metrics` stay open on purpose: load balancers and supervisors
probe liveness (and which replica leads) without credentials, and Prometheus scrapes without them. None may
carry secrets: health says which sources are unreachable (addresses with passwords masked), leader names
replicas, metrics carry counts and ids.

`install_audit(app)` records every POST, PUT, PATCH and DELETE, refused ones included, with the token's
name and role (or "anonymous"), method, path, target (the path parameters), the status and its outcome.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPBearer
from loguru import logger

from argus.api.errors import Forbidden, Unauthorized
from argus.store.tokens import TOKEN_MAX_CHARS, Role, allows

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ANONYMOUS = "anonymous"
_HINT = "send `Authorization: Bearer <token>`; an admin creates one with `argus tokens create NAME --role viewer`"
# Declares the scheme in OpenAPI; the header itself is parsed below, strictly.
_bearer_scheme = HTTPBearer(auto_error=False, description="an Argus API token: argus_<8 hex>_<secret>")


@dataclass(frozen=True)
class Principal:
    """The caller, as the audit log names it."""

    name: str
    role: Role
    token_id: str
    user: str | None = None  # the person a user token speaks for

    @property
    def scoped(self) -> str | None:
        """The user whose jobs alone this caller may see and stop; None: every job (operators, agents, admins)."""
        return self.user if self.role is Role.USER else None


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for anything else."""
    if not header or len(header) > TOKEN_MAX_CHARS + 32:
        return None
    scheme, _, rest = header.partition(" ")
    token = rest.strip(" ")
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def require(role: Role | str) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting callers whose token's role satisfies `role` (see argus.store.tokens.allows)."""
    need = Role(role)

    async def dependency(request: Request, _scheme: Annotated[object, Depends(_bearer_scheme)]) -> Principal:
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise Unauthorized("this route needs a bearer token", hint=_HINT)
        record = await run_in_threadpool(request.app.state.store.verify_token, token)
        if record is None:
            raise Unauthorized("the bearer token is unknown, revoked or expired", hint=_HINT)
        principal = Principal(name=record.name, role=record.role, token_id=record.id, user=record.user)
        request.state.principal = principal
        if not allows(record.role, need):
            raise Forbidden(
                f"token {record.name!r} has role {record.role.value}; this route needs {need.value}",
                hint="ask an admin for a token with that role",
            )
        return principal

    dependency.__name__ = f"require_{need.value}"
    return dependency


VIA_HEADER = "X-Argus-Via"  # set by Argus's own clients (argus mcp): recorded as the audit row's "via"


def install_audit(app: FastAPI) -> None:
    """Record every mutating call in the store's audit log, whatever its outcome."""

    @app.middleware("http")
    async def _audit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method not in MUTATING:
            return await call_next(request)
        try:
            response = await call_next(request)
        except Exception:
            await _record(request, 500)
            raise
        await _record(request, response.status_code)
        return response


async def _record(request: Request, status: int) -> None:
    principal: Principal | None = getattr(request.state, "principal", None)
    params = dict(request.scope.get("path_params") or {})
    target = json.dumps(params, ensure_ascii=False, sort_keys=True) if params else None
    detail = getattr(request.state, "audit_detail", None) or {}
    via = request.headers.get(VIA_HEADER, "")
    if via:  # the door the call came through (argus mcp says "mcp"); a short name, never free text
        detail = {**detail, "via": via[:32] if via.replace("-", "").isalnum() else "unreadable"}
    try:
        await run_in_threadpool(
            request.app.state.store.audit,
            actor=principal.name if principal else ANONYMOUS,
            role=principal.role if principal else None,
            method=request.method,
            path=request.url.path,
            status=status,
            target=target,
            detail=detail,
        )
    except Exception as err:  # noqa: BLE001 - the call has happened; losing its record must be loud, not fatal
        logger.error("could not write the audit record of {} {} ({}): {}", request.method, request.url.path,
                     status, err)
