"""The generic JSON webhook (the ops agent's endpoint): `argus.notify.webhook.incident_payload`, signed.

With a secret, every POST carries `X-Argus-Timestamp: <unix seconds>` and `X-Argus-Signature: sha256=<hex>`, the
HMAC-SHA256 of the raw body under the secret. The body repeats the timestamp as `sent_at`, so the signature also
covers it: a receiver compares the signature in constant time, then refuses a `sent_at` older than a few minutes
(a replayed delivery). A digest is `{"event": "incident.digest", "items": [incident payloads], "more": N}`. Every
body is version 1 of the events' contract: argus/notify/event_schema.py, JSON Schema in schemas/argus-event-v1.json.
Any 2xx is success; 429 and 5xx are retried.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Any

from argus.notify.channels import Channel, Item, Request, encode, scaled
from argus.notify.event_schema import EVENT_SCHEMA
from argus.notify.message import Digest, Message, cut
from argus.notify.webhook import incident_payload

SIGNATURE_HEADER = "X-Argus-Signature"
TIMESTAMP_HEADER = "X-Argus-Timestamp"


def argus_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class SignedWebhookChannel(Channel):
    kind = "webhook"
    per_minute = 600.0  # our own receivers: the Dispatcher's rate limit is what binds
    max_body_bytes = 256 * 1024

    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        if isinstance(item, Digest):
            return {"schema": EVENT_SCHEMA, "event": "incident.digest",
                    "items": [self._one(m, scale) for m in item.items], "more": item.more, "list": item.list_url}
        return self._one(item, scale)

    def _one(self, m: Message, scale: float) -> dict[str, Any]:
        if m.incident is None:
            body: dict[str, Any] = {"schema": EVENT_SCHEMA, "event": f"incident.{m.event}",
                                    "incident": {"id": m.incident_id}}
        else:
            body = incident_payload(m.incident, m.event, link=m.incident_url)
            # The incident as stored, except a summary too long for a notification (the API has all of it).
            body["incident"]["summary"] = cut(m.incident.summary, scaled(16_000, scale) or 200)
            if scale == 0:
                body["incident"]["attrs"] = {"omitted": "too large for a notification; GET the incident instead"}
        if m.report_summary:
            body["report_summary"] = m.report_summary
        if m.resolution:
            body["resolution"] = m.resolution
        if m.steps:
            body["steps"] = [{"action_id": s.action_id, "kind": s.kind, "status": s.status, "text": s.text}
                             for s in m.steps]
            body["steps_more"] = m.steps_more
        if m.approvals:
            body["approvals"] = [{"action_id": a.action_id, "kind": a.kind, "target": a.target,
                                  "approve": a.approve_url, "reject": a.reject_url} for a in m.approvals]
        return body

    def finish(self, data: dict[str, Any], now: datetime) -> Request:
        timestamp = int(now.timestamp())
        body = encode({**data, "sent_at": timestamp})
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if self.config.secret is not None:
            headers[TIMESTAMP_HEADER] = str(timestamp)
            headers[SIGNATURE_HEADER] = argus_signature(self.config.secret.get_secret_value(), body)
        return Request(self.config.url, body, headers)
