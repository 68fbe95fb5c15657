"""PromQL as Argus reads it: which metrics an expression selects, a cheap syntax check, Prometheus rule files
(writing them, reading their expressions) and promtool's verdict on them.

Argus never evaluates PromQL itself (Prometheus does), so this is not a parser: the tokenizer only has to
find metric names in PromQL that promtool accepts, and must never fail or hang on anything else. promtool
is the judge of syntax: it parses exactly as Prometheus will.

Used by the metric rules (detectors/metric_rules*.py), `argus rules check` (the hand-written health rules
must read only metrics Argus exports) and the dashboards check (argus/dashboards/).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError, MissingBinary, RuleError

# --- which metric names an expression selects -----------------------------------------------------------

# Aggregations, like keywords, are matched whatever their case (`SUM BY (a) (m)` is valid); functions are not.
AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
})
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _LABEL_LIST_KEYWORDS | {"and", "or", "unless", "bool", "offset", "atan2"}
_NUMBER_WORDS = frozenset({"inf", "nan"})
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# A word is a run of letters (any script), digits, '_' and ':' not starting with a digit. Prometheus allows
# only ASCII in a bare name, but cutting `métric` into `m` and `tric` would report names nobody wrote.
_WORD = re.compile(r"[^\W\d][\w:]*|:[\w:]*")
_NAME_MATCHER = re.compile(r"""\s*__name__\s*(?P<op>=~|!=|!~|=)\s*(?P<q>["'`])(?P<value>.*)(?P=q)\s*\Z""", re.S)


def metric_names(expr: str) -> tuple[set[str], list[str]]:
    """The metric names `expr` selects, and notes on selections that cannot be checked (a name regex).

    Function and aggregation names, keywords, the label lists of by/without/on/ignoring/group_*, label
    matchers, strings, comments, durations and numbers are skipped; `{__name__="x"}` selects x. Only PromQL
    that promtool accepts matters: on broken input this never fails, it just finds what it can, in time
    linear in the length of `expr`.
    """
    names: set[str] = set()
    notes: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            newline = expr.find("\n", i)
            i = len(expr) if newline < 0 else newline + 1
        elif c in "\"'`":
            i = _end_of_string(expr, i)
        elif c == "{":
            end = _end_of_group(expr, i, "{", "}")
            for matcher in _top_level_items(expr[i + 1 : end - 1] if expr[end - 1 : end] == "}" else expr[i + 1 :]):
                m = _NAME_MATCHER.match(matcher)
                if m is None:
                    continue
                if m.group("op") == "=":
                    names.add(m.group("value"))
                elif m.group("op") == "=~":
                    notes.append(f"selects metric names by regex (__name__=~{m.group('value')!r}); "
                                 "name each metric so it can be checked")
            i = end
        elif c == "[":
            i = _end_of_group(expr, i, "[", "]")
        elif c.isdigit() or (c == "." and expr[i + 1 : i + 2].isdigit()):
            m = _DURATION.match(expr, i) or _NUMBER.match(expr, i)
            i = m.end() if m else i + 1
        elif m := _WORD.match(expr, i):
            word = m.group()
            i = m.end()
            following, at = _next_significant(expr, i)
            lower = word.lower()
            if lower in _KEYWORDS:
                if lower in _LABEL_LIST_KEYWORDS and following == "(":
                    i = _end_of_group(expr, at, "(", ")")
            elif lower in _NUMBER_WORDS:
                pass
            elif following == "(":
                pass  # a function call or an aggregation: its arguments are read next
            elif lower in AGGREGATIONS and _word_at(expr, at).lower() in ("by", "without"):
                pass  # sum by (x) (...)
            else:
                names.add(word)
        else:
            i += 1
    return names, notes


def _end_of_string(text: str, start: int) -> int:
    """Index after the string literal opening at `start` (or len(text) when it never closes)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


def _end_of_group(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index after the bracket closing the one at `start`, skipping strings (len(text) when unclosed)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "\"'`":
            i = _end_of_string(text, i)
            continue
        if c == open_char:
            depth += 1
        elif c == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _top_level_items(text: str) -> Iterator[str]:
    """`text` split at the commas outside strings: the matchers of a selector."""
    start = i = 0
    while i < len(text):
        if text[i] in "\"'`":
            i = _end_of_string(text, i)
        elif text[i] == ",":
            yield text[start:i]
            start = i = i + 1
        else:
            i += 1
    yield text[start:]


def _next_significant(text: str, i: int) -> tuple[str, int]:
    """The next character that is not space or inside a comment, and its index."""
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
        else:
            return text[i], i
    return "", i


def _word_at(text: str, i: int) -> str:
    m = _WORD.match(text, i)
    return m.group() if m else ""


def bracket_problem(expr: str) -> str | None:
    """What is wrong with the brackets and quotes of `expr` (they must pair up), or None: catches typos
    without promtool."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return f"unmatched '{ch}'"
    if quote:
        return f"unterminated string (missing closing {quote})"
    if stack:
        return f"unclosed '{stack[-1]}'"
    return None


# --- Prometheus rule files ------------------------------------------------------------------------------


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line text as `|` blocks, so PromQL written on several lines reads the same in the rule file."""


def _text_representer(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_LiteralDumper.add_representer(str, _text_representer)


def rule_file_text(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """A Prometheus rule file ({"groups": [...]}) from group name -> its rules, in that order; the same
    groups always give the same bytes."""
    data = {"groups": [{"name": name, "rules": [dict(rule) for rule in rules]} for name, rules in groups.items()]}
    return yaml.dump(data, Dumper=_LiteralDumper, sort_keys=False, width=4096, allow_unicode=True)


def rule_file_metric_names(path: Path) -> dict[str, set[str]]:
    """alert name -> the metric names its expr reads, for a Prometheus rule file; RuleError when it is not one."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RuleError(f"{path} cannot be read as YAML: {exc}", hint="run `promtool check rules` on it") from None
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list):
        raise RuleError(f"{path} is not a Prometheus rule file (no 'groups' list)",
                        hint="see https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/")
    names: dict[str, set[str]] = {}
    for group in groups:
        for rule in (group.get("rules") or []) if isinstance(group, dict) else []:
            if isinstance(rule, dict) and isinstance(rule.get("expr"), str):
                key = str(rule.get("alert") or rule.get("record") or "?")
                names.setdefault(key, set()).update(metric_names(rule["expr"])[0])
    return names


# --- promtool -------------------------------------------------------------------------------------------

# How promtool names a rule it rejects: `group "g", rule 2, "AlertName": <why>`.
_COMPLAINT = re.compile(r'group "(?P<group>[^"]*)", rule (?P<index>\d+), "(?P<rule>[^"]*)": (?P<error>.*)')


@dataclass(frozen=True)
class Complaint:
    """promtool's objection to one rule of a rule file."""

    group: str
    index: int  # the rule's place in its group, counted from 1 as promtool does
    rule: str  # its alert or record name
    error: str


@dataclass(frozen=True)
class PromtoolVerdict:
    returncode: int
    output: str  # stdout and stderr together

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def complaints(self) -> list[Complaint]:
        """The rules promtool rejected, as far as its output names them (empty when it passed)."""
        if self.ok:
            return []
        return [Complaint(m.group("group"), int(m.group("index")), m.group("rule"), m.group("error").strip())
                for m in map(_COMPLAINT.search, self.output.splitlines()) if m]


def find_promtool(promtool: str | None = None) -> str:
    """Prometheus's promtool: on PATH unless a path is given."""
    found = shutil.which(promtool or "promtool")
    if found is None:
        raise MissingBinary(
            promtool or "promtool",
            hint="install Prometheus's tools (Debian: apt-get install prometheus) or pass the promtool path",
        )
    return found


def promtool_check_rules(text: str, *, promtool: str | None = None, lint: bool = True,
                         timeout_s: float = 60.0) -> PromtoolVerdict:
    """`promtool check rules` on a rule file's text (written to a temporary file); `lint=False` adds
    --lint=none. ConfigError when promtool does not finish in time."""
    binary = find_promtool(promtool)
    with tempfile.TemporaryDirectory(prefix="argus-promtool-") as tmp:
        path = Path(tmp) / "rules.yml"
        path.write_text(text, encoding="utf-8")
        argv = [binary, "check", "rules", *([] if lint else ["--lint=none"]), str(path)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"promtool check rules did not finish within {timeout_s:g} s",
                              hint="check that promtool runs: `promtool --version`") from None
    return PromtoolVerdict(proc.returncode, (proc.stdout + proc.stderr).strip())
