"""Redaction: secrets are masked before evidence leaves the process (to an LLM gateway, a report, an IM message).

What is masked is data: `DEFAULT_PATTERNS` is a list of (name, regex). The part of a match that is masked is
each named group that took part in the match (the group's name, less a `_<n>` suffix, names the kind in the
replacement: `[REDACTED:aws_access_key]`); a pattern without named groups masks its whole match. Groups whose
name starts with `_` only help the match (the user part of a URL is kept).

How a text is redacted, and why it is fast (about 40 MB/s on a training log, see bench/redact.py):

- Spans are collected on the original text, merged (overlapping spans become one, named after the pattern
  listed first) and the output is built once: no pattern sees another's placeholder, a value found by two
  patterns counts once.
- Case-insensitive patterns (`(?i)` and written in lower case) run over a lowered ASCII copy of the text
  (non-ASCII characters become `?`, so offsets are the same): `re` skips ahead in C only over literal
  characters, never under IGNORECASE (the key=value pattern reads about 7 MB/s as written, 100+ lowered).
- Every pattern starts with a literal (`sk-`, `-----BEGIN `, `://`, `password`...). One gate pass finds where
  any of those prefixes starts, stopping only at each prefix's rarest character; each pattern then runs
  anchored at its starts. One pass per pattern becomes one pass in all (`_gate`, a core.literal_gate.LiteralGate).
- No default pattern nests an unbounded repeat inside another, and every stretch a pattern may backtrack over
  is bounded, so hostile input (a 1 MB line of `a=`, endless base64, unclosed quotes) costs linear time.

Evidence stays: a key named like `token` is a secret only when its value looks like one (16+ characters mixing
letters and digits), so `max_tokens=512`, `num_tokens`, `token_ids`, `tokenizer`, `pad_token: <|endoftext|>`
stay; values that say a secret is missing (`None`, `null`, `''`, `***`, `$HF_TOKEN`) stay too, since "the key
was None" is often the root cause. GPU UUIDs, Ray node ids, hex addresses and paths match no pattern.

`mask_ips` and `mask_users` replace addresses and user names with pseudonyms that are stable within one
Redactor (`ip-1`, `user-2`), so "the rank on ip-2 failed" can still be correlated. Loopback and unspecified
addresses are kept: they say nothing about the cluster.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, time, timedelta
from decimal import Decimal
from pathlib import PurePath
from typing import Any
from uuid import UUID

from core.errors import ConfigError, InputError
from core.literal_gate import (
    CharCosts,
    LiteralGate,
    literal_prefixes,
    nested_unbounded_repeat,
    parse_pattern,
    sre_constants,
    walk,
)

__all__ = ["DEFAULT_PATTERNS", "MAX_DEPTH", "Redactor"]

# redact_data descends this deep; deeper structures are masked whole (no evidence bundle nests this far).
MAX_DEPTH = 64

# --- pattern fragments ------------------------------------------------------------------------------------
# Fragments of the case-insensitive patterns are lower case: they run over the lowered copy of the text.

# After a key: an optional closing quote (backslash-escaped in JSON inside a JSON string), then `:` or `=`.
_KEY_END = r"""\\?["']?[ \t]*[:=][ \t]*"""
# Values that say a secret is missing or already hidden; they are evidence, not secrets.
_NOT_A_VALUE = r"""(?!\\?["']?(?:none|null|nil|undefined|true|false|\*+|x{3,}|<[\w -]{0,40}>|\$\{?\w{1,64}\}?)?\\?["']?(?:[\s,;)\]}&]|$))"""  # noqa: E501
# A value that is code, not data (`api_key = os.environ["X"]`, `token=get_token()` in a traceback).
_NOT_CODE = r"(?![\w.]+[(\[])"


def _value(kind: str, n: int) -> str:
    """A secret value after a key: double-, single- or escaped-quoted (bounded), or a bare word. Quoted values
    are bounded so a value without its closing quote cannot make a match scan the rest of a huge line."""
    return (
        _NOT_A_VALUE + "(?:"
        rf'"(?P<{kind}_{n}>[^"\\\n]{{0,4096}}(?:\\.[^"\\\n]{{0,4096}}){{0,64}})"'
        rf"|'(?P<{kind}_{n + 1}>[^'\\\n]{{0,4096}}(?:\\.[^'\\\n]{{0,4096}}){{0,64}})'"
        rf'|\\"(?P<{kind}_{n + 2}>[^"\\\n]{{1,4096}})\\"'
        rf"""|(?![{{\[]){_NOT_CODE}\\?["']?(?P<{kind}_{n + 3}>[^\s"'&]{{0,8192}}[^\s"'&,;.)\]}}>\\])"""
        ")"
    )


# A value under a key that is only sometimes secret (token, auth): 16+ characters mixing letters and digits.
_TOKEN_VALUE = r"""(?=[a-z0-9_.~+/-]{0,8192}[0-9])(?=[0-9_.~+/-]{0,8192}[a-z])[a-z0-9_.~+/-]{16,8192}=*"""

# Keys whose value is always a secret. Each word heads its own branch: a pattern whose branches all start with a
# literal lets `re` skip ahead in C (one shared group in front of them reads four times slower).
_SECRET_WORDS = (
    "passw(?:or)?d",
    "passphrase",
    "secret",
    "api[ _-]?key",
    "access[ _-]?key",
    "private[ _-]?key",
    "auth[ _-]?key",
    "credential",
    # PWD and OLDPWD hold the shell's working directory: a path there is evidence.
    rf"pwd(?![\w.-]{{0,64}}{_KEY_END}[\"']?[/~])",
)
_KEY_REST = r"[\w.-]{0,64}"  # the rest of the key after the word (AWS_SECRET_ACCESS_KEY, db_password_file)


def _key_value_pattern() -> str:
    branches = [rf"{word}{_KEY_REST}{_KEY_END}{_value('secret', 4 * i)}" for i, word in enumerate(_SECRET_WORDS)]
    # `pass` as the whole last word of a key (DB_PASS=, pass:), not pass_rate / pass@1 / bypass.
    branches.append(rf"pass(?<![a-z]pass){_KEY_END}{_value('secret', 4 * len(_SECRET_WORDS))}")
    # A key ending in token or auth (HF_TOKEN, access_token, x-auth-token, oauth) holds a secret only when the
    # value looks like one: max_tokens=512, pad_token: <|endoftext|>, tokenizer=... stay.
    # (The lookahead names what may follow the word, so the gate skips tokens, tokenizer, token_ids...)
    branches.append(rf"""token(?=[\\"' \t:=]){_KEY_END}\\?["']?(?P<token>{_TOKEN_VALUE})""")
    branches.append(rf"""auth(?=[\\"' \t:=]){_KEY_END}\\?["']?(?P<token_1>{_TOKEN_VALUE})""")
    return "(?i)" + "|".join(branches)


def _flag_pattern() -> str:
    """`--password hunter2`, `--api-key sk-...`, `--hf-token hf_...`: a flag whose value follows a space."""
    words = "|".join((*_SECRET_WORDS[:-1], "pwd", r"pass(?![\w.-])"))
    return (
        r"(?i)--(?<![\w-]--)(?=[a-z])"
        rf"(?:[\w.-]{{0,64}}?(?:{words}){_KEY_REST}[ \t]+(?![-\s]){_value('secret', 0)}"
        rf"""|[\w.-]{{0,64}}?(?:token|auth)[ \t]+\\?["']?(?P<token>{_TOKEN_VALUE}))"""
    )


_PEM_LABEL = r"(?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY(?: BLOCK)?-----"

# (name, regex). Order matters only for naming: where spans of several patterns overlap, the merged span is
# named after the pattern listed first, so provider shapes come before the generic key=value rule.
DEFAULT_PATTERNS: list[tuple[str, str]] = [
    # A whole PEM block, also with JSON's escaped newlines; a block cut before its END line is masked to the end
    # of its base64 run.
    (
        "private_key",
        rf"-----BEGIN {_PEM_LABEL}"
        rf"(?:[^-]{{0,32768}}(?:-(?!----)[^-]{{0,32768}}){{0,16}}-----END {_PEM_LABEL}"
        r"|[A-Za-z0-9+/=\s:,\\]{0,65536})",
    ),
    # Provider token shapes. Each starts with its literal prefix, then checks (looking back) that the prefix
    # starts a word: `task-`, `disk-`, `hf_hub_download`, `AKIAI` inside a longer word do not match.
    ("anthropic_api_key", r"sk-ant-(?<![\w-]sk-ant-)[A-Za-z0-9_-]{20,}"),
    ("openai_api_key", r"sk-(?<![\w-]sk-)(?=[A-Za-z_-]{0,256}[0-9])[A-Za-z0-9_-]{20,}"),
    ("huggingface_token", r"hf_(?<![\w]hf_)[A-Za-z0-9]{30,}"),
    ("github_token", r"g(?:h[pousr]_(?<![\w]gh._)[A-Za-z0-9]{36,}|ithub_pat_(?<![\w]github_pat_)[A-Za-z0-9_]{22,})"),
    ("gitlab_token", r"glpat-(?<![\w-]glpat-)[A-Za-z0-9_-]{20,}"),
    ("slack_token", r"x(?:ox[abcdeoprs]-(?<![\w-]xox.-)[A-Za-z0-9-]{10,}|app-(?<![\w-]xapp-)[0-9]-[A-Za-z0-9-]{10,})"),
    ("aws_access_key", r"A[KS]IA(?<![A-Za-z0-9]A[KS]IA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("google_api_key", r"AIza(?<![\w-]AIza)[A-Za-z0-9_-]{35,}"),
    # Alibaba Cloud AccessKey ids and Tencent Cloud SecretIds (what OSS / COS checkpoint uploads log)
    ("aliyun_access_key", r"LTAI(?<![A-Za-z0-9]LTAI)[A-Za-z0-9]{12,20}(?![A-Za-z0-9])"),
    ("tencent_secret_id", r"AKID(?<![A-Za-z0-9]AKID)[A-Za-z0-9]{32,36}(?![A-Za-z0-9])"),
    ("jwt", r"eyJ(?<![\w-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
    # Argus API tokens: `argus_<8 hex>` is the public id (kept, it names the token); the rest is the secret.
    ("argus_token", r"argus_(?<![\w]argus_)[0-9a-f]{8}_(?P<argus_token>[A-Za-z0-9_-]{43})"),
    (
        "wandb_api_key",
        r"wandb(?: login(?:[ \t]+--?[a-z-]{1,32}(?:=\S{1,256})?){0,4}[ \t]+(?P<wandb_api_key>[A-Za-z0-9_-]{20,})"
        r"""|\.login\([^()]{0,256}?key[ \t]*=[ \t]*["'](?P<wandb_api_key_1>[^"'\s]+)["'])""",
    ),
    # IM webhooks: the URL's secret part (what the 2025 issue threads tell people to paste alone).
    ("feishu_webhook", r"open-apis/bot/v2/hook/(?P<feishu_webhook>[A-Za-z0-9-]{8,})"),
    ("dingtalk_webhook", r"robot/send(?:BySession)?\?(?:access_token|session)=(?P<dingtalk_webhook>[A-Za-z0-9_-]+)"),
    ("wecom_webhook", r"webhook/send\?key=(?P<wecom_webhook>[A-Za-z0-9_-]+)"),
    ("slack_webhook", r"hooks\.slack\.com/services/(?P<slack_webhook>[A-Za-z0-9_/-]+)"),
    (
        "discord_webhook",
        r"/api/webhooks/(?:(?<=discord\.com/api/webhooks/)|(?<=discordapp\.com/api/webhooks/))"
        r"(?P<discord_webhook>[0-9]+/[A-Za-z0-9_-]+)",
    ),
    # scheme://user:password@host keeps scheme, user and host; scheme://<token>@host masks the token. The
    # password runs to the last @ before the host (an unencoded @ in a password is common).
    (
        "url_password",
        r"""://(?:(?P<_user>[^\s/:@"'<>]{0,256}):(?!\*+@|\$\{?\w{1,64}\}?@)(?P<url_password>[^\s/"'<>]{1,1024})"""
        r"""@(?![^\s/"'<>]{0,1024}@)|(?P<url_password_1>[A-Za-z0-9_-]{20,256})@)""",
    ),
    # Authorization headers keep their scheme (Bearer, Basic...) and mask the rest of the value.
    (
        "authorization",
        rf"""(?i)authorization{_KEY_END}\\?["']?"""
        r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|api-key|key|sso-key|aws4-hmac-sha256)[ \t]+)?"
        r"""(?!(?:none|null|undefined|\*+|bearer|basic|token|digest)?\\?["']?(?:[\s,;)\]}]|$))"""
        r"""(?P<authorization>[^\r\n"'\\]{0,8192}[^\s"',;\\])""",
    ),
    (
        "bearer_token",
        r"(?i)bearer(?<![a-z0-9]bearer)[ \t]+(?P<bearer_token>(?=[a-z0-9._~+/-]{0,8192}[0-9])[a-z0-9._~+/-]{8,}=*)",
    ),
    (
        "cookie",
        r"""(?i)cookie\\?["']?[ \t]*:[ \t]*\\?["']?(?!(?:none|null)?\\?["']?(?:[\s,;)\]}]|$))"""
        r"""(?P<cookie>[^\r\n"'\\]{0,8192}[^\s"',;\\])""",
    ),
    ("secret", _key_value_pattern()),
    ("secret_flag", _flag_pattern()),
    # .netrc (what `wandb login` writes): machine <host> login <user> password <secret>
    (
        "netrc_password",
        r"(?i)machine[ \t]+\S{1,256}\s{1,64}login[ \t]+\S{1,256}\s{1,64}password[ \t]+(?P<password>\S+)",
    ),
    ("sshpass", r"sshpass[ \t]+-p[ \t]*(?P<password>\S+)"),
    # curl -u user:password (not `docker -u 1000:1000`, whose second half is a group id)
    (
        "basic_auth",
        r"""(?:-u(?<!\S-u)|--user(?<!\S--user))[ \t]+(?P<_user>[^\s:'"]{1,256}):(?![0-9]+(?:\s|$))"""
        r"""(?P<password>[^\s'"]+)""",
    ),
    # Signed URLs and webhook bodies (DingTalk sign=, S3 X-Amz-Signature=, Feishu "sign": "...")
    (
        "signature",
        r"""(?i)\?(?:sign|sig|signature|x-amz-signature)=(?P<signature>[^\s&"'#]+)"""
        r"""|&(?:sign|sig|signature|x-amz-signature)=(?P<signature_1>[^\s&"'#]+)"""
        r'|"sign"[ \t]*:[ \t]*"(?P<signature_2>[^"\\\n]{1,4096})"',
    ),
]

# --- keys of structured data (redact_data) ---------------------------------------------------------------

_SECRET_KEY = re.compile(
    r"passw(?:or)?d|passphrase|secret|api[ _-]?key|access[ _-]?key|private[ _-]?key|auth[ _-]?key|credential"
    r"|(?<![a-z])pass$|pwd"
)
_HEADER_KEY = re.compile(r"authorization|cookie")
_TOKEN_KEY = re.compile(r"(?:token|auth)$")
_LOOKS_SECRET = re.compile(r"(?=[A-Za-z0-9_.~+/-]*[0-9])(?=[0-9_.~+/-]*[A-Za-z])[A-Za-z0-9_.~+/-]{16,}=*")
_PASSTHROUGH = (bool, int, float, complex, type(None), Decimal, date, time, timedelta, UUID)

# --- pseudonyms -------------------------------------------------------------------------------------------

_IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?!\w|\.[0-9])")
# The first dot of something shaped like an address: a scan that stops at dots reads four times faster than
# one that stops at every digit.
_IPV4_DOT = re.compile(r"\.(?<=[0-9]\.)(?=[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![0-9]))")
# Runs over the lowered text. Only runs of hex and colons that start a word, hold `::` or eight groups, two
# groups at least (not `a::`, not C++'s `c10d::`), and end a word; ipaddress decides.
_IPV6 = re.compile(
    r"[0-9a-f:](?<![\w:.%][0-9a-f:])(?=[0-9a-f:]{0,38}::|(?:[0-9a-f]{1,4}:){7}[0-9a-f])"
    r"(?=[0-9a-f:]{0,36}[0-9a-f]:{1,2}[0-9a-f])[0-9a-f:]{2,39}"
    r"(?:%[0-9a-z_.-]{1,16})?(?![\w:%]|\.\w)"
)
# Where an IPv6 address may be: every `::`, and the first colon of eight groups. Scans that stop only there read
# ten times faster than one that stops at every hex digit; the address's start is found by looking back.
_IPV6_SEEDS = re.compile(r"::|:(?<=[0-9a-f]:)(?=[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){6}(?![0-9a-f:]))")
_HEX_OR_COLON = frozenset("0123456789abcdef:")
# /home/<user>/, /home/users/<user>/, /Users/<user>/ and the shared store's users/<user>/ (lowered text)
_USER_PATH = re.compile(r"/(?:home/(?:users/)?|users/)(?P<user>[a-z0-9_][a-z0-9._-]{0,63})(?=[/\s\"':;,)\]}]|$)")

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

# --- compiling --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    name: str
    regex: re.Pattern[str]
    lowered: bool  # runs over the lowered ASCII copy of the text
    groups: tuple[tuple[int, str], ...]  # (group index, kind) to mask; empty: the whole match
    order: int
    prefixes: tuple[str, ...]  # every match starts with one of these (lowered); empty: none is known


def _lowercase_only(parsed: Any) -> bool:
    """Whether a pattern matches the same on the lowered ASCII copy as it does case-insensitively on the text:
    no upper-case or non-ASCII literal, no range that reaches either, no group that turns case back on."""

    def fits(code: int) -> bool:
        return code < 128 and not 65 <= code <= 90

    for op, av in walk(parsed):
        if op in (sre_constants.LITERAL, sre_constants.NOT_LITERAL) and not fits(av):
            return False
        if op is sre_constants.SUBPATTERN and av[2] & re.IGNORECASE:
            return False
        if op is sre_constants.IN:
            for item_op, item in av:
                if item_op in (sre_constants.LITERAL, sre_constants.NOT_LITERAL) and not fits(item):
                    return False
                if item_op is sre_constants.RANGE and (item[1] >= 128 or (item[0] <= 90 and item[1] >= 65)):
                    return False
    return True


def _gate_prefixes(parsed: Any) -> tuple[str, ...]:
    found = {prefix.lower() for prefix in literal_prefixes(parsed)}
    if "" in found or not all(prefix.isascii() for prefix in found):
        return ()
    return tuple(sorted(found))


def _compile(name: Any, pattern: Any, order: int, *, extra: bool) -> _Rule:
    where = "extra redaction pattern" if extra else "redaction pattern"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where} name {name!r} is not a valid kind name",
            hint="use lower-case letters, digits and _ (it is shown as [REDACTED:<name>])",
        )
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{where} '{name}' is {pattern!r}, not a regular expression", hint="give a non-empty str")
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise ConfigError(
            f"{where} '{name}' does not compile: {err.msg} at position {err.pos} of {pattern!r}",
            hint="fix the regular expression (Python `re` syntax)",
        ) from None
    if extra:
        if regex.fullmatch(""):
            raise ConfigError(
                f"{where} '{name}' matches the empty string: {pattern!r}",
                hint="a pattern must match at least one character, or every position would be masked",
            )
        if nested_unbounded_repeat(pattern):
            raise ConfigError(
                f"{where} '{name}' nests an unbounded repeat inside another ({pattern!r}), which can take "
                "exponential time on hostile input",
                hint="bound the outer repeat ({0,8}) or make the inner one possessive (a++)",
            )
    parsed = parse_pattern(pattern)
    lowered = False
    if pattern.startswith("(?i)"):
        body = pattern[len("(?i)") :]
        try:
            lowercase = _lowercase_only(parse_pattern(body))
        except re.error:  # the body alone can be invalid (a flag that must come first): run it as written
            lowercase = False
        if lowercase:
            regex, lowered = re.compile(body), True
    groups = tuple(
        (index, re.sub(r"_\d+$", "", group))
        for group, index in sorted(regex.groupindex.items(), key=lambda item: item[1])
        if not group.startswith("_")
    )
    return _Rule(name=name, regex=regex, lowered=lowered, groups=groups, order=order, prefixes=_gate_prefixes(parsed))


def _name_and_pattern(item: Any) -> tuple[Any, Any]:
    if isinstance(item, str):
        return "custom", item
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise ConfigError(
        f"extra redaction pattern {item!r} is neither a regex nor a (name, regex) pair",
        hint="pass extra_patterns=[('my_kind', r'...')] or a list of regex strings",
    )


def _lower_ascii(text: str) -> str:
    # One code point in, one out: offsets in the copy are offsets in the text (str.lower can grow a string).
    return text.encode("ascii", "replace").decode("ascii").lower()


# How often a character appears in training logs, per mille (measured on lowered verl / vLLM / Ray / NCCL logs).
# The gate stops at every occurrence of an anchor character, so each prefix is anchored on a rare one.
_FREQUENCY = {
    **dict.fromkeys("0123456789", 15),
    **dict(
        zip(
            "abcdefghijklmnopqrstuvwxyz",
            (37, 10, 35, 22, 58, 16, 15, 10, 40, 1, 10, 24, 14, 38, 40, 26, 1, 49, 30, 38, 17, 5, 7, 3, 9, 1),
            strict=True,
        )
    ),
    **{" ": 150, ".": 20, ":": 23, "/": 16, "_": 14, "-": 12, "=": 6, '"': 3, "?": 3, "'": 1, "&": 1, "@": 1},
}
_COSTS = CharCosts.from_table(_FREQUENCY, default=5)


def _gate(rules: tuple[_Rule, ...]) -> LiteralGate:
    """One pass over the lowered text that finds where any rule's literal prefix starts, so each rule runs only
    there (anchored, `match(text, start)`), never inside its own previous match: exactly what `finditer` would
    find, since a match can only start where one of its prefixes does. `rules[i].order == i`."""
    return LiteralGate([{(prefix, False) for prefix in rule.prefixes} for rule in rules], _COSTS)


def _spans(rule: _Rule, match: re.Match[str], found: list[tuple[int, int, int, str]]) -> None:
    if rule.groups:
        for index, kind in rule.groups:
            start, end = match.span(index)
            if end > start:
                found.append((start, end, rule.order, kind))
    elif match.end() > match.start():
        found.append((match.start(), match.end(), rule.order, rule.name))


def _find(rules: tuple[_Rule, ...], gate: LiteralGate, text: str, low: str) -> list[tuple[int, int, int, str]]:
    """(start, end, order, kind) of every non-empty part to mask. `rules[i].order == i`."""
    found: list[tuple[int, int, int, str]] = []
    resume: dict[int, int] = {}
    for start, order in gate.starts(low):
        if start < resume.get(order, 0):
            continue  # inside this rule's previous match, where finditer would not look either
        rule = rules[order]
        match = rule.regex.match(low if rule.lowered else text, start)
        if match is not None:
            _spans(rule, match, found)
            resume[order] = max(match.end(), start + 1)
    for rule in rules:  # rules without a known literal prefix (some extra patterns) read the whole text
        if not rule.prefixes:
            for match in rule.regex.finditer(low if rule.lowered else text):
                _spans(rule, match, found)
    return found


def _merge(found: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, str]]:
    found.sort()
    merged: list[tuple[int, int, int, str]] = []
    for start, end, order, kind in found:
        if merged and start < merged[-1][1]:
            m_start, m_end, m_order, m_kind = merged[-1]
            if order < m_order:
                m_order, m_kind = order, kind
            merged[-1] = (m_start, max(m_end, end), m_order, m_kind)
        else:
            merged.append((start, end, order, kind))
    return merged


def _ipv6(candidate: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(candidate)
    except ValueError:
        return None


def _ipv4_ok(candidate: str) -> bool:
    parts = candidate.split(".")
    return all(part == "0" or (part[0] != "0" and int(part) <= 255) for part in parts)


class Redactor:
    """Masks secrets in text and nested data; optionally replaces IPs and user names with stable pseudonyms.

    One Redactor per evidence bundle (or per report) keeps pseudonyms consistent across its calls; it may be
    shared between threads.
    """

    def __init__(
        self,
        extra_patterns: Iterable[tuple[str, str] | str] = (),
        *,
        mask_ips: bool = False,
        mask_users: bool = False,
        users: Iterable[str] = (),
    ) -> None:
        rules = [_compile(name, pattern, order, extra=False) for order, (name, pattern) in enumerate(DEFAULT_PATTERNS)]
        for item in extra_patterns:
            name, pattern = _name_and_pattern(item)
            rules.append(_compile(name, pattern, len(rules), extra=True))
        self._rules = tuple(rules)
        self._gate = _gate(self._rules)
        self._mask_ips = mask_ips
        self._mask_users = mask_users
        self._user_rule = self._compile_users(list(users), mask_users)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._pseudonyms: dict[tuple[str, str], str] = {}
        self._next = Counter[str]()

    @staticmethod
    def _compile_users(users: list[str], mask_users: bool) -> _Rule | None:
        if users and not mask_users:
            raise ConfigError(
                "user names were given to the Redactor but mask_users is off",
                hint="pass mask_users=True to replace them, or leave users empty",
            )
        for user in users:
            if not isinstance(user, str) or len(user.strip()) < 2:
                raise ConfigError(
                    f"user name {user!r} cannot be masked",
                    hint="give user names of 2 or more characters (a 1-letter name would mask every such word)",
                )
        if not users:
            return None
        names = sorted({user.strip().lower() for user in users}, key=len, reverse=True)
        # Each name starts its own branch, then checks (looking back) that it starts a word.
        branches = [rf"{re.escape(name)}(?<![\w-]{re.escape(name)})(?![\w-])" for name in names]
        return _compile("user", "(?i)" + "|".join(branches), -1, extra=False)

    # --- counts ---

    @property
    def count(self) -> int:
        """Values masked or replaced so far by this Redactor (for "N values redacted")."""
        with self._lock:
            return sum(self._counts.values())

    @property
    def counts(self) -> dict[str, int]:
        """The same, by kind (`aws_access_key`, `secret`, `ip`, `user`...)."""
        with self._lock:
            return dict(self._counts)

    # --- text ---

    def redact(self, text: str) -> str:
        """`text` with every secret masked (and IPs / users replaced when asked); the same object if nothing was."""
        if not isinstance(text, str):
            raise InputError(
                f"Redactor.redact takes a str, not {type(text).__name__}",
                hint="use redact_data for nested data, or decode bytes first",
            )
        if not text:
            return text
        low = _lower_ascii(text)
        secrets = _merge(_find(self._rules, self._gate, text, low))
        replacements = [(start, end, f"[REDACTED:{kind}]", kind) for start, end, _, kind in secrets]
        if self._mask_ips or self._mask_users:
            replacements = self._add_pseudonyms(text, low, replacements)
        if not replacements:
            return text
        pieces, last = [], 0
        with self._lock:
            for start, end, replacement, kind in replacements:
                pieces.append(text[last:start])
                pieces.append(replacement)
                last = end
                self._counts[kind] += 1
        pieces.append(text[last:])
        return "".join(pieces)

    def _add_pseudonyms(
        self, text: str, low: str, secrets: list[tuple[int, int, str, str]]
    ) -> list[tuple[int, int, str, str]]:
        found: list[tuple[int, int, str, str]] = []  # (start, end, key, kind)
        if self._mask_ips:
            for dot in _IPV4_DOT.finditer(text):
                start, floor = dot.start() - 1, max(0, dot.start() - 3)
                while start > floor and "0" <= text[start - 1] <= "9":
                    start -= 1
                match = _IPV4.match(text, start)
                if match is None:
                    continue
                candidate = match.group()
                if _ipv4_ok(candidate) and not (candidate.startswith("127.") or candidate == "0.0.0.0"):
                    found.append((match.start(), match.end(), candidate, "ip"))
            starts = set()
            for seed in _IPV6_SEEDS.finditer(low):
                start, floor = seed.start(), max(0, seed.start() - 39)
                while start > floor and low[start - 1] in _HEX_OR_COLON:
                    start -= 1
                starts.add(start)
            for start in sorted(starts):
                match = _IPV6.match(low, start)
                address = _ipv6(match.group()) if match else None
                if match and address and not (address.is_loopback or address.is_unspecified):
                    found.append((match.start(), match.end(), str(address), "ip"))
        if self._mask_users:
            for match in _USER_PATH.finditer(low):
                found.append((match.start("user"), match.end("user"), match.group("user"), "user"))
            if self._user_rule is not None:
                for match in self._user_rule.regex.finditer(low if self._user_rule.lowered else text):
                    found.append((match.start(), match.end(), match.group().lower(), "user"))
        if not found:
            return secrets
        found.sort()
        taken = [(start, end) for start, end, _, _ in secrets]
        spans = list(secrets)
        edges = iter(sorted(taken))
        edge = next(edges, None)
        last_end = -1
        with self._lock:
            for start, end, key, kind in found:
                while edge is not None and edge[1] <= start:
                    edge = next(edges, None)
                if start < last_end or (edge is not None and edge[0] < end):
                    continue  # inside a secret, or overlapping a pseudonym already placed
                spans.append((start, end, self._pseudonym(kind, key), kind))
                last_end = end
        spans.sort()
        return spans

    def _pseudonym(self, kind: str, key: str) -> str:
        # called with the lock held
        name = self._pseudonyms.get((kind, key))
        if name is None:
            self._next[kind] += 1
            name = self._pseudonyms[(kind, key)] = f"{kind}-{self._next[kind]}"
        return name

    # --- data ---

    def redact_data(self, obj: Any) -> Any:
        """A copy of nested dicts, lists, tuples, sets and strings with secrets masked. A value under a key that
        names a secret (password, api_key, credentials, Authorization...) is masked whole, whatever its type; under
        a key ending in token or auth only when it is a string that looks like a secret. Numbers, None, dates and
        UUIDs pass through; other objects become their redacted str(). Deeper than MAX_DEPTH, or inside a cycle,
        a value is masked whole."""
        return self._data(obj, 0, {}, set())

    def _data(self, obj: Any, depth: int, memo: dict[int, Any], path: set[int]) -> Any:
        if isinstance(obj, str):
            redacted = self.redact(obj)
            return obj if redacted == obj else redacted
        if isinstance(obj, _PASSTHROUGH):
            return obj
        if isinstance(obj, (bytes, bytearray)):
            text = bytes(obj).decode("utf-8", "surrogateescape")
            redacted = self.redact(text)
            return obj if redacted == text else type(obj)(redacted.encode("utf-8", "surrogateescape"))
        if isinstance(obj, PurePath):
            redacted = self.redact(str(obj))
            return obj if redacted == str(obj) else redacted
        if not isinstance(obj, (Mapping, list, tuple, set, frozenset)):
            return self._data(str(obj), depth, memo, path)
        key = id(obj)
        if key in memo:  # shared (not cyclic) sub-structures are redacted once: no exponential blow-up
            return memo[key]
        if depth >= MAX_DEPTH:
            return self._masked("too_deep")
        if key in path:
            return self._masked("cycle")
        path.add(key)
        try:
            if isinstance(obj, Mapping):
                result: Any = self._mapping(obj, depth, memo, path)
            else:
                items = self._items(obj, depth, memo, path)
                if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                    result = type(obj)._make(items)  # a named tuple
                elif isinstance(obj, (tuple, set, frozenset)):
                    result = type(obj)(items)
                else:
                    result = items
        finally:
            path.discard(key)
        memo[key] = result
        return result

    def _items(self, obj: Iterable[Any], depth: int, memo: dict[int, Any], path: set[int]) -> list[Any]:
        """Items of a list, tuple or set; in an argv list (`["--api-key", "sk-..."]`) the value after a flag that
        names a secret is masked like a value under such a key."""
        items: list[Any] = []
        flag: str | None = None
        for item in obj:
            kind = None
            if flag is not None and isinstance(item, str) and not item.startswith("-"):
                kind = self._secret_kind(flag, item)
            items.append(self._masked(kind) if kind else self._data(item, depth + 1, memo, path))
            is_flag = isinstance(item, str) and item.startswith("-") and not any(c in item for c in "= \t")
            flag = item if is_flag else None
        return items

    def _mapping(self, obj: Mapping[Any, Any], depth: int, memo: dict[int, Any], path: set[int]) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key, value in obj.items():
            kind = self._secret_kind(key, value)
            new_value = self._masked(kind) if kind else self._data(value, depth + 1, memo, path)
            new_key = self._data(key, depth + 1, memo, path) if isinstance(key, str) else key
            while new_key in result:  # two keys redacted alike must not overwrite each other
                new_key = f"{new_key}#"
            result[new_key] = new_value
        return result

    @staticmethod
    def _secret_kind(key: Any, value: Any) -> str | None:
        if not isinstance(key, str) or value is None or isinstance(value, bool):
            return None  # a missing or disabled secret is evidence
        if isinstance(value, str) and not value:
            return None
        name = key.strip().strip("-").lower()
        header = _HEADER_KEY.search(name)
        if header:
            return header.group()
        if _SECRET_KEY.search(name):
            if name in ("pwd", "oldpwd") and isinstance(value, str) and value.startswith(("/", "~")):
                return None
            return "secret"
        if _TOKEN_KEY.search(name) and isinstance(value, str) and _LOOKS_SECRET.fullmatch(value.strip()):
            return "token"
        return None

    def _masked(self, kind: str) -> str:
        with self._lock:
            self._counts[kind] += 1
        return f"[REDACTED:{kind}]"
