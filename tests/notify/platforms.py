"""The IM platforms as the tests play them: each documented webhook format written as data, a checker for it, and
a real local HTTP receiver that answers as the platform does (its success body, its error codes, its signature
check), so a test sees what the platform would have said.

Sources of the formats and limits are cited in each argus/notify/<platform>.py. Error bodies the receivers send are
copied from public issue threads (the repo#number beside each); success bodies are the platforms' documented ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stage.localstack.webhook_receiver import Reply, WebhookReceiver

# ---- error bodies copied from public issue threads -----------------------------------------------------------

# feiyu563/PrometheusAlert#422 (the same body in apache/dolphinscheduler#16569)
FEISHU_BAD_SIGN = {"code": 19021, "data": {},
                   "msg": "sign match fail or timestamp is not within one hour from current time"}
# ccfos/nightingale#369: "ErrCode = 130101 ErrMsg = send too fast, exceed 20 times per minute"
DINGTALK_TOO_FAST = {"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"}
# Le0nsec/SecCrawler#12
DINGTALK_TOO_LONG = {"errcode": 460101, "errmsg": "message too long, exceed 20000 bytes"}
# sunmh207/AI-Codereview-Gitlab#142 (the errmsg; 310000 is the documented code of a failed security check)
DINGTALK_BAD_SIGN = {"errcode": 310000, "errmsg": (
    "description:机器人发送签名不匹配;solution:请确认签名和生成签名的时间戳必须都放在调用的网址中，"
    "请确认机器人的密钥加密和填写正确;link:请参考本接口对应文档获得具体要求，"
    "或者在https://open.dingtalk.com/document/  搜索相关文档;")}
# RayWangQvQ/BiliBiliTool#569
WECOM_TOO_LONG = {"errcode": 40058, "errmsg": "markdown.content exceed max length 4096. Invalid input invalid Request "
                  "Parameter, hint: [1620132870_51_88bf6103b527f4f0bbb712c0427fe5], from ip: 182.254.27.209, more info "
                  "at https://open.work.weixin.qq.com/devtool/query?e=40058"}
# WecomTeam/wecom-openclaw-plugin#48: "errcode=45009, errmsg=api freq out of limit, hint: [...]"
WECOM_FREQ = {"errcode": 45009, "errmsg": "api freq out of limit, hint: [1773643642077182456917975], from ip: "
              "121.15.137.254, more info at https://open.work.weixin.qq.com/devtool/query?e=45009"}
# maknz/slack#36 (Slack's own description of its 429 body for incoming webhooks)
SLACK_RATE_LIMITED = {"ok": False, "count_hour_ago": 400, "count_minute_ago": 100, "count_second_ago": 5}
# sourcegraph/sourcegraph-public-snapshot#49979: 400 Bad Request with body "invalid_blocks"
SLACK_INVALID_BLOCKS = "invalid_blocks"

# Documented success answers.
FEISHU_OK = {"StatusCode": 0, "StatusMessage": "success", "code": 0, "data": {}, "msg": "success"}
FEISHU_BAD_REQUEST = {"code": 9499, "msg": "Bad Request", "data": {}}
DINGTALK_OK = {"errcode": 0, "errmsg": "ok"}
WECOM_OK = {"errcode": 0, "errmsg": "ok"}


# ---- a small schema language: the documented formats as data ---------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    type: type | tuple[type, ...] = str
    choices: frozenset[Any] | None = None
    max_len: int | None = None  # characters
    max_bytes: int | None = None  # UTF-8 bytes
    min_len: int = 0
    pattern: str | None = None


@dataclass(frozen=True)
class ListOf:
    item: Any
    max_items: int | None = None
    min_items: int = 0


@dataclass(frozen=True)
class Variant:
    """Objects told apart by one key (a Feishu element's `tag`, a Slack block's `type`)."""

    key: str
    specs: dict[str, Any]


def S(*values: str) -> frozenset[str]:  # noqa: N802 - reads as a set literal in the specs below
    return frozenset(values)


URL = Leaf(str, pattern=r"^https?://[^\s<>\"'`]+$", max_len=3000)

FEISHU_TEMPLATES = S("blue", "wathet", "turquoise", "green", "yellow", "orange", "red", "carmine", "violet", "purple",
                     "indigo", "grey", "default")
FEISHU_PLAIN = {"tag": Leaf(choices=S("plain_text")), "content": Leaf()}
FEISHU_BUTTON = {
    "tag": Leaf(choices=S("button")),
    "text": FEISHU_PLAIN,
    "type": Leaf(choices=S("default", "primary", "danger", "text", "primary_text", "danger_text",
                           "primary_filled", "danger_filled", "laser")),
    "behaviors": ListOf({"type": Leaf(choices=S("open_url")), "default_url": URL}, min_items=1),
}
FEISHU_ELEMENT = Variant("tag", {
    "markdown": {"tag": Leaf(choices=S("markdown")), "content": Leaf(min_len=1)},
    "div": {"tag": Leaf(choices=S("div")),
            "text": {"tag": Leaf(choices=S("plain_text", "lark_md")), "content": Leaf()}},
    "button": FEISHU_BUTTON,
})
FEISHU = {
    "msg_type": Leaf(choices=S("interactive")),
    "?timestamp": Leaf(pattern=r"^\d{10}$"),
    "?sign": Leaf(min_len=1),
    "card": {
        "schema": Leaf(choices=S("2.0")),
        "?config": {"?update_multi": Leaf(bool)},
        "header": {"title": FEISHU_PLAIN, "?subtitle": FEISHU_PLAIN, "template": Leaf(choices=FEISHU_TEMPLATES)},
        "body": {"elements": ListOf(FEISHU_ELEMENT, min_items=1)},
    },
}
FEISHU_MAX_BODY = 20_000

DINGTALK = {
    "msgtype": Leaf(choices=S("markdown")),
    "markdown": {"title": Leaf(min_len=1), "text": Leaf(min_len=1)},
    "?at": {"?atMobiles": ListOf(Leaf()), "?atUserIds": ListOf(Leaf()), "?isAtAll": Leaf(bool)},
}
DINGTALK_MAX_BODY = 20_000

WECOM = {"msgtype": Leaf(choices=S("markdown")), "markdown": {"content": Leaf(min_len=1, max_bytes=4096)}}

SLACK_PLAIN = {"type": Leaf(choices=S("plain_text")), "text": Leaf(min_len=1), "?emoji": Leaf(bool)}
SLACK_MRKDWN = {"type": Leaf(choices=S("mrkdwn")), "text": Leaf(min_len=1, max_len=3000)}
SLACK_BUTTON = {"type": Leaf(choices=S("button")), "text": {**SLACK_PLAIN, "text": Leaf(min_len=1, max_len=75)},
                "?url": URL, "?action_id": Leaf(max_len=255), "?style": Leaf(choices=S("primary", "danger"))}
SLACK_BLOCK = Variant("type", {
    "header": {"type": Leaf(choices=S("header")), "text": {**SLACK_PLAIN, "text": Leaf(min_len=1, max_len=150)}},
    "section": {"type": Leaf(choices=S("section")), "?text": SLACK_MRKDWN,
                "?fields": ListOf({**SLACK_MRKDWN, "text": Leaf(min_len=1, max_len=2000)}, min_items=1, max_items=10)},
    "context": {"type": Leaf(choices=S("context")), "elements": ListOf(SLACK_MRKDWN, min_items=1, max_items=10)},
    "actions": {"type": Leaf(choices=S("actions")), "elements": ListOf(SLACK_BUTTON, min_items=1, max_items=25)},
    "divider": {"type": Leaf(choices=S("divider"))},
})
SLACK = {"text": Leaf(min_len=1, max_len=40_000), "blocks": ListOf(SLACK_BLOCK, min_items=1, max_items=50)}

WEBHOOK_ONE = {
    "schema": Leaf(choices=S("argus.event.v1")),  # the version of the events' contract (argus/notify/event_schema.py)
    "event": Leaf(pattern=r"^incident\.(opened|updated|resolved|report_ready|approval_needed|planned|step_finished)$"),
    "incident": {"id": Leaf(min_len=1), "*": None},
    # what the incident is about as people name it (core.names); absent only when the incident is not known
    "?about": {"label": Leaf(min_len=1), "job": Leaf((str, type(None))), "node": Leaf((str, type(None))),
               "owner": Leaf((str, type(None))), "entrypoint": Leaf((str, type(None)))},
    "link": Leaf((str, type(None))),
    "report": Leaf((str, type(None))),
    "?report_summary": Leaf(),
    "?resolution": Leaf(),
    "?approvals": ListOf({"action_id": Leaf(), "kind": Leaf(), "target": Leaf(), "approve": URL, "reject": URL}),
    # remediation's steps, what each did or would do (argus/notify/message.py STEPS_MAX, STEP_TEXT_MAX)
    "?steps": ListOf({"action_id": Leaf(min_len=1), "kind": Leaf(min_len=1), "status": Leaf(min_len=1),
                      "text": Leaf(max_len=300)}, max_items=6),
    "?steps_more": Leaf(int),
    "?sent_at": Leaf(int),
}
WEBHOOK_DIGEST = {"schema": Leaf(choices=S("argus.event.v1")), "event": Leaf(choices=S("incident.digest")),
                  "items": ListOf(WEBHOOK_ONE, min_items=2), "more": Leaf(int), "list": Leaf((str, type(None))),
                  "sent_at": Leaf(int)}


def check(spec: Any, value: Any, where: str = "$") -> list[str]:
    """Every way `value` breaks `spec`; unknown keys count, so a misspelt field fails (the platforms ignore or
    refuse it)."""
    if isinstance(spec, Leaf):
        return _check_leaf(spec, value, where)
    if isinstance(spec, ListOf):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        problems = []
        if len(value) < spec.min_items or (spec.max_items is not None and len(value) > spec.max_items):
            problems.append(f"{where}: {len(value)} items, allowed {spec.min_items}..{spec.max_items}")
        for i, item in enumerate(value):
            problems += check(spec.item, item, f"{where}[{i}]")
        return problems
    if isinstance(spec, Variant):
        if not isinstance(value, dict) or value.get(spec.key) not in spec.specs:
            return [f"{where}: {spec.key}={value.get(spec.key) if isinstance(value, dict) else value!r} is not one "
                    f"of {sorted(spec.specs)}"]
        return check(spec.specs[value[spec.key]], value, where)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        problems = []
        known = {k.lstrip("?") for k in spec}
        for key, sub in spec.items():
            name = key.lstrip("?")
            if name == "*":
                continue
            if name not in value:
                if not key.startswith("?"):
                    problems.append(f"{where}: missing {name!r}")
                continue
            problems += check(sub, value[name], f"{where}.{name}")
        if "*" not in known:
            problems += [f"{where}: unknown key {k!r}" for k in value if k not in known]
        return problems
    return [f"{where}: bad spec {spec!r}"]


def _check_leaf(spec: Leaf, value: Any, where: str) -> list[str]:
    if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
        return [f"{where}: expected {spec.type}, got {type(value).__name__}"]
    problems = []
    if spec.choices is not None and value not in spec.choices:
        problems.append(f"{where}: {value!r} not in {sorted(spec.choices)}")
    if isinstance(value, str):
        if len(value) < spec.min_len:
            problems.append(f"{where}: empty")
        if spec.max_len is not None and len(value) > spec.max_len:
            problems.append(f"{where}: {len(value)} characters > {spec.max_len}")
        if spec.max_bytes is not None and len(value.encode()) > spec.max_bytes:
            problems.append(f"{where}: {len(value.encode())} bytes > {spec.max_bytes}")
        if spec.pattern is not None and not re.search(spec.pattern, value):
            problems.append(f"{where}: {value[:80]!r} does not match {spec.pattern}")
    return problems


# ---- the platforms: receivers that check and answer as documented ----------------------------------------------


@dataclass
class Platform:
    """A real HTTP receiver playing one IM platform. `problems` collects every schema or signature failure;
    `script` answers the next POSTs (then the platform's own behaviour resumes)."""

    kind: str
    secret: str | None = None
    receiver: WebhookReceiver = field(default_factory=WebhookReceiver)
    problems: list[str] = field(default_factory=list)
    script: list[Reply] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Platform:
        self.receiver.set_reply(self._answer)
        self.receiver.start()
        return self

    @property
    def url(self) -> str:
        token = {"feishu": "/open-apis/bot/v2/hook/tok123", "dingtalk": "/robot/send?access_token=tok123",
                 "wecom": "/cgi-bin/webhook/send?key=tok123", "slack": "/services/T0/B0/tok123"}.get(self.kind, "/hook")
        return self.receiver.url + token

    @property
    def received(self) -> list[dict[str, Any]]:
        return self.receiver.received

    def bodies(self) -> list[Any]:
        return [item["body"] for item in self.received]

    def _answer(self, item: dict[str, Any]) -> Reply:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        problems = _CHECKS[self.kind](self, item)
        if problems:
            self.problems += problems
        return _REPLIES[self.kind](problems)


def _feishu(p: Platform, item: dict[str, Any]) -> list[str]:
    problems = [] if len(item["raw"]) <= FEISHU_MAX_BODY else [f"body {len(item['raw'])} bytes > {FEISHU_MAX_BODY}"]
    body = item["body"]
    problems += check(FEISHU, body)
    if p.secret and not problems:
        timestamp = str(body.get("timestamp", ""))
        key = f"{timestamp}\n{p.secret}".encode()
        expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
        if not timestamp.isdigit() or not hmac.compare_digest(expected, str(body.get("sign", ""))) or \
                abs(time.time() - int(timestamp)) > 3600:
            problems.append("sign")
    return problems


def _dingtalk(p: Platform, item: dict[str, Any]) -> list[str]:
    problems = [] if len(item["raw"]) <= DINGTALK_MAX_BODY else [f"body {len(item['raw'])} bytes > {DINGTALK_MAX_BODY}"]
    problems += check(DINGTALK, item["body"])
    query = parse_qs(urlsplit(item["path"]).query)
    if query.get("access_token") != ["tok123"]:
        problems.append("access_token")
    if p.secret:
        timestamp = (query.get("timestamp") or [""])[0]
        string_to_sign = f"{timestamp}\n{p.secret}".encode()
        expected = base64.b64encode(hmac.new(p.secret.encode(), string_to_sign, hashlib.sha256).digest()).decode()
        sign = (query.get("sign") or [""])[0]
        if not timestamp.isdigit() or not hmac.compare_digest(expected, sign) or \
                abs(time.time() * 1000 - int(timestamp)) > 3_600_000:
            problems.append("sign")
    return problems


def _wecom(p: Platform, item: dict[str, Any]) -> list[str]:
    return check(WECOM, item["body"])


def _slack(p: Platform, item: dict[str, Any]) -> list[str]:
    body = item["body"]
    problems = check(SLACK, body)
    for i, block in enumerate(body.get("blocks", []) if isinstance(body, dict) else []):
        if block.get("type") == "section" and "text" not in block and "fields" not in block:
            problems.append(f"$.blocks[{i}]: a section needs text or fields")
        ids = [e.get("action_id") for e in block.get("elements", []) if block.get("type") == "actions"]
        if len(ids) != len(set(ids)):
            problems.append(f"$.blocks[{i}]: duplicate action_id")
    return problems


def _webhook(p: Platform, item: dict[str, Any]) -> list[str]:
    body = item["body"]
    spec = WEBHOOK_DIGEST if isinstance(body, dict) and body.get("event") == "incident.digest" else WEBHOOK_ONE
    problems = check(spec, body)
    if p.secret:
        headers = {k.lower(): v for k, v in item["headers"].items()}
        expected = "sha256=" + hmac.new(p.secret.encode(), item["raw"], hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, headers.get("x-argus-signature", "")):
            problems.append("signature")
        if str(body.get("sent_at")) != headers.get("x-argus-timestamp") or \
                abs(time.time() - int(headers.get("x-argus-timestamp") or 0)) > 300:
            problems.append("timestamp")
    return problems


_CHECKS: dict[str, Callable[[Platform, dict[str, Any]], list[str]]] = {
    "feishu": _feishu, "dingtalk": _dingtalk, "wecom": _wecom, "slack": _slack, "webhook": _webhook,
}


def _feishu_reply(problems: list[str]) -> Reply:
    if "sign" in problems:
        return Reply(200, FEISHU_BAD_SIGN)
    return Reply(400, FEISHU_BAD_REQUEST) if problems else Reply(200, FEISHU_OK)


def _dingtalk_reply(problems: list[str]) -> Reply:
    if "sign" in problems:
        return Reply(200, DINGTALK_BAD_SIGN)
    if any("bytes >" in p for p in problems):
        return Reply(200, DINGTALK_TOO_LONG)
    return Reply(400, {"errcode": 400, "errmsg": "; ".join(problems)}) if problems else Reply(200, DINGTALK_OK)


def _wecom_reply(problems: list[str]) -> Reply:
    return Reply(200, WECOM_TOO_LONG if problems else WECOM_OK)


def _slack_reply(problems: list[str]) -> Reply:
    return Reply(400, SLACK_INVALID_BLOCKS) if problems else Reply(200, "ok")


def _webhook_reply(problems: list[str]) -> Reply:
    return Reply(401 if {"signature", "timestamp"} & set(problems) else 400, {"problems": problems}) if problems \
        else Reply(200, {"ok": True})


_REPLIES: dict[str, Callable[[list[str]], Reply]] = {
    "feishu": _feishu_reply, "dingtalk": _dingtalk_reply, "wecom": _wecom_reply, "slack": _slack_reply,
    "webhook": _webhook_reply,
}


def texts(value: Any) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in texts(v)]
    if isinstance(value, list):
        return [s for v in value for s in texts(v)]
    return []


def feishu_markdown(body: dict[str, Any]) -> list[str]:
    return [e["content"] for e in body["card"]["body"]["elements"] if e["tag"] == "markdown"]


def digest_text(kind: str, body: Any) -> str:
    """The human-readable text of a received message, for assertions."""
    if kind == "dingtalk":
        return body["markdown"]["text"]
    if kind == "wecom":
        return body["markdown"]["content"]
    return json.dumps(body, ensure_ascii=False)
