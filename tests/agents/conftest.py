"""The central the agents' tests send to: the app `argus serve` runs, under uvicorn on a loopback port, with a real
SQLite store, a node-agent token and a small inbox (50 lines) so a full inbox is easy to reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from argus.agents.inbox import AgentInbox
from argus.store.store import Store
from stage.localstack.central import Central


@pytest.fixture
def central(tmp_path: Path) -> Iterator[tuple[Central, str]]:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    _, token = store.create_token("node-agents", "node_agent", created_by="test")
    server = Central(store, AgentInbox(max_lines=50))
    server.start()
    try:
        yield server, token
    finally:
        server.stop()
        store.close()
