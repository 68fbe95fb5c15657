"""Logging in (pasting an API token), logging out, and where `/` and `/ui` lead."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse

from argus.api.auth import Principal
from argus.store.tokens import TOKEN_MAX_CHARS, Role
from argus.web.access import posted, principal_of, read_form
from argus.web.sessions import COOKIE_PATH, LOGIN_COOKIE, LOGIN_NONCE_TTL_S, SESSION_COOKIE
from argus.web.ui import HOME, UiRoute, error_page, page, web_of

router = APIRouter(route_class=UiRoute, include_in_schema=False)
# Where a login may send the browser next: a page of ours, never another site (`//evil`, `/\evil`).
_NEXT = re.compile(r"/ui/[A-Za-z0-9_./?=&%-]{0,300}")
_UNKNOWN = "that token is unknown, revoked or expired"
_UNKNOWN_HINT = "paste the whole token (argus_<8 hex>_<secret>); an admin creates one with `argus tokens create`"


def safe_next(value: str | None) -> str:
    if value and _NEXT.fullmatch(value) and "//" not in value and "/../" not in value and value != "/ui/login":
        return value
    return HOME


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _login_form(request: Request, status: int = 200, *, message: str | None = None, hint: str | None = None,
                next_page: str = HOME) -> Response:
    web = web_of(request)
    nonce = web.sessions.login_nonce(request.cookies.get(LOGIN_COOKIE))
    response = page(request, "login.html", status, title="Log in", login_csrf=web.sessions.login_csrf(nonce),
                    next_page=next_page, message=message, hint=hint)
    response.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_NONCE_TTL_S, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=_secure(request))
    return response


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse(HOME, status_code=303)


@router.get("/ui")
@router.get("/ui/")
def ui_root() -> RedirectResponse:
    return RedirectResponse(HOME, status_code=303)


@router.get("/ui/login")
async def login_page(request: Request) -> Response:
    next_page = safe_next(request.query_params.get("next"))
    if await principal_of(request) is not None:
        return RedirectResponse(next_page, status_code=303)
    return _login_form(request, next_page=next_page)


@router.post("/ui/login")
async def login(request: Request) -> Response:
    web = web_of(request)
    address = request.client.host if request.client else "unknown"
    request.state.audit_detail = {"via": "ui", "event": "login"}
    wait = web.throttle.wait_s(address)
    if wait:
        response: Response = error_page(request, 429, f"too many failed logins from {address}",
                              hint=f"try again in {wait} s")
        response.headers["Retry-After"] = str(wait)
        return response
    form = await read_form(request)
    next_page = safe_next(form.get("next"))
    if not web.sessions.login_csrf_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
        return _login_form(request, 403, message="the login form has expired or was sent from another page",
                           hint="log in from this page again (cookies must be enabled)", next_page=next_page)
    token = form.get("token", "").strip()
    record = None
    if 0 < len(token) <= TOKEN_MAX_CHARS:
        record = await run_in_threadpool(request.app.state.store.verify_token, token)
    if record is None:
        web.throttle.failed(address)
        request.state.audit_detail = {"via": "ui", "event": "login failed"}
        return _login_form(request, 401, message=_UNKNOWN, hint=_UNKNOWN_HINT, next_page=next_page)
    request.state.principal = Principal(name=record.name, role=Role(record.role), token_id=record.id)
    cookie, max_age = web.sessions.issue(record.id, record.expires_at)
    response = RedirectResponse(next_page, status_code=303)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=max_age, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=_secure(request))
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    await posted(request, Role.VIEWER, "logging out")
    web_of(request).sessions.end(request.state.session)
    request.state.audit_detail = {"via": "ui", "event": "logout"}
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict",
                           secure=_secure(request))
    return response
