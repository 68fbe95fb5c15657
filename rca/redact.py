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

Three modules: the patterns and key names (rca/redact_patterns.py, data), compiling and scanning them
(rca/redact_scan.py, on core.literal_gate), and the Redactor here (text, pseudonyms, nested data).
"""

from __future__ import annotations

import functools
import ipaddress
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import date, time, timedelta
from decimal import Decimal
from pathlib import PurePath
from typing import Any, Protocol, TypeGuard
from uuid import UUID

from core.errors import ConfigError, InputError
from core.literal_gate import LiteralGate
from rca.redact_patterns import (
    DEFAULT_PATTERNS,
    HEADER_KEY,
    HEX_OR_COLON,
    IPV4,
    IPV4_DOT,
    IPV6,
    IPV6_SEEDS,
    LOOKS_SECRET,
    SECRET_KEY,
    TOKEN_KEY,
    USER_PATH,
)
from rca.redact_scan import (
    RedactionRule,
    build_gate,
    compile_pattern,
    find_spans,
    lower_ascii,
    merge_spans,
    name_and_pattern,
)

__all__ = ["DEFAULT_PATTERNS", "MAX_DEPTH", "Redactor"]

# redact_data descends this deep; deeper structures are masked whole (no evidence bundle nests this far).
MAX_DEPTH = 64

_PASSTHROUGH = (bool, int, float, complex, type(None), Decimal, date, time, timedelta, UUID)


class _NamedTuple(Protocol):
    """What redaction needs of a named tuple: it is rebuilt, of its own class, from redacted items."""

    _fields: tuple[str, ...]

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Any: ...


def _is_named_tuple(obj: object) -> TypeGuard[_NamedTuple]:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


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
        self._rules, self._gate = _compiled(tuple(name_and_pattern(item) for item in extra_patterns))
        self._mask_ips = mask_ips
        self._mask_users = mask_users
        self._user_rule = self._compile_users(list(users), mask_users)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._pseudonyms: dict[tuple[str, str], str] = {}
        self._next = Counter[str]()

    @staticmethod
    def _compile_users(users: list[str], mask_users: bool) -> RedactionRule | None:
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
        return compile_pattern("user", "(?i)" + "|".join(branches), -1, extra=False)

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
        low = lower_ascii(text)
        secrets = merge_spans(find_spans(self._rules, self._gate, text, low))
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
            for dot in IPV4_DOT.finditer(text):
                start, floor = dot.start() - 1, max(0, dot.start() - 3)
                while start > floor and "0" <= text[start - 1] <= "9":
                    start -= 1
                match = IPV4.match(text, start)
                if match is None:
                    continue
                candidate = match.group()
                if _ipv4_ok(candidate) and not (candidate.startswith("127.") or candidate == "0.0.0.0"):
                    found.append((match.start(), match.end(), candidate, "ip"))
            starts = set()
            for seed in IPV6_SEEDS.finditer(low):
                start, floor = seed.start(), max(0, seed.start() - 39)
                while start > floor and low[start - 1] in HEX_OR_COLON:
                    start -= 1
                starts.add(start)
            for start in sorted(starts):
                match = IPV6.match(low, start)
                address = _ipv6(match.group()) if match else None
                if match and address and not (address.is_loopback or address.is_unspecified):
                    found.append((match.start(), match.end(), str(address), "ip"))
        if self._mask_users:
            for match in USER_PATH.finditer(low):
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
                if _is_named_tuple(obj):
                    result = type(obj)._make(items)
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
        header = HEADER_KEY.search(name)
        if header:
            return header.group()
        if SECRET_KEY.search(name):
            if name in ("pwd", "oldpwd") and isinstance(value, str) and value.startswith(("/", "~")):
                return None
            return "secret"
        if TOKEN_KEY.search(name) and isinstance(value, str) and LOOKS_SECRET.fullmatch(value.strip()):
            return "token"
        return None

    def _masked(self, kind: str) -> str:
        with self._lock:
            self._counts[kind] += 1
        return f"[REDACTED:{kind}]"


@functools.lru_cache(maxsize=16)
def _compiled(extra: tuple[tuple[str, str], ...]) -> tuple[tuple[RedactionRule, ...], LiteralGate]:
    """The rules and their literal gate, compiled once per set of extra patterns: every report has a Redactor of its
    own (stable pseudonyms within it) and a storm writes thousands of reports. Both are read-only once built."""
    rules = [compile_pattern(name, pattern, order, extra=False)
             for order, (name, pattern) in enumerate(DEFAULT_PATTERNS)]
    for name, pattern in extra:
        rules.append(compile_pattern(name, pattern, len(rules), extra=True))
    frozen = tuple(rules)
    return frozen, build_gate(frozen)
