"""Log rules as data: load and validate rule files, then match log lines against them.

A rule file is YAML in the node-problem-detector style: a file-level `source` (the log stream the rules
read: job-logs, raylet, gcs, ... or a list of them) and a `rules:` list. Every pattern is compiled at
load, so a bad rule stops Argus at start with the file and line of the rule, never at 3 a.m. on the
first matching line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from core.errors import RuleError
from core.types import Category, Severity

try:  # the regex parser moved in 3.11; the old name still works but warns there
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse

# A log line longer than this is cut before matching, so one 100 MB line costs what a 64 KB one does.
MAX_LINE_CHARS = 64 * 1024

RULE_FILE_SUFFIXES = (".yaml", ".yml")
ANY_SOURCE = "*"

_FILE_KEYS = {"source", "rules"}
_REQUIRED_RULE_KEYS = ("reason", "category", "type", "pattern")
_OPTIONAL_RULE_KEYS = ("severity", "confidence", "action", "priority", "description", "source")
_RULE_KEYS = set(_REQUIRED_RULE_KEYS) | set(_OPTIONAL_RULE_KEYS)
_REASON_RE = re.compile(r"[A-Z][A-Za-z0-9]*")
DEFAULT_PRIORITY = 50


class RuleType(str, Enum):
    """What a match means: permanent ends the job and opens an incident; temporary is an event only."""

    PERMANENT = "permanent"
    TEMPORARY = "temporary"


@dataclass(frozen=True)
class LogRule:
    reason: str
    category: Category
    type: RuleType
    pattern: str
    regex: re.Pattern[str] = field(compare=False, repr=False)
    sources: tuple[str, ...] = (ANY_SOURCE,)
    severity: Severity = Severity.CRITICAL
    confidence: float = 0.9
    action: str | None = None
    priority: int = DEFAULT_PRIORITY
    description: str | None = None
    file: Path | None = None
    line: int | None = None

    @property
    def permanent(self) -> bool:
        return self.type is RuleType.PERMANENT

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<memory>"

    def reads(self, source: str) -> bool:
        return ANY_SOURCE in self.sources or source in self.sources


@dataclass(frozen=True)
class RuleMatch:
    """One rule that matched one line. `text` is the line as matched (cut to MAX_LINE_CHARS)."""

    rule: LogRule
    line_no: int
    text: str
    source: str
    truncated: bool = False


def clip_line(text: str) -> tuple[str, bool]:
    """The part of a line that is matched, and whether anything was cut."""
    if len(text) > MAX_LINE_CHARS:
        return text[:MAX_LINE_CHARS], True
    return text, False


class RuleSet:
    """An ordered, validated set of log rules; matching is one prefilter search per line."""

    def __init__(self, rules: Sequence[LogRule] = ()) -> None:
        seen: dict[str, LogRule] = {}
        for rule in rules:
            if rule.reason in seen:
                first = seen[rule.reason]
                raise RuleError(
                    f"{rule.location}: duplicate rule reason '{rule.reason}' (first defined at {first.location})",
                    hint="every reason must be unique across all rule files; rename one of them",
                )
            seen[rule.reason] = rule
        self.rules: tuple[LogRule, ...] = tuple(rules)
        self._prefilter = _combine(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[LogRule]:
        return iter(self.rules)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> RuleSet:
        rules: list[LogRule] = []
        for path in paths:
            rules.extend(load_rule_file(Path(path)))
        return cls(rules)

    def for_source(self, source: str) -> RuleSet:
        """The rules that read the named log stream (rules for any stream included)."""
        return RuleSet([r for r in self.rules if r.reads(source)])

    def get(self, reason: str) -> LogRule | None:
        return next((r for r in self.rules if r.reason == reason), None)

    def match(self, text: str) -> list[LogRule]:
        """Every rule whose pattern is found in the line, in rule order."""
        text, _ = clip_line(text)
        if not self.rules or (self._prefilter is not None and self._prefilter.search(text) is None):
            return []
        return [r for r in self.rules if r.regex.search(text)]

    def scan(self, lines: Iterable[str], source: str, start_line: int = 1) -> Iterator[RuleMatch]:
        """Match every line; `source` names where the lines came from (a path, a stream) in the matches."""
        for line_no, raw in enumerate(lines, start=start_line):
            text, truncated = clip_line(raw.rstrip("\r\n"))
            for rule in self.match(text):
                yield RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)


def builtin_rule_dir() -> Path:
    return Path(__file__).resolve().parent / "rules"


def rule_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise RuleError(
            f"rules folder {directory} does not exist or is not a folder",
            hint="pass an existing folder holding *.yaml rule files",
        )
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in RULE_FILE_SUFFIXES)


def load_rules(extra_dirs: Iterable[Path] = ()) -> RuleSet:
    """The built-in rules plus every *.yaml / *.yml in the extra folders, validated together."""
    paths = rule_files(builtin_rule_dir())
    for directory in extra_dirs:
        paths.extend(rule_files(Path(directory)))
    ruleset = RuleSet.load(paths)
    logger.trace("loaded {} log rules from {} files", len(ruleset), len(paths))
    return ruleset


# --- loading one file ------------------------------------------------------------------------------


def load_rule_file(path: Path) -> list[LogRule]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read rule file: {exc}", hint="check the path and permissions") from exc
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise RuleError(
            f"{path}:{line}: not valid YAML: {exc.problem or exc}", hint="fix the YAML syntax at that line"
        ) from exc
    except yaml.YAMLError as exc:
        raise RuleError(f"{path}:1: not valid YAML: {exc}", hint="fix the YAML syntax") from exc

    if node is None:
        raise RuleError(
            f"{path}:1: rule file is empty", hint="write `source: <stream>` and a `rules:` list, or delete the file"
        )
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        raise RuleError(
            f"{path}:{_line(node)}: a rule file must be a mapping with `source` and `rules`",
            hint="see detectors/rules/node_lost.yaml for the shape",
        )
    keys = _key_lines(path, node)
    unknown = sorted(set(data) - _FILE_KEYS, key=str)
    if unknown:
        raise RuleError(
            f"{path}:{keys[unknown[0]]}: unknown key '{unknown[0]}' at file level",
            hint=f"allowed: {', '.join(sorted(_FILE_KEYS))}",
        )
    for key in ("source", "rules"):
        if key not in data:
            raise RuleError(f"{path}:{_line(node)}: missing `{key}` at file level", hint="add it")
    sources = _sources(path, keys["source"], data["source"])
    rules_node = _value_node(node, "rules")
    if not isinstance(data["rules"], list) or not isinstance(rules_node, yaml.SequenceNode):
        raise RuleError(f"{path}:{keys['rules']}: `rules` must be a list of rules", hint="start each rule with `- `")
    if not data["rules"]:
        raise RuleError(f"{path}:{keys['rules']}: `rules` is empty", hint="add rules or delete the file")
    return [
        _build_rule(path, item_node, item, sources)
        for item_node, item in zip(rules_node.value, data["rules"], strict=True)
    ]


def _build_rule(path: Path, node: yaml.Node, item: Any, file_sources: tuple[str, ...]) -> LogRule:
    at = _line(node)
    if not isinstance(item, dict) or not isinstance(node, yaml.MappingNode):
        raise RuleError(f"{path}:{at}: a rule must be a mapping", hint="give it reason, category, type and pattern")
    keys = _key_lines(path, node)

    def fail(key: str | None, what: str, hint: str) -> RuleError:
        line = keys.get(key, at) if key else at
        name = item.get("reason")
        label = f" (rule {name})" if isinstance(name, str) else ""
        return RuleError(f"{path}:{line}{label}: {what}", hint=hint)

    unknown = sorted((k for k in item if k not in _RULE_KEYS), key=str)
    if unknown:
        raise fail(unknown[0], f"unknown key '{unknown[0]}'", f"allowed: {', '.join(sorted(_RULE_KEYS))}")
    for key in _REQUIRED_RULE_KEYS:
        if key not in item or item[key] in (None, ""):
            raise fail(None, f"missing required field '{key}'", f"every rule needs {', '.join(_REQUIRED_RULE_KEYS)}")

    reason = item["reason"]
    if not isinstance(reason, str) or not _REASON_RE.fullmatch(reason):
        raise fail("reason", f"reason {reason!r} is not a CamelCase name", "e.g. NodeMarkedDead")
    category = _enum(Category, item["category"])
    if category is None:
        allowed = ", ".join(c.value for c in Category)
        raise fail("category", f"unknown category {item['category']!r}", f"allowed: {allowed}")
    rtype = _enum(RuleType, item["type"])
    if rtype is None:
        raise fail("type", f"unknown type {item['type']!r}", "allowed: permanent, temporary")
    pattern = item["pattern"]
    if not isinstance(pattern, str):
        raise fail("pattern", "pattern must be a string", "quote it with single quotes")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise fail("pattern", f"bad regex: {exc}", "fix the pattern; it is a Python `re` expression") from exc
    if regex.search("") is not None:
        raise fail("pattern", "pattern matches the empty string, so it would match every line", "make it specific")
    danger = _nested_repeat(pattern)
    if danger:
        raise fail(
            "pattern",
            f"pattern nests unbounded repeats ({danger}), which can take exponential time on hostile lines",
            "bound the inner repeat, e.g. [^ ]{1,64}, or drop the outer one",
        )

    severity_raw = item.get("severity")
    severity = Severity.CRITICAL if rtype is RuleType.PERMANENT else Severity.WARNING
    if severity_raw is not None:
        parsed = _enum(Severity, severity_raw)
        if parsed is None:
            allowed = ", ".join(s.value for s in Severity)
            raise fail("severity", f"unknown severity {severity_raw!r}", f"allowed: {allowed}")
        severity = parsed
    confidence = item.get("confidence", 0.9 if rtype is RuleType.PERMANENT else 0.5)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise fail("confidence", f"confidence {confidence!r} is not a number from 0 to 1", "e.g. 0.9")
    priority = item.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail("priority", f"priority {priority!r} is not an integer", "higher wins; e.g. 90 for a lost node")
    action = item.get("action")
    if action is not None and not isinstance(action, str):
        raise fail("action", "action must be text", "write the recommended action as one sentence")
    description = item.get("description")
    if description is not None and not isinstance(description, str):
        raise fail("description", "description must be text", "write one sentence")
    sources = _sources(path, keys.get("source", at), item["source"]) if "source" in item else file_sources
    return LogRule(
        reason=reason,
        category=category,
        type=rtype,
        pattern=pattern,
        regex=regex,
        sources=sources,
        severity=severity,
        confidence=float(confidence),
        action=action.strip() if action else None,
        priority=priority,
        description=description.strip() if description else None,
        file=path,
        line=at,
    )


def _sources(path: Path, line: int, value: Any) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise RuleError(
            f"{path}:{line}: `source` must be a stream name or a list of them",
            hint="e.g. job-logs, raylet, gcs, or '*' for any stream",
        )
    return tuple(v.strip() for v in values)


def _enum(kind: type[Enum], value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return None


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _key_lines(path: Path, node: yaml.MappingNode) -> dict[Any, int]:
    """Line of every key; PyYAML keeps the last of duplicate keys silently, so they are refused here."""
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
        if key in lines:
            raise RuleError(
                f"{path}:{_line(key_node)}: key '{key}' appears twice (first at line {lines[key]})",
                hint="remove one of them",
            )
        lines[key] = _line(key_node)
    return lines


def _value_node(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


_REPEATS = {_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT}


def _nested_repeat(pattern: str) -> str | None:
    """Name the first unbounded repeat that holds another unbounded repeat, the classic `(a+)+` trap.

    Python's `re` backtracks, so such a rule could hang the scanner on one crafted line. Alternations
    under a repeat (`(a|a)*`) can also blow up; rule authors keep those out by review.
    """
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - re.compile already accepted it; this check is best effort
        return None

    def unbounded(op: Any, av: Any) -> bool:
        return op in _REPEATS and av[1] == _sre_constants.MAXREPEAT

    def walk(items: Any, inside: bool) -> str | None:
        for op, av in items:
            if unbounded(op, av):
                if inside:
                    return "a repeat inside a repeat"
                found = walk(av[2], True)
                if found:
                    return found
                continue
            for sub in _children(op, av):
                found = walk(sub, inside)
                if found:
                    return found
        return None

    return walk(parsed, False)


def _children(op: Any, av: Any) -> list[Any]:
    if op in _REPEATS:
        return [av[2]]
    if op is _sre_constants.SUBPATTERN:
        return [av[-1]]
    if op is _sre_constants.BRANCH:
        return list(av[1])
    if op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is _sre_constants.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    if hasattr(_sre_constants, "ATOMIC_GROUP") and op is _sre_constants.ATOMIC_GROUP:
        return [av]
    return []


def _combine(rules: Sequence[LogRule]) -> re.Pattern[str] | None:
    """One alternation of every pattern, so a line that matches nothing costs one search, not one per rule.

    Patterns with backreferences or inline global flags cannot be safely joined; then every rule is tried.
    """
    if len(rules) < 2:
        return None
    if any(re.search(r"\\[1-9]|\(\?P=|\(\?[aiLmsux]+\)", r.pattern) for r in rules):
        return None
    try:
        return re.compile("|".join(f"(?:{r.pattern})" for r in rules))
    except re.error:
        return None
