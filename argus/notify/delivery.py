"""One delivery to one channel: POST, read the platform's answer, retry with exponential backoff.

Retried: network errors, HTTP 429 and 5xx, and platform error codes not known to be permanent. The wait doubles
from `backoff_s` up to `max_backoff_s`, or is the platform's Retry-After when that is longer (within the same cap).
Nothing here raises: the outcome says what happened. Error texts never contain the webhook URL (a credential).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import httpx

from argus.notify.channels import Channel, Item, Judgement
from core.errors import ArgusError


@dataclass(frozen=True)
class Outcome:
    ok: bool
    attempts: int
    status: int | None = None  # the last HTTP status, None when no answer came
    error: str | None = None
    code: str | None = None  # the platform's own error code


def deliver(
    channel: Channel,
    item: Item,
    *,
    client: httpx.Client,
    clock: Callable[[], datetime],
    sleep: Callable[[float], None],
    attempts: int = 3,
    backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
) -> Outcome:
    outcome = Outcome(ok=False, attempts=0, error="not attempted")
    for attempt in range(1, max(1, attempts) + 1):
        try:
            request = channel.request(item, clock())  # rebuilt per attempt: signatures carry a fresh timestamp
        except ArgusError as exc:
            return Outcome(ok=False, attempts=attempt - 1, error=str(exc))
        status: int | None = None
        try:
            response = client.post(request.url, content=request.body, headers=request.headers)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            judgement = Judgement(ok=False, retry=True, error=_scrub(f"{type(exc).__name__}: {exc}", request.url))
        else:
            status = response.status_code
            judgement = channel.judge(status, response.text, response.headers)
        if judgement.ok:
            return Outcome(ok=True, attempts=attempt, status=status)
        outcome = Outcome(ok=False, attempts=attempt, status=status, error=judgement.error, code=judgement.code)
        if not judgement.retry or attempt >= attempts:
            break
        delay = min(max_backoff_s, backoff_s * 2 ** (attempt - 1))
        if judgement.retry_after_s is not None:
            delay = min(max_backoff_s, max(delay, judgement.retry_after_s))
        sleep(delay)
    return outcome


def _scrub(text: str, url: str) -> str:
    """Without the URL or its query (a bot's access token), whatever the HTTP library put in its message."""
    for secret in {url, url.split("?", 1)[0], url.partition("?")[2]} - {""}:
        text = text.replace(secret, "<webhook url>")
    return text[:500]
