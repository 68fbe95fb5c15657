"""A real HTTP endpoint that records every POST: the IM / ops-agent webhook and Alertmanager's receiver in tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stage.localstack.process import StackTimeout

MAX_BODY_BYTES = 10 * 1024 * 1024


class _BodyTooLarge(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        # The stdlib writes every request to stderr; the recorded list is the log.
        return

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise _BodyTooLarge
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        data = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(data)
            if len(data) + size > MAX_BODY_BYTES:
                raise _BodyTooLarge
            data += self.rfile.read(size)
            self.rfile.readline()

    def _reply(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(payload, (bytes, str)):
            body, kind = (payload if isinstance(payload, bytes) else payload.encode()), "text/plain; charset=utf-8"
        else:
            body, kind = json.dumps(payload).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        try:
            raw = self._read_body()
        except _BodyTooLarge:
            self.close_connection = True
            self._reply(413, {"error": f"body larger than {MAX_BODY_BYTES} bytes"})
            return
        except ValueError:
            self._reply(400, {"error": "malformed Content-Length or chunked body"})
            return
        text = raw.decode("utf-8", "replace")
        try:
            body: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            body = text
        item = {"path": self.path, "headers": dict(self.headers.items()), "body": body, "received_at": time.time(),
                "raw": raw}
        reply = self.server.owner.reply
        if reply is None:
            self.server.owner._record(item)
            self._reply(200, {"ok": True})
            return
        try:
            answer = reply(item)
        except Exception as exc:  # a broken reply function answers 500, as a broken server would
            answer = Reply(500, {"error": f"reply function raised {type(exc).__name__}: {exc}"})
        item["reply"] = {"status": answer.status, "body": answer.body}
        self.server.owner._record(item)
        if answer.drop:
            self.close_connection = True  # hang up without an answer: the client sees a network error
            return
        self._reply(answer.status, answer.body, answer.headers)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._reply(200, {"received": len(self.server.owner.received)})


@dataclass(frozen=True)
class Reply:
    """What the receiver answers to one POST: a status, a JSON (dict/list) or text (str) body, extra headers.
    `drop` closes the connection without answering."""

    status: int = 200
    body: Any = field(default_factory=lambda: {"ok": True})
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: WebhookReceiver


class WebhookReceiver:
    """An HTTP server on a background thread that keeps every POST as {path, headers, body, received_at, raw}.

    `body` is the parsed JSON, or the text when it is not JSON; `raw` the bytes as received (to check a signature).
    By default every POST is answered 200 `{"ok": true}`; `reply` (or `set_reply`) decides the answer instead: it
    gets the recorded POST and returns a Reply, which is also recorded under "reply". Tests use it to play an IM
    platform that checks payloads and signatures, rate-limits or fails.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, reply: Callable[[dict[str, Any]], Reply] | None = None
    ) -> None:
        self.host = host
        self.reply = reply
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._received: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("WebhookReceiver is not started; call start() first")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def received(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._received)

    def _record(self, item: dict[str, Any]) -> None:
        with self._cond:
            self._received.append(item)
            self._cond.notify_all()

    def set_reply(self, reply: Callable[[dict[str, Any]], Reply] | None) -> None:
        """Answer later POSTs with `reply` (None: the default 200 `{"ok": true}`)."""
        self.reply = reply

    def clear(self) -> None:
        with self._cond:
            self._received.clear()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0, what: str = "a matching POST"
    ) -> dict[str, Any]:
        """The first recorded POST (past or future) for which `predicate` is true; StackTimeout otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for item in self._received:
                    if predicate(item):
                        return item
                left = deadline - time.monotonic()
                if left <= 0:
                    paths = [i["path"] for i in self._received][-10:]
                    raise StackTimeout(
                        f"webhook receiver {self.url if self._server else '(stopped)'} got no POST matching "
                        f"{what} within {timeout:.0f} s ({len(self._received)} received, last paths {paths})",
                        hint="check that the sender is configured with this receiver's URL",
                    )
                self._cond.wait(min(left, 0.5))

    def start(self) -> WebhookReceiver:
        if self._server is not None:
            return self
        server = _Server((self.host, self._port), _Handler)
        server.owner = self
        self._server = server
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default), and tests stop many receivers.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"webhook-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
