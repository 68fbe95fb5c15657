"""WeCom (企业微信) group robot: a `markdown` message in its documented subset.

Checked against the group robot guide, https://developer.work.weixin.qq.com/document/path/91770:
- POST JSON `{"msgtype": "markdown", "markdown": {"content": ...}}`; the content is UTF-8, at most 4096 bytes
  (longer is refused with errcode 40058, "markdown.content exceed max length 4096"). The subset: headings, bold,
  links `[text](url)`, inline code, quotes, `<font color="info|comment|warning">` and the `<@userid>` mention.
- No signing: the `key` in the webhook URL is the credential.
- Limit: 20 messages a minute per robot (errcode 45009, "api freq out of limit", beyond it). Answers:
  `{"errcode": 0, "errmsg": "ok"}`; 93000 is an invalid webhook URL.
"""

from __future__ import annotations

from typing import Any

from argus.notify.channels import (
    Channel,
    Item,
    Judgement,
    Request,
    escape_lite,
    markdown_actions,
    scaled,
    step_texts,
)
from argus.notify.message import Digest, Message, cut
from core.types import Severity

CONTENT_MAX_BYTES = 4096
_COLOURS = {Severity.CRITICAL: "warning", Severity.WARNING: "warning", Severity.INFO: "comment"}


class WeComChannel(Channel):
    kind = "wecom"
    per_minute = 20.0
    max_body_bytes = CONTENT_MAX_BYTES  # of markdown.content, see `measured`
    permanent_codes = frozenset({"40058", "93000"})

    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        content = self._digest(item, scale) if isinstance(item, Digest) else self._message(item, scale)
        return {"msgtype": "markdown", "markdown": {"content": content}}

    def measured(self, request: Request, data: dict[str, Any]) -> int:
        return len(data["markdown"]["content"].encode("utf-8"))

    def _message(self, m: Message, scale: float) -> str:
        colour = "info" if m.event == "resolved" else _COLOURS[m.severity]
        lines = [
            f"### {escape_lite(cut(m.title, 150))}",
            f"> {m.label} · severity <font color=\"{colour}\">{m.severity.value}</font> · "
            f"**{m.category}** · state **{m.state}** · {m.incident_id}"
            + m.history,
        ]
        lines += [f"> {label}: {escape_lite(value)}" for label, value in
                  (("Job", m.job), ("Node", m.node), ("Owner", m.owner)) if value]
        if m.summary and scale > 0:
            lines.append(escape_lite(cut(m.summary, scaled(1500, scale))))
        if m.report_summary and scale > 0:
            lines.append("**Root cause**: " + escape_lite(cut(m.report_summary, scaled(800, scale))))
        if m.resolution:
            lines.append("**Resolved** " + escape_lite(cut(m.resolution, scaled(500, scale) or 160)))
        if m.steps:
            lines.append("**Remediation**")
            lines += [f"- {escape_lite(line)}" for line in step_texts(m, scale)]
        lines += markdown_actions(m, 200)
        return "\n".join(lines)

    def _digest(self, d: Digest, scale: float) -> str:
        lines = [f"### Argus: {d.title}"]
        lines += [f"> <font color=\"{_COLOURS[m.severity]}\">{m.severity.value}</font> {m.label} · "
                  f"{m.category} · {m.incident_id} · {escape_lite(cut(m.summary, scaled(120, scale)))}"
                  for m in d.items]
        if d.more:
            lines.append(f"…and **{d.more}** more incidents")
        if d.list_url:
            lines.append(f"[All open incidents]({d.list_url})")
        return "\n".join(lines)

    def judge_body(self, text: str) -> Judgement:
        return self.judge_code(text, "errcode", "errmsg")
