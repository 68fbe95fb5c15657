"""The webhook receiver as a real HTTP server."""

from __future__ import annotations

import threading

import httpx
import pytest

from stage.localstack.webhook_receiver import MAX_BODY_BYTES, WebhookReceiver


def test_records_json_and_text_posts(webhook_receiver):
    r1 = httpx.post(f"{webhook_receiver.url}/im/team-a", json={"incident": "inc-1", "n": 2},
                    headers={"X-Argus-Signature": "abc"})
    r2 = httpx.post(f"{webhook_receiver.url}/plain", content=b"not json {", headers={"Content-Type": "text/plain"})
    assert r1.status_code == 200 and r2.status_code == 200
    first, second = webhook_receiver.received
    assert first["path"] == "/im/team-a"
    assert first["body"] == {"incident": "inc-1", "n": 2}
    assert first["headers"]["X-Argus-Signature"] == "abc"
    assert second["body"] == "not json {"
    webhook_receiver.clear()
    assert webhook_receiver.received == []


def test_chunked_body_is_read(webhook_receiver):
    def parts():
        yield b'{"a": '
        yield b'"b"}'

    resp = httpx.post(f"{webhook_receiver.url}/chunked", content=parts())
    assert resp.status_code == 200
    assert webhook_receiver.received[0]["body"] == {"a": "b"}


def test_wait_for_sees_a_later_post(webhook_receiver):
    timer = threading.Timer(0.3, lambda: httpx.post(f"{webhook_receiver.url}/late", json={"k": "v"}))
    timer.start()
    try:
        got = webhook_receiver.wait_for(lambda item: item["path"] == "/late", timeout=30, what="the late post")
    finally:
        timer.join()
    assert got["body"] == {"k": "v"}


def test_wait_for_times_out_naming_what_it_waited_for(webhook_receiver):
    with pytest.raises(TimeoutError, match="the post that never comes"):
        webhook_receiver.wait_for(lambda item: False, timeout=0.5, what="the post that never comes")


def test_refuses_bodies_over_10_mb(webhook_receiver):
    resp = httpx.post(f"{webhook_receiver.url}/big", content=b"x" * (MAX_BODY_BYTES + 1), timeout=30)
    assert resp.status_code == 413
    assert webhook_receiver.received == []


def test_stop_is_idempotent_and_frees_the_port():
    receiver = WebhookReceiver().start()
    url = receiver.url
    receiver.stop()
    receiver.stop()
    with pytest.raises(httpx.TransportError):
        httpx.post(url, json={}, timeout=2)
