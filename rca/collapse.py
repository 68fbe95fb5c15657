"""Repeated evidence lines collapse into one, with a count and the range of what changed.

A hang detector files a finding every few seconds, each with "no progress for 21 s", "... 22 s", ...: four lines
that say one thing. Lines from the same source that differ only in their numbers (timestamps included) are one
line here: the first of them (the earliest seen) is kept, with `repeats` (how many) and `varies` (each number that
changed, as its range with the word after it: "21–24 s"). The rule is general: every run of digits is a number,
and timestamps are blanked before comparing. Lines from different sources stay apart: which ranks or nodes said a
thing is evidence too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
                       r"|\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
UNIT = re.compile(r"\s?([A-Za-z%]{1,12})")


class Line(Protocol):
    source: str
    text: str
    why: str


L = TypeVar("L", bound=Line)


def shape(text: str) -> str:
    """The text with timestamps and numbers blanked: two lines of one shape say the same thing."""
    return NUMBER.sub("#", TIMESTAMP.sub("<time>", text))


def numbers_of(text: str) -> list[tuple[str, str]]:
    """Each number of `text` outside timestamps, with the word right after it ("21 s" -> ("21", "s"))."""
    bare = TIMESTAMP.sub("<time>", text)
    out = []
    for m in NUMBER.finditer(bare):
        unit = UNIT.match(bare, m.end())
        out.append((m.group(0), unit.group(1) if unit else ""))
    return out


def groups(lines: Sequence[L]) -> list[list[L]]:
    """`lines` grouped by (source, why, shape), each group in the order of its first line."""
    by_key: dict[tuple[str, str, str], list[L]] = {}
    for line in lines:
        by_key.setdefault((line.source, line.why, shape(line.text)), []).append(line)
    return list(by_key.values())


def varies(texts: Sequence[str]) -> str | None:
    """The numbers that change across `texts` (all of one shape), each as "min–max unit"; None if none does
    (only timestamps differ)."""
    rows = [numbers_of(t) for t in texts]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        return None
    parts = []
    for i, (_, unit) in enumerate(rows[0]):
        values = [r[i][0] for r in rows]
        if len(set(values)) == 1:
            continue
        lo, hi = min(values, key=float), max(values, key=float)
        parts.append(f"{lo}–{hi}" + (f" {unit}" if unit else ""))
    return ", ".join(parts) or None
