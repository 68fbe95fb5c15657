"""Generic JSON webhook: the ops agent's endpoint, or anything that takes a POST of the incident."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx
from loguru import logger

from argus.notify.event_schema import EVENT_SCHEMA
from argus.notify.message import step_lines
from core.names import clean, entrypoint_of, job_of, label_of, node_of
from core.signal_keys import OWNER
from core.types import Action, Incident


def incident_payload(incident: Incident, event: str, *, link: str | None = None,
                     actions: Sequence[Action] = ()) -> dict[str, Any]:
    """The body of webhook event `incident.<event>` (argus/notify/event_schema.py: version 1, its JSON Schema). `link`:
    the incident in the API; its report is at `<link>/report`. `about`: what the incident is about as
    people name it (core.names): the job by its submission id, JobSpec name and owner, the node by name and IP;
    the entrypoint apart, as a detail. `actions`: the remediation steps the event is about, as `steps` (one line
    each: what it did once final, else its preview)."""
    body: dict[str, Any] = {
        "schema": EVENT_SCHEMA,
        "event": f"incident.{event}",
        "about": {
            "label": label_of(incident),
            "job": job_of(incident),
            "node": node_of(incident),
            "owner": clean(incident.attrs.get(OWNER)),
            "entrypoint": entrypoint_of(incident),
        },
        "incident": {**incident.model_dump(mode="json"), "reopened": incident.reopened},
        "link": link,
        "report": f"{link}/report" if link else None,
    }
    if actions:
        lines = step_lines(actions)
        body["steps"] = [{"action_id": s.action_id, "kind": s.kind, "status": s.status, "text": s.text} for s in lines]
        body["steps_more"] = max(0, len(actions) - len(lines))
    return body


class WebhookNotifier:
    """POSTs `incident_payload` as JSON; retries with backoff; returns False after the last failure."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        public_url: str | None = None,
        client: httpx.Client | None = None,
        sleep=time.sleep,
    ) -> None:
        self.url = url
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.public_url = public_url.rstrip("/") if public_url else None
        self._client = client or httpx.Client(timeout=timeout_s)
        self._sleep = sleep

    def notify(self, incident: Incident, event: str, *, actions: Sequence[Action] = ()) -> bool:
        link = f"{self.public_url}/v1/incidents/{incident.id}" if self.public_url else None
        body = incident_payload(incident, event, link=link, actions=actions)
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._client.post(self.url, json=body)
                if response.status_code < 300:
                    logger.bind(incident=incident.id).info("webhook {} accepted {}", self.url, event)
                    return True
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                if 400 <= response.status_code < 500 and response.status_code != 429:
                    break  # the receiver refuses this body; retrying will not change its mind
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
        logger.bind(incident=incident.id).error(
            "webhook {} failed after {} attempt(s): {}", self.url, attempt, last
        )
        return False
