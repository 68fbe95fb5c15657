"""Signed, expiring approve/reject links for steps waiting on approval, put in IM messages.

A link is `<public_url>/v1/actions/<id>/decide?decision=approve&expires=<unix>&sig=<hex>`, where sig is
HMAC-SHA256 over "<id>|<decision>|<expires>" with the service's link secret. Opening it (GET) shows what
would be decided and a button; only the POST that button sends decides, so a chat app's link preview (which
fetches the URL) never approves anything. A link decides once: the step must still be planned.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import urlencode

from core.errors import ConfigError

Decision = Literal["approve", "reject"]


def load_secret(path: Path) -> bytes:
    """The link secret kept in `path` (created, mode 600, on first use): links survive a restart."""
    try:
        if path.is_file():
            secret = path.read_bytes().strip()
            if len(secret) >= 32:
                return secret
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_hex(32).encode()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(secret)
        tmp.chmod(0o600)
        tmp.replace(path)
        return secret
    except OSError as exc:
        raise ConfigError(f"cannot read or create the approval link secret {path}: {exc.strerror or exc}",
                          hint="check that data_dir is writable") from None


class ApprovalLinks:
    def __init__(self, secret: bytes, public_url: str, *, ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        if len(secret) < 16:
            raise ConfigError("the approval link secret is too short", hint="use at least 16 random bytes")
        self._secret = secret
        self.public_url = public_url.rstrip("/")
        self.ttl_s = ttl_s
        self.clock = clock

    def _sign(self, action_id: str, decision: str, expires: int) -> str:
        return hmac.new(self._secret, f"{action_id}|{decision}|{expires}".encode(), hashlib.sha256).hexdigest()

    def link(self, action_id: str, decision: Decision) -> str:
        expires = int(self.clock() + self.ttl_s)
        query = urlencode({"decision": decision, "expires": expires, "sig": self._sign(action_id, decision, expires)})
        return f"{self.public_url}/v1/actions/{action_id}/decide?{query}"

    def check(self, action_id: str, decision: str, expires: int, sig: str) -> str | None:
        """None when the link is good; otherwise why not."""
        if decision not in ("approve", "reject"):
            return "the link's decision is neither approve nor reject"
        # compared as bytes: compare_digest refuses str with non-ASCII characters (a mangled link has them)
        if not hmac.compare_digest(self._sign(action_id, decision, expires).encode(), sig.encode()):
            return "the link's signature does not match: it was changed, or made for another Argus"
        if expires < self.clock():
            return "the link has expired"
        return None
