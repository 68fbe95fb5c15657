"""What every IM channel shares: building a request within the platform's size limit, and reading its answer.

A platform module (feishu, dingtalk, wecom, slack, signed_webhook) says three things: the payload for a message or
a digest (`payload`, with its text limits scaled by `scale` so an oversized body can be shrunk), how a request is
signed (`finish`), and which answers mean "try again" (`judge_body`). HTTP 429 and 5xx are retried everywhere;
other 4xx are not. A 200 can still be a refusal: Feishu, DingTalk and WeCom answer errors as JSON codes in a 200,
Slack as a body other than "ok".

Why not apprise (it has feishu, lark, dingtalk, wecombot and slack plugins): read in caronc/apprise, its Feishu and
WeCom-bot plugins post `text` only (no card, no Markdown, no signing for Feishu), its DingTalk plugin posts Markdown
but keeps `msgtype: text`; none of them reads the error code in a 200 answer, so a refused message counts as sent;
each builds the URL from a token on a fixed host (open.feishu.cn, oapi.dingtalk.com, qyapi.weixin.qq.com), so neither
a proxy nor a test receiver can stand in; and its own throttle and retry would fight the dispatcher's. Only its Slack
plugin sends blocks, which alone would not justify a dependency. httpx, already one, posts for every channel.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

from argus.notify.message import STEP_TEXT_MAX, Digest, Message, cut
from core.channels import ChannelConfig
from core.errors import ArgusError
from core.types import Category, Severity, utcnow

Item = Message | Digest

# Text limits are multiplied by these in turn until the body fits the platform's size limit.
SCALES = (1.0, 0.5, 0.25, 0.1, 0.0)


@dataclass(frozen=True)
class Request:
    url: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Judgement:
    ok: bool
    retry: bool = False
    error: str | None = None
    code: str | None = None  # the platform's own error code, when it gave one
    retry_after_s: float | None = None


OK = Judgement(ok=True)


class Channel(ABC):
    kind: ClassVar[str]
    per_minute: ClassVar[float]  # the platform's documented rate limit for one bot
    max_body_bytes: ClassVar[int]
    # Platform error codes that no retry can fix (bad signature, unknown bot, body too long, bad format).
    permanent_codes: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: ChannelConfig) -> None:
        if config.kind != self.kind:
            raise ArgusError(f"channel {config.name} is configured as {config.kind}, not {self.kind}",
                             hint="build channels with argus.notify.registry.build_channels")
        self.config = config
        self.name = config.name

    def wants(self, severity: Severity, category: str) -> bool:
        try:
            return self.config.wants(severity, Category(category))
        except ValueError:
            return not self.config.categories

    # ---- what a platform module provides -------------------------------------------------------------

    @abstractmethod
    def payload(self, item: Item, scale: float) -> dict[str, Any]:
        """The platform's JSON body for `item`, its free texts cut to `scale` of their full length."""

    def finish(self, data: dict[str, Any], now: datetime) -> Request:
        """Encode (and sign) the payload. The default: JSON posted to the configured URL as is."""
        return Request(self.config.url, encode(data), {"Content-Type": "application/json; charset=utf-8"})

    def measured(self, request: Request, data: dict[str, Any]) -> int:
        """The size the platform limits (the whole body unless it limits one field)."""
        return len(request.body)

    def judge_body(self, text: str) -> Judgement:
        return OK

    # ---- shared --------------------------------------------------------------------------------------

    def request(self, item: Item, now: datetime) -> Request:
        """The request for `item`, its text cut until the platform's size limit holds."""
        size = 0
        for scale in SCALES:
            data = self.payload(item, scale)
            req = self.finish(data, now)
            size = self.measured(req, data)
            if size <= self.max_body_bytes:
                return req
        raise ArgusError(
            f"channel {self.name}: the {self.kind} message is {size} bytes even with every text cut, over the "
            f"platform's {self.max_body_bytes}",
            hint="this is a bug in the channel's payload builder; report it with the incident id",
        )

    def judge(self, status: int, text: str, headers: Mapping[str, str]) -> Judgement:
        retry_after = _retry_after(headers.get("retry-after"))
        if status == 429 or status >= 500:
            return Judgement(ok=False, retry=True, error=f"HTTP {status}: {_brief(text)}", retry_after_s=retry_after)
        if status >= 300:
            return Judgement(ok=False, retry=False, error=f"HTTP {status}: {_brief(text)}")
        return self.judge_body(text)

    def judge_code(self, text: str, key: str, message_key: str) -> Judgement:
        """For platforms answering `{key: 0}` on success and another code with `message_key` on refusal."""
        try:
            data = json.loads(text)
        except ValueError:
            return Judgement(ok=False, retry=True, error=f"answer is not JSON: {_brief(text)}")
        if not isinstance(data, dict) or key not in data:
            return Judgement(ok=False, retry=True, error=f"answer has no {key!r}: {_brief(text)}")
        code = str(data.get(key))
        if code == "0":
            return OK
        error = f"{self.kind} {key} {code}: {_brief(str(data.get(message_key, '')))}"
        return Judgement(ok=False, retry=code not in self.permanent_codes, error=error, code=code)


def encode(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def scaled(limit: int, scale: float) -> int:
    return int(limit * scale)


# ---- escaping: each channel's markup --------------------------------------------------------------------

_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# DingTalk and WeCom document no escape for their Markdown subsets, and both render some HTML (<font>, and WeCom's
# <@userid> mention): the characters that open a tag or a link become their fullwidth forms, which read the same.
_LITE = str.maketrans({"<": "＜", ">": "＞", "[": "［", "]": "］", "`": "ˋ", "|": "｜"})


def escape_slack(text: str) -> str:
    """Slack's mrkdwn: &, < and > are the only control characters (`<!channel>`, `<url|text>`, `<@U1>`)."""
    return text.translate(_SLACK)


def escape_lite(text: str) -> str:
    return text.translate(_LITE)


MAX_APPROVALS = 5  # approve/reject pairs one message offers; the rest are reached through the incident


def step_texts(m: Message, scale: float) -> list[str]:
    """Remediation's steps, one line each, what each did or would do cut to `scale` of STEP_TEXT_MAX (at scale 0
    only the step and its status), then how many more there are. Untrusted: the channel escapes each line."""
    lines = [s.line(scaled(STEP_TEXT_MAX, scale)) for s in m.steps]
    if m.steps_more:
        lines.append(f"…and {m.steps_more} more steps")
    return lines


def markdown_actions(m: Message, proposal_chars: int) -> list[str]:
    """The approve/reject lines and the report/incident links of a message, in the Markdown DingTalk and
    WeCom share (their link syntax is the same; untrusted text is escaped with escape_lite)."""
    lines = [f"**Proposed**: {escape_lite(cut(f'{a.kind} on {a.target} ({a.action_id})', proposal_chars))} · "
             f"[Approve]({a.approve_url}) · [Reject]({a.reject_url})" for a in m.approvals[:MAX_APPROVALS]]
    links = [f"[{label}]({url})" for label, url in (("Open report", m.report_url), ("Incident", m.incident_url))
             if url]
    if links:
        lines.append(" · ".join(links))
    return lines


def _brief(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - utcnow()).total_seconds())
