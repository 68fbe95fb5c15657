"""Background work gives way to the API's readers (core/readers.py): it pauses while a request is answered, for a
bounded time, and not at all when nobody reads; the API's middleware keeps the count (argus/api/limits.py)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fastapi import FastAPI

from argus.api.limits import InFlight
from core.readers import Readers


def test_nobody_reading_means_no_pause() -> None:
    assert Readers().give_way() == 0.0


def test_a_worker_waits_for_the_request_to_end() -> None:
    readers = Readers()
    readers.now = 1
    threading.Timer(0.02, lambda: setattr(readers, "now", 0)).start()
    paused = readers.give_way(max_s=2.0)
    assert 0.015 <= paused < 1.0 and not readers.busy()


def test_a_worker_is_delayed_never_stopped_by_readers_who_never_leave() -> None:
    readers = Readers()
    readers.now = 3
    started = time.monotonic()
    paused = readers.give_way(max_s=0.05)
    assert 0.05 <= paused and time.monotonic() - started < 1.0


@pytest.mark.anyio
async def test_the_middleware_counts_readers_but_not_the_webhook() -> None:
    readers = Readers()
    seen: dict[str, int] = {}
    app = FastAPI()

    @app.get("/v1/incidents")
    async def incidents() -> dict[str, int]:
        seen["reading"] = readers.now
        return {}

    @app.post("/v1/alerts/alertmanager")
    async def webhook() -> dict[str, int]:
        seen["webhook"] = readers.now
        return {}

    app.add_middleware(InFlight, count=readers, background=frozenset({"/v1/alerts/alertmanager"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://argus") as client:
        assert (await client.get("/v1/incidents")).status_code == 200
        assert (await client.post("/v1/alerts/alertmanager")).status_code == 200
    assert seen == {"reading": 1, "webhook": 0} and readers.now == 0
