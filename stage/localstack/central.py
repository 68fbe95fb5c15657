"""The central Argus node agents talk to, for tests and benches: the app `argus serve` runs (create_app with a
node-agent inbox) under uvicorn on a fixed loopback port, so a test can stop it and start it again at the same
address."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from argus.agents.inbox import AgentInbox
from argus.api.app import create_app
from argus.store.store import Store


class Central:
    """The real app under uvicorn on a fixed loopback port; stop() and start() again to restart it."""

    def __init__(self, store: Store, inbox: AgentInbox) -> None:
        self.store, self.inbox = store, inbox
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        app = create_app(store=self.store, node_agents=self.inbox)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self._server = server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
            time.sleep(0.05)

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)
