"""Feishu / Lark custom bot: an interactive card (JSON 2.0) with a coloured header, Markdown and link buttons.

Checked against the custom-bot guide, https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot
(Lark: https://open.larksuite.com/document/client-docs/bot-v3/add-custom-bot):
- POST JSON; a card is `{"msg_type": "interactive", "card": {...}}` (the card replaces `content`); card JSON 2.0
  has `schema: "2.0"`, `header.title` / `header.subtitle` as plain_text, `header.template` a colour, and
  `body.elements`: `markdown` components and `button`s whose `behaviors` are `open_url` (a custom bot's card can
  only open links; it cannot call back).
- Signing: `timestamp` (seconds, within an hour) and `sign` = base64(HmacSHA256(key=f"{timestamp}\\n{secret}",
  msg=b"")) as top-level body fields.
- Limits: the request body at most 20 KB; 100 requests a minute and 5 a second per bot; code 11232 is the
  platform's rate limiting. Answers: `{"code": 0}` on success; 9499 bad request, 19021 bad signature or stale
  timestamp, 19022 IP not allowed, 19024 keyword missing.

Card Markdown renders `<at id=all>`, `<a href>` and `<font>` (the card Markdown reference), so untrusted text never
goes into a `markdown` component: it is shown in `div` components with `plain_text`, which render nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any

from argus.notify.channels import (
    MAX_APPROVALS,
    Channel,
    Item,
    Judgement,
    Request,
    encode,
    escape_lite,
    scaled,
    step_texts,
)
from argus.notify.message import Digest, Message, cut
from core.types import Severity

_COLOURS = {Severity.CRITICAL: "red", Severity.WARNING: "orange", Severity.INFO: "blue"}


def feishu_sign(secret: str, timestamp: int) -> str:
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def _text(content: str) -> dict[str, Any]:
    return {"tag": "div", "text": {"tag": "plain_text", "content": escape_lite(content)}}


def _markdown(content: str) -> dict[str, Any]:
    return {"tag": "markdown", "content": content}  # trusted text only: labels, enums, counts


def _button(label: str, url: str, kind: str = "default") -> dict[str, Any]:
    return {"tag": "button", "text": {"tag": "plain_text", "content": label}, "type": kind,
            "behaviors": [{"type": "open_url", "default_url": url}]}


class FeishuChannel(Channel):
    kind = "feishu"
    per_minute = 100.0
    max_body_bytes = 20_000
    permanent_codes = frozenset({"9499", "19021", "19022", "19024"})

    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        card = self._digest(item, scale) if isinstance(item, Digest) else self._message(item, scale)
        return {"msg_type": "interactive", "card": card}

    def _message(self, m: Message, scale: float) -> dict[str, Any]:
        colour = "green" if m.event == "resolved" else _COLOURS[m.severity]
        facts = f"**{m.label}** · severity **{m.severity.value}** · **{m.category}** · state " \
                f"**{m.state}** · `{m.incident_id}`"
        facts += m.history
        elements: list[dict[str, Any]] = [_markdown(facts)]
        who = [f"{label}: {value}" for label, value in (("Job", m.job), ("Node", m.node), ("Owner", m.owner)) if value]
        if who:
            elements.append(_text(cut(" · ".join(who), scaled(600, scale) or 120)))
        if m.summary and scale > 0:
            elements.append(_text(cut(m.summary, scaled(2000, scale))))
        if m.report_summary and scale > 0:
            elements += [_markdown("**Root cause**"), _text(cut(m.report_summary, scaled(1000, scale)))]
        if m.resolution:
            elements += [_markdown("**Resolved**"), _text(cut(m.resolution, scaled(600, scale) or 160))]
        if m.steps:
            elements += [_markdown("**Remediation**"), _text("\n".join(step_texts(m, scale)))]
        for a in m.approvals[:MAX_APPROVALS]:
            elements.append(_text(cut(f"Proposed: {a.kind} on {a.target} ({a.action_id})", 300)))
            elements += [_button("Approve", a.approve_url, "primary"), _button("Reject", a.reject_url, "danger")]
        if m.report_url:
            elements.append(_button("Open report", m.report_url, "primary" if not m.approvals else "default"))
        if m.incident_url:
            elements.append(_button("Incident", m.incident_url))
        return _card(escape_lite(cut(m.title, 150)), f"{m.severity.value} · {m.category}", colour, elements)

    def _digest(self, d: Digest, scale: float) -> dict[str, Any]:
        lines = [f"{m.severity.value} · {m.label} · {m.category} · {m.incident_id} · "
                 f"{cut(m.summary, scaled(160, scale))}" for m in d.items]
        elements: list[dict[str, Any]] = [
            _markdown(f"**{d.total}** incident notifications grouped into one message"),
            _text("\n".join(lines)),
        ]
        if d.more:
            elements.append(_markdown(f"…and **{d.more}** more incidents"))
        if d.list_url:
            elements.append(_button("All open incidents", d.list_url, "primary"))
        return _card(f"Argus: {d.title}", "grouped", _COLOURS[d.severity], elements)

    def finish(self, data: dict[str, Any], now: datetime) -> Request:
        secret = self.config.secret.get_secret_value() if self.config.secret else None
        if secret:
            timestamp = int(now.timestamp())
            data = {"timestamp": str(timestamp), "sign": feishu_sign(secret, timestamp), **data}
        return Request(self.config.url, encode(data), {"Content-Type": "application/json; charset=utf-8"})

    def judge_body(self, text: str) -> Judgement:
        return self.judge_code(text, "code", "msg")


def _card(title: str, subtitle: str, template: str, elements: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": {"title": {"tag": "plain_text", "content": title},
                   "subtitle": {"tag": "plain_text", "content": subtitle}, "template": template},
        "body": {"elements": elements},
    }
