"""A cap on request bodies, answered in our error shape.

Starlette reads a body whole, so a hostile client could send gigabytes. FastAPI's own `max_body_size`
answers in plain text, outside our exception handlers; this middleware answers 413 in JSON instead: at
once for a declared Content-Length over the cap, and for a chunked body as soon as the count passes it.
It buffers at most the cap, then replays the body to the app.
"""

from __future__ import annotations

import json
from typing import Any

from core.readers import Readers

MAX_BODY_BYTES = 1024 * 1024
HINT = "send a smaller body: requests carry specs and reasons, not data"


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") in {"GET", "HEAD", "OPTIONS"}:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send, "a Content-Length that is not a size" if not declared.strip().isdigit()
                               else f"a body of {int(declared)} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, "a chunked body")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, send: Any, what: str) -> None:
        body = json.dumps({
            "error": "BodyTooLarge",
            "message": f"refused {what}: request bodies are limited to {self.max_bytes} bytes",
            "hint": HINT,
        }).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()

    return replayed



class InFlight:
    """Counts the API requests being answered, except the paths in `background` (webhooks), in `count`: background
    work (filing alerts, reports, notifications, remediation) gives way between items while people are reading
    (core/readers.py), so an alert storm does not slow the API's readers."""

    def __init__(self, app: Any, count: Readers, background: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.counted = count
        self.background = background

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in self.background:
            await self.app(scope, receive, send)
            return
        self.counted.now += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.counted.now -= 1
