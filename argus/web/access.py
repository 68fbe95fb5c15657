"""Who is using the web page, and what they may do: the API's tokens and roles, through a session cookie.

Every request reads the session cookie and looks its token up again (unknown, revoked or expired: no
session), and the role is the token's now, not the one it had at login. Once known, the caller is set as
`request.state.principal`, so the audit middleware (argus/api/auth.py) names them for the UI's posts as it
does for the API's. A form post must carry the session's CSRF token and come from a role allowed to send
it; the buttons a role may not use are not shown, and their posts are refused all the same.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated
from urllib.parse import parse_qs

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from argus.api.auth import Principal
from argus.api.errors import Forbidden
from argus.store.tokens import Role, TokenRecord, allows
from argus.web.sessions import SESSION_COOKIE, Session
from argus.web.ui import LoginRequired, web_of
from core.errors import InputError

if TYPE_CHECKING:
    from argus.store.store import Store

MAX_FORM_BYTES = 16 * 1024
MAX_FORM_FIELDS = 20
FORM_TYPE = "application/x-www-form-urlencoded"


def token_record(store: Store, token_id: str, now: datetime) -> TokenRecord | None:
    """The token with this id when it is still usable (not revoked, not expired)."""
    return next((t for t in store.list_tokens() if t.id == token_id and t.usable_at(now)), None)


async def principal_of(request: Request) -> Principal | None:
    """The logged-in caller, or None; sets request.state.principal and .session when there is one."""
    web = web_of(request)
    session = web.sessions.read(request.cookies.get(SESSION_COOKIE))
    if session is None:
        return None
    record = await run_in_threadpool(token_record, request.app.state.store, session.token_id, web.clock())
    if record is None:
        return None
    principal = Principal(name=record.name, role=record.role, token_id=record.id, user=record.user)
    request.state.principal = principal
    request.state.session = session
    return principal


async def signed_in(request: Request) -> Principal:
    """A dependency for pages: the caller, or a redirect to the login page."""
    principal = await principal_of(request)
    if principal is None:
        raise LoginRequired()
    return principal


Viewer = Annotated[Principal, Depends(signed_in)]


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, each field once, bounded in size and number of fields."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if not body and not kind:
        return {}  # a post with nothing in it: it has no CSRF token either, and is refused for that
    if kind != FORM_TYPE:
        raise InputError(f"a form must be sent as {FORM_TYPE}, not {kind[:60] or 'nothing'}",
                         hint="send the form from the page")
    if len(body) > MAX_FORM_BYTES:
        raise InputError(f"the form is {len(body)} bytes, more than {MAX_FORM_BYTES}", hint="send a shorter reason")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise InputError("the form could not be read", hint="send the form from the page") from None
    repeated = sorted(k for k, v in fields.items() if len(v) > 1)
    if repeated:
        raise InputError(f"the form gives {', '.join(repeated)[:100]} more than once", hint="send each field once")
    return {k: v[0] for k, v in fields.items()}


def check_role(principal: Principal, need: Role, what: str) -> None:
    if not allows(principal.role, need):
        raise Forbidden(f"token {principal.name!r} has role {principal.role.value}; {what} needs {need.value}",
                        hint="ask an admin for a token with that role")


async def posted(request: Request, need: Role, what: str) -> tuple[Principal, dict[str, str]]:
    """A form post from a logged-in caller with the session's CSRF token and a role satisfying `need`."""
    principal = await principal_of(request)
    if principal is None:
        raise LoginRequired()
    session: Session = request.state.session
    form = await read_form(request)
    if not web_of(request).sessions.csrf_ok(session, form.get("csrf")):
        raise Forbidden("the form's CSRF token is missing or wrong", hint="reload the page and send the form again")
    check_role(principal, need, what)
    return principal, form


def may(principal: Principal | None, need: Role) -> bool:
    """Whether to show a button that needs `need`."""
    return principal is not None and allows(principal.role, need)
