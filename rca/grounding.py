"""The LLM's prose says only what the evidence shows: a sentence stating a number, duration, rank, node/IP, time or
file that the evidence does not contain is left out, and the report says which and why.

Conservative: a claim stands if it is anywhere in the evidence, the bundle (findings, job spec, metrics, node
facts) or the incident's and findings' own attributes. Numbers compare as numbers ("2.00" is "2"); a duration also
compares in seconds with the durations the evidence states ("10 minutes" is "600000 milliseconds") and with the
spans between the times it shows. Numbers inside timestamps are not durations: a time in the prose ("11:59:58")
must appear as a time. A spelled-out number is checked as its digits would be where it counts or measures something:
followed by a unit or a countable noun ("ten minutes", "two ranks", "thirty seconds", "twenty-five steps"); elsewhere
("one of the ranks", "at one point") it is prose, not a claim. The evidence's own spelled-out numbers count as numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations

IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
FILE = re.compile(r"(?:[\w.-]*/)+[\w.-]+|\b[\w-]+\.(?:log|out|err|py|yaml|yml|json|txt|sh|pt|ckpt|safetensors)\b")
DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
CLOCK = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?\b")
NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)(?:\s?([A-Za-z]+))?")
SECONDS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")

# Spelled-out numbers (a small table: one to twenty, the tens, hundred) and what makes one a claim.
NUMBER_WORDS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
                "seventeen eighteen nineteen twenty").split()
WORD_VALUES = {w: i for i, w in enumerate(NUMBER_WORDS, start=1)}
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
WORD_VALUES |= {w: 10 * i for i, w in enumerate(_TENS.split("|"), start=2)}
_SMALL = "|".join(sorted(NUMBER_WORDS, key=len, reverse=True))
_SPELLED = (rf"(?:(?P<tens>{_TENS})[- ](?P<unit>one|two|three|four|five|six|seven|eight|nine)\b"
            rf"|(?:(?P<times>a|one|two|three|four|five|six|seven|eight|nine)[- ])?(?P<hundred>hundred)"
            rf"|(?P<word>{_SMALL}|{_TENS}))")
COUNTED = (r"ranks?|nodes?|gpus?|steps?|workers?|process(?:es)?|hosts?|machines?|replicas?|devices?|epochs?|"
           r"iterations?|attempts?|retr(?:y|ies)|restarts?|checkpoints?|jobs?|actors?|times|errors?|timeouts?")
_DURATION_WORDS = r"milliseconds?|seconds?|minutes?|hours?"
_BETWEEN = r"(?:(?:other|more|additional|remaining|further|consecutive|separate|different|full|whole)\s+)?"
SPELLED_CLAIM = re.compile(rf"(?<![\w-]){_SPELLED}(?:\s+|-){_BETWEEN}(?P<noun>{_DURATION_WORDS}|{COUNTED})\b", re.I)
SPELLED = re.compile(rf"(?<![\w-]){_SPELLED}(?:(?:\s+|-)(?P<noun>{_DURATION_WORDS}))?(?![\w-])", re.I)


@dataclass(frozen=True)
class Dropped:
    """One sentence left out of the LLM's prose: which field, the sentence, and the claims no evidence shows."""

    field: str
    sentence: str
    claims: tuple[str, ...]

    def note(self) -> str:
        shown = ", ".join(f"'{c}'" for c in self.claims)
        return f"it stated {shown}, which no evidence shows"


class Evidence:
    """What the evidence states, read once from all its texts."""

    def __init__(self, texts: Iterable[str], times: Iterable[datetime] = ()) -> None:
        self.text = "\n".join(texts)
        self.lower = self.text.lower()
        self.clocks = {c for m in DATETIME.finditer(self.text) for c in _clocks(m.group(0))}
        self.clocks |= {c for m in CLOCK.finditer(self.text) for c in _clocks(m.group(0))}
        bare = CLOCK.sub(" ", DATE.sub(" ", DATETIME.sub(" ", IP.sub(" ", self.text))))
        self.numbers: set[float] = set()
        self.durations: set[float] = set()
        for m in NUMBER.finditer(bare):
            value = float(m.group(1))
            self.numbers.add(value)
            unit = SECONDS.get((m.group(2) or "").lower())
            if unit is not None:
                self.durations.add(value * unit)
        for m in SPELLED.finditer(bare):
            value = spelled_value(m)
            self.numbers.add(value)
            unit = SECONDS.get((m.group("noun") or "").lower())
            if unit is not None:
                self.durations.add(value * unit)
        for a, b in combinations(sorted(set(times))[:40], 2):
            self.durations.add(abs((b - a).total_seconds()))

    def unsupported(self, sentence: str) -> list[str]:
        """The claims of `sentence` the evidence does not state."""
        out: list[str] = []
        rest = sentence
        for pattern, check in ((IP, self._has_text), (FILE, self._has_text), (DATETIME, self._has_clock),
                               (DATE, self._has_text), (CLOCK, self._has_clock)):
            for m in pattern.finditer(rest):
                if not check(m.group(0)):
                    out.append(m.group(0))
            rest = pattern.sub(" ", rest)
        for m in NUMBER.finditer(rest):
            value, word = float(m.group(1)), m.group(2) or ""
            unit = SECONDS.get(word.lower())
            if value in self.numbers:
                continue
            if unit is not None and self._has_duration(value * unit, unit):
                continue
            out.append(m.group(0).strip() if unit is not None else m.group(1))
        for m in SPELLED_CLAIM.finditer(rest):
            value = spelled_value(m)
            unit = SECONDS.get(m.group("noun").lower())
            if value in self.numbers or (unit is not None and self._has_duration(value * unit, unit)):
                continue
            out.append(m.group(0).strip())
        return out

    def _has_text(self, text: str) -> bool:
        return text.lower().rstrip(".") in self.lower

    def _has_clock(self, text: str) -> bool:
        shown = _clocks(text)
        return bool(shown) and shown[-1] in self.clocks  # its most precise form: "11:59:30" is not "11:59:58"

    def _has_duration(self, seconds: float, unit: float) -> bool:
        # "about 3 minutes" stands for any span that rounds to 3 minutes
        return any(abs(d - seconds) < max(unit / 2, 0.5) for d in self.durations)


def ground(field: str, prose: str, evidence: Evidence) -> tuple[str, list[Dropped]]:
    """`prose` without its sentences that state what the evidence does not, and those sentences."""
    kept: list[str] = []
    dropped: list[Dropped] = []
    for sentence in SENTENCE_END.split(prose.strip()):
        claims = evidence.unsupported(sentence)
        if claims:
            dropped.append(Dropped(field, sentence, tuple(dict.fromkeys(claims))))
        else:
            kept.append(sentence)
    return " ".join(kept), dropped


def told(dropped: list[Dropped]) -> list[str]:
    """The report's words for what was left out, one line per field."""
    out = []
    names = {"summary": "summary", "root_cause": "root-cause analysis"}
    for field in dict.fromkeys(d.field for d in dropped):
        mine = [d for d in dropped if d.field == field]
        n = len(mine)
        reasons = "; ".join(d.note() for d in mine)
        out.append(f"{n} sentence{'s' if n != 1 else ''} of the LLM's {names.get(field, field)} "
                   f"{'was' if n == 1 else 'were'} left out: {reasons}")
    return out


def spelled_value(m: re.Match[str]) -> float:
    """The value of a SPELLED or SPELLED_CLAIM match: "twenty-five" is 25, "two hundred" 200, "a hundred" 100."""
    if m.group("tens"):
        return float(WORD_VALUES[m.group("tens").lower()] + WORD_VALUES[m.group("unit").lower()])
    if m.group("hundred"):
        times = (m.group("times") or "a").lower()
        return 100.0 * (1 if times == "a" else WORD_VALUES[times])
    return float(WORD_VALUES[m.group("word").lower()])


def _clocks(text: str) -> list[str]:
    """A time as "hh:mm:ss" and "hh:mm" (without leading zero differences), to compare times as times."""
    m = re.search(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", text)
    if m is None:
        return []
    hm = f"{int(m.group(1))}:{m.group(2)}"
    return [hm, f"{hm}:{m.group(3)}"] if m.group(3) else [hm]
