"""Slack incoming webhook: Block Kit `blocks` (header, mrkdwn sections, context, link buttons) plus `text`.

Checked against https://api.slack.com/messaging/webhooks, the block reference
https://api.slack.com/reference/block-kit/blocks and https://api.slack.com/reference/surfaces/formatting:
- POST JSON `{"text": ..., "blocks": [...]}`; `text` is the fallback shown in notifications. Limits: at most 50
  blocks; a header's plain_text 150 characters; a section's text 3000 and each of at most 10 fields 2000; a
  context at most 10 elements; an actions block at most 25 elements; a button's text 75 characters, its url 3000,
  its action_id 255.
- mrkdwn: `&`, `<` and `>` must be escaped as `&amp;`, `&lt;`, `&gt;`; everything Slack turns into a mention or a
  link (`<!channel>`, `<!here>`, `<@U123>`, `<https://x|label>`) starts with `<`.
- No signing: the URL is the credential. The answer is `ok` (HTTP 200); refusals are 4xx with a short text
  (`invalid_payload`, `invalid_blocks`, `no_service`...). Rate limit: about one message a second per webhook, short
  bursts allowed; beyond it HTTP 429 with Retry-After (https://api.slack.com/docs/rate-limits).
"""

from __future__ import annotations

from typing import Any

from argus.notify.channels import (
    MAX_APPROVALS,
    Channel,
    Item,
    Judgement,
    escape_lite,
    escape_slack,
    scaled,
    step_texts,
)
from argus.notify.message import Digest, Message, cut


def mrkdwn(text: str, limit: int) -> str:
    """`text` escaped for mrkdwn and at most `limit` characters after escaping (an entity is never split)."""
    escaped = escape_slack(cut(text, limit))
    if len(escaped) <= limit:
        return escaped
    low, high = 0, min(limit, len(text))  # the longest cut whose escaped form fits
    while low < high:
        mid = (low + high + 1) // 2
        if len(escape_slack(cut(text, mid))) <= limit:
            low = mid
        else:
            high = mid - 1
    return escape_slack(cut(text, low))


def _button(label: str, url: str, action_id: str, style: str | None = None) -> dict[str, Any] | None:
    if len(url) > 3000:
        return None  # Slack refuses the whole message for one overlong url
    button: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": cut(label, 75)},
                              "url": url, "action_id": action_id[:255]}
    if style:
        button["style"] = style
    return button


def _actions(*buttons: dict[str, Any] | None) -> list[dict[str, Any]]:
    elements = [b for b in buttons if b is not None][:25]
    return [{"type": "actions", "elements": elements}] if elements else []


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


class SlackChannel(Channel):
    kind = "slack"
    per_minute = 60.0
    max_body_bytes = 1_000_000  # no documented body limit; the per-block limits above bound it far lower

    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        if isinstance(item, Digest):
            return self._digest(item, scale)
        return self._message(item, scale)

    def _message(self, m: Message, scale: float) -> dict[str, Any]:
        facts = f"*{m.label}* · severity *{m.severity.value}* · *{m.category}* · state *{m.state}*"
        blocks: list[dict[str, Any]] = [
            # plain_text renders no markup, but the title names the job and owner from metadata: nothing in it may
            # even look like a mention or a link, so < and > become their fullwidth forms (as in DingTalk and WeCom)
            {"type": "header", "text": {"type": "plain_text", "text": escape_lite(cut(m.title, 150)), "emoji": True}},
            _section(facts),
        ]
        fields = [{"type": "mrkdwn", "text": f"*{label}*\n{mrkdwn(value, 1900)}"}
                  for label, value in (("Job", m.job), ("Node", m.node), ("Owner", m.owner)) if value]
        if fields:
            blocks.append({"type": "section", "fields": fields})
        if m.summary and scale > 0:
            blocks.append(_section(mrkdwn(m.summary, scaled(3000, scale))))
        if m.report_summary and scale > 0:
            blocks.append(_section("*Root cause*\n" + mrkdwn(m.report_summary, scaled(2900, scale))))
        if m.resolution:
            blocks.append(_section("*Resolved* " + mrkdwn(m.resolution, scaled(1500, scale) or 160)))
        if m.steps:
            lines = step_texts(m, scale)
            per_line = 2900 // len(lines) - 4  # the section's 3000, less its heading and the bullets
            blocks.append(_section("*Remediation*\n" + "\n".join(f"• {mrkdwn(line, per_line)}" for line in lines)))
        for i, a in enumerate(m.approvals[:MAX_APPROVALS]):
            blocks.append(_section("*Proposed*: " + mrkdwn(f"{a.kind} on {a.target} ({a.action_id})", 2900)))
            blocks += _actions(_button("Approve", a.approve_url, f"approve-{i}", "primary"),
                               _button("Reject", a.reject_url, f"reject-{i}", "danger"))
        blocks += _actions(
            _button("Open report", m.report_url, "report", "primary") if m.report_url else None,
            _button("Incident", m.incident_url, "incident") if m.incident_url else None,
        )
        context = f"Argus · `{m.incident_id}`" + m.history
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
        fallback = mrkdwn(f"{m.title}: {m.summary}", scaled(3000, scale) or 300)
        return {"text": fallback, "blocks": blocks[:50]}

    def _digest(self, d: Digest, scale: float) -> dict[str, Any]:
        per_line = max(40, 2900 // max(1, len(d.items)))
        lines = [f"• *{m.severity.value}* {m.label} · {m.category} · `{m.incident_id}` · "
                 f"{mrkdwn(m.summary, min(per_line, scaled(200, scale)))}" for m in d.items]
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": cut(f"Argus: {d.title}", 150)}},
            _section(cut("\n".join(lines), 3000)),
        ]
        if d.more:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn",
                                                             "text": f"…and *{d.more}* more incidents"}]})
        blocks += _actions(_button("All open incidents", d.list_url, "list", "primary") if d.list_url else None)
        return {"text": mrkdwn(f"Argus: {d.title}", 300), "blocks": blocks}

    def judge_body(self, text: str) -> Judgement:
        if text.strip() == "ok":
            return Judgement(ok=True)
        return Judgement(ok=False, retry=True, error=f"slack answered {text.strip()[:200]!r} instead of 'ok'")
