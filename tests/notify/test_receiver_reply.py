"""The webhook receiver's configurable reply, which the platform tests build on; its default is unchanged."""

from __future__ import annotations

import json

import httpx
import pytest

from stage.localstack.webhook_receiver import Reply, WebhookReceiver


def test_default_reply_is_unchanged(webhook_receiver):
    response = httpx.post(webhook_receiver.url + "/x", json={"a": 1})
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert json.loads(webhook_receiver.received[0]["raw"]) == {"a": 1}  # the bytes as sent, for signatures


def test_reply_function_answers_text_json_headers_and_can_hang_up():
    answers = iter([Reply(429, {"ok": False}, {"Retry-After": "7"}), Reply(200, "ok"), Reply(drop=True)])
    with WebhookReceiver(reply=lambda item: next(answers)) as receiver:
        first = httpx.post(receiver.url, json={"n": 1})
        assert first.status_code == 429 and first.headers["retry-after"] == "7" and first.json() == {"ok": False}
        second = httpx.post(receiver.url, json={"n": 2})
        assert second.status_code == 200 and second.text == "ok"
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(receiver.url, json={"n": 3})
        assert [r["reply"]["status"] for r in receiver.received] == [429, 200, 200]
        receiver.set_reply(lambda item: 1 / 0)  # a broken reply function is a 500, not a dead server
        assert httpx.post(receiver.url, json={}).status_code == 500
