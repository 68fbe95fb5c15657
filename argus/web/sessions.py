"""The web page's sessions: a signed cookie naming an API token, its CSRF tokens, and the login throttle.

A session cookie reads `<token id>.<expiry>.<nonce>.<sig>`, sig being HMAC-SHA256 over the first three with
the session secret. It names the API token the user pasted, never the token itself: every request looks the
token up again, so a revoked or expired token ends its sessions at once and the role always is the token's.
Logging out ends the session's nonce in this process (the cookie is also dropped); a restart forgets those,
so an ended session lasts at most until its expiry after a restart, and only for whoever copied the cookie.

CSRF tokens are derived, not stored: HMAC over the session's nonce (forms of a logged-in user) or over the
login cookie's nonce (the login form, so another site cannot log a browser into its own token).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from argus.approval_links import load_secret
from core.errors import ConfigError
from core.types import utcnow

SESSION_COOKIE = "argus_session"
LOGIN_COOKIE = "argus_login"
COOKIE_PATH = "/ui"
SESSION_TTL_S = 12 * 3600
LOGIN_NONCE_TTL_S = 3600
SECRET_FILE = "web-session.secret"
# token ids are "tok-" and 12 hex (argus.store.store.new_id); nonces are 32 hex
_SESSION = re.compile(r"(tok-[0-9a-f]{12})\.([0-9]{1,12})\.([0-9a-f]{32})\.([0-9a-f]{64})")
_NONCE = re.compile(r"[0-9a-f]{32}")


def secret_in(data_dir: Path) -> bytes:
    """The session secret kept in `<data_dir>/web-session.secret` (created, mode 600, on first use): sessions
    survive a restart, and every worker of one Argus signs alike."""
    path = Path(data_dir) / SECRET_FILE
    try:
        return load_secret(path)  # the approval links' loader: same file handling, another file
    except ConfigError as exc:
        raise ConfigError(f"cannot read or create the web session secret {path}", hint=exc.hint) from None


@dataclass(frozen=True)
class Session:
    token_id: str
    expires: int  # unix seconds
    nonce: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens. Thread-safe."""

    def __init__(self, secret: bytes, *, ttl_s: int = SESSION_TTL_S,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if len(secret) < 16:
            raise ConfigError("the web session secret is too short", hint="use at least 16 random bytes")
        self._secret = secret
        self.ttl_s = ttl_s
        self.clock = clock
        self._ended: dict[str, int] = {}  # nonce -> expiry, of sessions logged out
        self._lock = threading.Lock()

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._secret, f"{purpose}|{text}".encode(), hashlib.sha256).hexdigest()

    def now(self) -> int:
        return int(self.clock().timestamp())

    # -- the session cookie ---------------------------------------------------------------------------------

    def issue(self, token_id: str, token_expires_at: datetime | None) -> tuple[str, int]:
        """A cookie value for a session of `token_id`, and its lifetime in seconds (never past the token's)."""
        now = self.now()
        expires = now + self.ttl_s
        if token_expires_at is not None:
            expires = min(expires, int(token_expires_at.timestamp()))
        payload = f"{token_id}.{expires}.{secrets.token_hex(16)}"
        return f"{payload}.{self._mac('session', payload)}", max(0, expires - now)

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie holds when it is well formed, signed by us, unexpired and not logged out."""
        if not cookie or len(cookie) > 200:
            return None
        match = _SESSION.fullmatch(cookie)
        if match is None:
            return None
        token_id, expires, nonce, sig = match.groups()
        if not hmac.compare_digest(self._mac("session", f"{token_id}.{expires}.{nonce}"), sig):
            return None
        if int(expires) <= self.now():
            return None
        with self._lock:
            if nonce in self._ended:
                return None
        return Session(token_id=token_id, expires=int(expires), nonce=nonce)

    def end(self, session: Session) -> None:
        """Log a session out: its cookie is refused from now on, even if someone kept a copy."""
        now = self.now()
        with self._lock:
            for nonce in [n for n, exp in self._ended.items() if exp <= now]:
                del self._ended[nonce]
            self._ended[session.nonce] = session.expires

    # -- CSRF ---------------------------------------------------------------------------------------------

    def csrf(self, session: Session) -> str:
        return self._mac("csrf", session.nonce)

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf(session), str(given)[:128])

    def login_nonce(self, cookie: str | None) -> str:
        """The login cookie's nonce when it is one of ours, else a fresh one (to be set as the cookie)."""
        return cookie if cookie and _NONCE.fullmatch(cookie) else secrets.token_hex(16)

    def login_csrf(self, nonce: str) -> str:
        return self._mac("login", nonce)

    def login_csrf_ok(self, cookie: str | None, given: str | None) -> bool:
        if not cookie or not _NONCE.fullmatch(cookie) or not given:
            return False
        return hmac.compare_digest(self.login_csrf(cookie), str(given)[:128])


class LoginThrottle:
    """At most `max_failures` failed logins per client address in `window_s`; then that address waits.

    Memory is bounded: at most `max_addresses` addresses are tracked; past that, the quietest are forgotten.
    """

    def __init__(self, *, max_failures: int = 10, window_s: float = 900.0, max_addresses: int = 10_000,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.max_failures = max_failures
        self.window = timedelta(seconds=window_s)
        self.max_addresses = max_addresses
        self.clock = clock
        self._failures: dict[str, deque[datetime]] = {}
        self._lock = threading.Lock()

    def _recent(self, address: str, now: datetime) -> deque[datetime]:
        times = self._failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def wait_s(self, address: str) -> int:
        """Seconds until `address` may try again; 0 when it may now."""
        now = self.clock()
        with self._lock:
            times = self._recent(address, now)
            if len(times) < self.max_failures:
                return 0
            return max(1, int((times[0] + self.window - now).total_seconds()) + 1)

    def failed(self, address: str) -> None:
        now = self.clock()
        with self._lock:
            times = self._recent(address, now)
            if address not in self._failures:
                if len(self._failures) >= self.max_addresses:
                    self._forget(now)
                self._failures[address] = times
            times.append(now)

    def _forget(self, now: datetime) -> None:
        for address in list(self._failures):
            self._recent(address, now)
        while len(self._failures) >= self.max_addresses:
            quietest = min(self._failures, key=lambda a: self._failures[a][-1])
            del self._failures[quietest]
