"""API tokens and audit records: roles, the token format, and the values the store hands out.

A token reads `argus_<8 hex>_<43 urlsafe>`. The first part (`argus_<8 hex>`) is public: it is stored
as is and finds the row, so logs and `argus tokens list` can name a token without exposing it. Only
the sha256 of the whole token is stored; the token itself is shown once, when it is created.

Roles: viewer < operator < admin; user, a person who runs jobs: the token names the user (`user`), whose jobs
it submits, lists and stops, and no other's; and agent, the ops team's LLM agent. The agent satisfies what an operator
may call (read everything, and the mutations operators may make), but its calls that take capacity away or stop
work (drain, offline, stop a job) meet the remediation policy's guards, which bind no person
(argus/api/agent_policy.py); routes only the agent and admins may call will ask for `Role.AGENT`, which
operators do not satisfy.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

TOKEN_SCHEME = "argus"
TOKEN_MAX_CHARS = 128
NAME_MAX = 64
_TOKEN = re.compile(r"(argus_[0-9a-f]{8})_[A-Za-z0-9_-]{43}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
# A user as a job's owner names one (control/jobspec.py OWNER_RE): their folder is users/<user>/.
USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


class Role(str, Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    AGENT = "agent"  # the external ops agent
    ADMIN = "admin"
    NODE_AGENT = "node_agent"  # Argus's own agents on the nodes (argus/agents): they send log lines, nothing else
    USER = "user"  # a person who runs jobs: reads what a viewer reads, submits jobs, sees and stops their own


# The roles that satisfy a route asking for the key. A node agent's token travels in its Ray job's environment, so
# it may only send lines: it reads nothing and acts on nothing.
_SATISFIES: dict[Role, frozenset[Role]] = {
    Role.VIEWER: frozenset(Role) - {Role.NODE_AGENT},
    Role.OPERATOR: frozenset({Role.OPERATOR, Role.AGENT, Role.ADMIN}),
    Role.AGENT: frozenset({Role.AGENT, Role.ADMIN}),
    Role.ADMIN: frozenset({Role.ADMIN}),
    Role.NODE_AGENT: frozenset({Role.NODE_AGENT, Role.ADMIN}),
    Role.USER: frozenset({Role.USER, Role.OPERATOR, Role.AGENT, Role.ADMIN}),  # the job routes: scoped by owner
}


def allows(have: Role | str, need: Role | str) -> bool:
    """Whether a token with role `have` may call a route that needs `need`."""
    return Role(have) in _SATISFIES[Role(need)]


def valid_user(user: str) -> bool:
    return USER_RE.fullmatch(user) is not None


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def new_token() -> tuple[str, str]:
    """A fresh token and its public prefix."""
    prefix = f"{TOKEN_SCHEME}_{secrets.token_hex(4)}"
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def prefix_of(token: str) -> str | None:
    """The public prefix of a well-formed token; None for anything else (no database lookup needed)."""
    if len(token) > TOKEN_MAX_CHARS:
        return None
    match = _TOKEN.fullmatch(token)
    return match.group(1) if match else None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class TokenRecord:
    id: str
    name: str
    role: Role
    prefix: str
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    user: str | None = None  # the person a user token speaks for (the owner of the jobs it submits)

    def usable_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def public(self) -> dict[str, Any]:
        """Everything but the hash (which is not in the record anyway), as JSON values."""
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role.value,
            "user": self.user,
            "prefix": self.prefix,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
        }


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: datetime
    actor: str
    role: str | None
    method: str
    path: str
    target: str | None
    status: int
    outcome: str
    detail: dict[str, Any]


def outcome_of(status: int) -> str:
    """ok (2xx/3xx), refused (401/403), rejected (other 4xx), failed (5xx)."""
    if status < 400:
        return "ok"
    if status in (401, 403):
        return "refused"
    return "rejected" if status < 500 else "failed"
