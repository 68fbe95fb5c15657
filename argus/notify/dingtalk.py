"""DingTalk custom robot: a `markdown` message (title, text), optionally signed in the query string.

Checked against the custom robot guide, https://open.dingtalk.com/document/robots/custom-robot-access, and the
message types, https://open.dingtalk.com/document/orgapp/message-type:
- POST JSON `{"msgtype": "markdown", "markdown": {"title": ..., "text": ...}, "at": {...}}`; the title is what
  the conversation list shows; the text is a Markdown subset (headings, quotes, bold, links, images, lists) plus
  some HTML (`<font>`). Mentions come only from `at.atMobiles` / `at.atUserIds` / `at.isAtAll`, which are always
  empty / false here.
- Signing ("加签"): `timestamp` in milliseconds (within an hour) and `sign` = urlEncode(base64(HmacSHA256(
  key=secret, msg=f"{timestamp}\\n{secret}"))) appended to the webhook URL's query.
- Limits: 20 messages a minute per robot, after which it is throttled for 10 minutes (errcode 130101, "send too
  fast, exceed 20 times per minute"); the body at most 20000 bytes (errcode 460101). Answers: `{"errcode": 0}`;
  310000 is a failed security check (signature, keyword or IP), 300001 an unknown robot token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus

from argus.notify.channels import (
    Channel,
    Item,
    Judgement,
    Request,
    encode,
    escape_lite,
    markdown_actions,
    scaled,
    step_texts,
)
from argus.notify.message import Digest, Message, cut
from core.types import Severity

_ICONS = {Severity.CRITICAL: "🔴", Severity.WARNING: "🟠", Severity.INFO: "🔵"}


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """The signature before URL-encoding (the query string encodes it)."""
    digest = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


class DingTalkChannel(Channel):
    kind = "dingtalk"
    per_minute = 20.0
    max_body_bytes = 20_000
    permanent_codes = frozenset({"300001", "310000", "460101"})

    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        if isinstance(item, Digest):
            title, text = f"Argus: {item.title}", self._digest(item, scale)
        else:
            title, text = escape_lite(cut(item.title, 64)), self._message(item, scale)
        return {"msgtype": "markdown", "markdown": {"title": title, "text": text},
                "at": {"atMobiles": [], "atUserIds": [], "isAtAll": False}}

    def _message(self, m: Message, scale: float) -> str:
        icon = "✅" if m.event == "resolved" else _ICONS[m.severity]
        parts = [
            f"#### {icon} {escape_lite(cut(m.title, 150))}",
            f"**{m.label}** · severity **{m.severity.value}** · **{m.category}** · state "
            f"**{m.state}** · {m.incident_id}" + m.history,
        ]
        who = [f"- **{label}**: {escape_lite(value)}" for label, value in
               (("Job", m.job), ("Node", m.node), ("Owner", m.owner)) if value]
        if who:
            parts.append("\n".join(who))
        if m.summary and scale > 0:
            parts.append("> " + escape_lite(cut(m.summary, scaled(2000, scale))))
        if m.report_summary and scale > 0:
            parts.append("**Root cause**: " + escape_lite(cut(m.report_summary, scaled(1000, scale))))
        if m.resolution:
            parts.append("**Resolved** " + escape_lite(cut(m.resolution, scaled(600, scale) or 160)))
        if m.steps:
            parts.append("**Remediation**\n\n" + "\n".join(f"- {escape_lite(line)}" for line in step_texts(m, scale)))
        parts += markdown_actions(m, 300)
        return "\n\n".join(parts)

    def _digest(self, d: Digest, scale: float) -> str:
        lines = [f"- **{m.severity.value}** {m.label} · {m.category} · {m.incident_id} · "
                 f"{escape_lite(cut(m.summary, scaled(160, scale)))}" for m in d.items]
        parts = [f"#### {_ICONS[d.severity]} Argus: {d.title}", "\n".join(lines)]
        if d.more:
            parts.append(f"…and **{d.more}** more incidents")
        if d.list_url:
            parts.append(f"[All open incidents]({d.list_url})")
        return "\n\n".join(parts)

    def finish(self, data: dict[str, Any], now: datetime) -> Request:
        url = self.config.url
        secret = self.config.secret.get_secret_value() if self.config.secret else None
        if secret:
            timestamp = int(now.timestamp() * 1000)
            sep = "&" if "?" in url else "?"
            url = f"{url}{sep}timestamp={timestamp}&sign={quote_plus(dingtalk_sign(secret, timestamp))}"
        return Request(url, encode(data), {"Content-Type": "application/json; charset=utf-8"})

    def judge_body(self, text: str) -> Judgement:
        return self.judge_code(text, "errcode", "errmsg")
