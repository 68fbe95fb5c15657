"""Redaction's scanning: patterns compiled into rules (lowered where they can be), one literal gate over all of
them, the spans they mask, merged. rca/redact.py says why it is built this way; Redactor is its only user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.literal_gate import (
    CharCosts,
    LiteralGate,
    literal_prefixes,
    nested_unbounded_repeat,
    parse_pattern,
    sre_constants,
    walk,
)

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

# --- compiling --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedactionRule:
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


def compile_pattern(name: Any, pattern: Any, order: int, *, extra: bool) -> RedactionRule:
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
    return RedactionRule(
        name=name, regex=regex, lowered=lowered, groups=groups, order=order, prefixes=_gate_prefixes(parsed)
    )


def name_and_pattern(item: Any) -> tuple[Any, Any]:
    if isinstance(item, str):
        return "custom", item
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise ConfigError(
        f"extra redaction pattern {item!r} is neither a regex nor a (name, regex) pair",
        hint="pass extra_patterns=[('my_kind', r'...')] or a list of regex strings",
    )


def lower_ascii(text: str) -> str:
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


def build_gate(rules: tuple[RedactionRule, ...]) -> LiteralGate:
    """One pass over the lowered text that finds where any rule's literal prefix starts, so each rule runs only
    there (anchored, `match(text, start)`), never inside its own previous match: exactly what `finditer` would
    find, since a match can only start where one of its prefixes does. `rules[i].order == i`."""
    return LiteralGate([{(prefix, False) for prefix in rule.prefixes} for rule in rules], _COSTS)


def _spans(rule: RedactionRule, match: re.Match[str], found: list[tuple[int, int, int, str]]) -> None:
    if rule.groups:
        for index, kind in rule.groups:
            start, end = match.span(index)
            if end > start:
                found.append((start, end, rule.order, kind))
    elif match.end() > match.start():
        found.append((match.start(), match.end(), rule.order, rule.name))


def find_spans(
    rules: tuple[RedactionRule, ...], gate: LiteralGate, text: str, low: str
) -> list[tuple[int, int, int, str]]:
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


def merge_spans(found: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, str]]:
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
