"""Metric rules: one PromQL definition, evaluated by Argus and exported to Prometheus as alerting rules.

A rule file is YAML in `detectors/rules/metrics/` (the parent folder holds log rules):

    group: argus-gpu-hardware          # the Prometheus rule group (default: argus-<file stem>)
    rules:
      - reason: GpuXidDrainAndReset    # the alert name
        category: gpu_hardware
        severity: critical
        expr: DCGM_FI_DEV_XID_ERRORS == 79
        for: 1m                        # active this long before it fires (default 0s)
        xid: true                      # each series' value is an Xid code: name it in the finding
        summary: 'GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported Xid {{ $value }}'
        action: Drain the node and reset the GPU.

Everything is checked at load, with the file and line of the offending rule; PromQL itself is checked by
`promtool_check` (promtool parses it exactly as Prometheus will). Summaries are Prometheus templates,
restricted to `{{ $labels.<name> }}`, `{{ $value }}` and `{{ $value | humanizePercentage }}` so that the
text Argus writes and the text Alertmanager sends are the same.

`MetricRuleDetector` applies `for` the way Prometheus does: a (rule, subject) must be active in every
evaluation for the whole duration before it fires, and starts over when it disappears.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from core.errors import MissingBinary, RuleError
from core.types import Category, Evidence, Finding, Severity, Signal, SignalKind, fingerprint_of, utcnow
from detectors import xid as xid_catalog

RULE_FILE_SUFFIXES = (".yaml", ".yml")
EXPORT_FILE_NAME = "argus-detections.rules.yml"

# Signal attributes written by collectors.metric_rules.MetricRuleCollector.
RULE_ATTR = "rule"  # the reason of the rule whose query produced the signal
EVALUATED_ATTR = "rule_evaluated"  # marks the one signal per evaluated rule that says "I ran"

_FILE_KEYS = {"group", "rules"}
_REQUIRED_RULE_KEYS = ("reason", "category", "severity", "expr", "summary")
_OPTIONAL_RULE_KEYS = ("for", "action", "description", "confidence", "labels", "xid")
_RULE_KEYS = set(_REQUIRED_RULE_KEYS) | set(_OPTIONAL_RULE_KEYS)
_RESERVED_LABELS = {"severity", "category", "alertname"}
_REASON_RE = re.compile(r"[A-Z][A-Za-z0-9]*")
_GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_DURATION_RE = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_DURATION_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_TEMPLATE_RE = re.compile(r"\{\{(.*?)\}\}", re.S)
_PLACEHOLDER_RE = re.compile(
    r"\s*(?:\$labels\.(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)|\$value(?P<pct>\s*\|\s*humanizePercentage)?)\s*"
)
_EVIDENCE_PER_FINDING = 8


@dataclass(frozen=True)
class MetricRule:
    reason: str
    category: Category
    severity: Severity
    expr: str
    summary: str
    for_text: str = "0s"
    for_s: float = 0.0
    action: str | None = None
    description: str | None = None
    confidence: float = 0.9
    labels: Mapping[str, str] = field(default_factory=dict)
    xid: bool = False
    group: str = "argus"
    file: Path | None = None
    line: int | None = None

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<memory>"

    def render_summary(self, labels: Mapping[str, str], value: float) -> str:
        return render_template(self.summary, labels, value)


class MetricRuleSet:
    """An ordered, validated set of metric rules; reasons are unique."""

    def __init__(self, rules: Sequence[MetricRule] = ()) -> None:
        seen: dict[str, MetricRule] = {}
        for rule in rules:
            if rule.reason in seen:
                raise RuleError(
                    f"{rule.location}: duplicate metric rule reason '{rule.reason}' "
                    f"(first defined at {seen[rule.reason].location})",
                    hint="every reason is an alert name and must be unique; rename one of them",
                )
            seen[rule.reason] = rule
        self.rules: tuple[MetricRule, ...] = tuple(rules)
        self._by_reason = seen

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[MetricRule]:
        return iter(self.rules)

    def get(self, reason: str) -> MetricRule | None:
        return self._by_reason.get(reason)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> MetricRuleSet:
        rules: list[MetricRule] = []
        for path in paths:
            rules.extend(load_metric_rule_file(Path(path)))
        return cls(rules)


def builtin_metric_rule_dir() -> Path:
    return Path(__file__).resolve().parent / "rules" / "metrics"


def metric_rule_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise RuleError(
            f"metric rules folder {directory} does not exist or is not a folder",
            hint="pass an existing folder holding *.yaml metric rule files",
        )
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in RULE_FILE_SUFFIXES)


def load_metric_rules(extra_dirs: Iterable[Path] = ()) -> MetricRuleSet:
    """The built-in metric rules plus every *.yaml / *.yml in the extra folders, validated together."""
    paths = metric_rule_files(builtin_metric_rule_dir())
    for directory in extra_dirs:
        paths.extend(metric_rule_files(Path(directory)))
    ruleset = MetricRuleSet.load(paths)
    logger.trace("loaded {} metric rules from {} files", len(ruleset), len(paths))
    return ruleset


def parse_duration(text: str) -> float | None:
    """Seconds in a Prometheus duration ("90s", "1h30m", "0s"), or None if it is not one."""
    m = _DURATION_RE.fullmatch(text)
    if not text or m is None:
        return None
    return float(sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS, strict=True) if g))


# --- templates -------------------------------------------------------------------------------------


def template_problem(template: str) -> str | None:
    """Why a summary template cannot be rendered the same by Argus and Prometheus, or None if it can."""
    for m in _TEMPLATE_RE.finditer(template):
        if _PLACEHOLDER_RE.fullmatch(m.group(1)) is None:
            return f"unsupported placeholder {m.group(0)!r}"
    rest = _TEMPLATE_RE.sub("", template)
    if "{{" in rest or "}}" in rest:
        return "unbalanced {{ or }}"
    return None


def render_template(template: str, labels: Mapping[str, str], value: float) -> str:
    """The template with its placeholders filled the way Prometheus's alert templates fill them."""

    def fill(m: re.Match[str]) -> str:
        p = _PLACEHOLDER_RE.fullmatch(m.group(1))
        if p is None:  # refused at load; kept literal for rules built in code
            return m.group(0)
        if p.group("label"):
            return str(labels.get(p.group("label"), ""))
        return _go_percent(value) if p.group("pct") else go_float(value)

    return _TEMPLATE_RE.sub(fill, template)


def go_float(value: float) -> str:
    """A float as Go's fmt %v prints it: shortest digits, exponent form below 1e-4 and from 1e6 up."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    exp = math.floor(math.log10(abs(value)))
    if -4 <= exp < 6:  # repr is also positional here, with the same shortest digits
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    for digits in range(17):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            break
    mantissa, _, exponent = text.partition("e")
    sign, num = exponent[0], exponent[1:].lstrip("0")
    return f"{mantissa}e{sign}{num.rjust(2, '0')}"


def _go_percent(value: float) -> str:
    # Prometheus: fmt.Sprintf("%.4g%%", v*100); Python's %g agrees for finite values.
    if math.isnan(value) or math.isinf(value):
        return go_float(value * 100) + "%"
    return f"{value * 100:.4g}%"


# --- loading one file ------------------------------------------------------------------------------


def load_metric_rule_file(path: Path) -> list[MetricRule]:
    node, data = _read_yaml(path)
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        raise RuleError(
            f"{path}:{_line(node)}: a metric rule file must be a mapping with `rules` (and optional `group`)",
            hint="see detectors/rules/metrics/gpu_hardware.yaml for the shape",
        )
    keys = _key_lines(path, node)
    unknown = sorted(set(data) - _FILE_KEYS, key=str)
    if unknown:
        hint = "allowed: group, rules"
        if unknown[0] in ("source", "pattern"):
            hint += "; log rules (source, pattern) belong in detectors/rules/, not detectors/rules/metrics/"
        raise RuleError(f"{path}:{keys[unknown[0]]}: unknown key '{unknown[0]}' at file level", hint=hint)
    if "rules" not in data:
        raise RuleError(f"{path}:{_line(node)}: missing `rules` at file level", hint="add a `rules:` list")
    group = data.get("group", f"argus-{path.stem.replace('_', '-')}")
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise RuleError(
            f"{path}:{keys.get('group', 1)}: group {group!r} is not a valid rule group name",
            hint="use letters, digits, '-', '_' and '.', e.g. argus-gpu-hardware",
        )
    rules_node = _value_node(node, "rules")
    if not isinstance(data["rules"], list) or not isinstance(rules_node, yaml.SequenceNode):
        raise RuleError(f"{path}:{keys['rules']}: `rules` must be a list of rules", hint="start each rule with `- `")
    if not data["rules"]:
        raise RuleError(f"{path}:{keys['rules']}: `rules` is empty", hint="add rules or delete the file")
    return [
        _build_rule(path, item_node, item, group)
        for item_node, item in zip(rules_node.value, data["rules"], strict=True)
    ]


def _read_yaml(path: Path) -> tuple[yaml.Node, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read metric rule file: {exc}", hint="check the path and permissions") from exc
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
        raise RuleError(f"{path}:1: metric rule file is empty", hint="write a `rules:` list, or delete the file")
    return node, data


def _build_rule(path: Path, node: yaml.Node, item: Any, group: str) -> MetricRule:
    at = _line(node)
    if not isinstance(item, dict) or not isinstance(node, yaml.MappingNode):
        raise RuleError(
            f"{path}:{at}: a metric rule must be a mapping",
            hint=f"give it {', '.join(_REQUIRED_RULE_KEYS)}",
        )
    keys = _key_lines(path, node)

    def fail(key: str | None, what: str, hint: str) -> RuleError:
        line = keys.get(key, at) if key else at
        name = item.get("reason")
        label = f" (rule {name})" if isinstance(name, str) else ""
        return RuleError(f"{path}:{line}{label}: {what}", hint=hint)

    unknown = sorted((k for k in item if k not in _RULE_KEYS), key=str)
    if unknown:
        hint = f"allowed: {', '.join(sorted(_RULE_KEYS))}"
        if unknown[0] in ("pattern", "type", "source"):
            hint += "; this looks like a log rule, which belongs in detectors/rules/"
        raise fail(unknown[0], f"unknown key '{unknown[0]}'", hint)
    for key in _REQUIRED_RULE_KEYS:
        if key not in item or item[key] in (None, ""):
            needs = ", ".join(_REQUIRED_RULE_KEYS)
            raise fail(None, f"missing required field '{key}'", f"every metric rule needs {needs}")

    reason = item["reason"]
    if not isinstance(reason, str) or not _REASON_RE.fullmatch(reason):
        raise fail("reason", f"reason {reason!r} is not a CamelCase name", "e.g. GpuXidDrainAndReset")
    category = _enum(Category, item["category"])
    if category is None:
        allowed = ", ".join(c.value for c in Category)
        raise fail("category", f"unknown category {item['category']!r}", f"allowed: {allowed}")
    severity = _enum(Severity, item["severity"])
    if severity is None:
        allowed = ", ".join(s.value for s in Severity)
        raise fail("severity", f"unknown severity {item['severity']!r}", f"allowed: {allowed}")
    expr = item["expr"]
    if not isinstance(expr, str) or not expr.strip():
        raise fail("expr", "expr must be a PromQL expression (text)", "quote it, or use `expr: |` for several lines")
    problem = _expr_problem(expr)
    if problem:
        raise fail("expr", f"expr is not valid PromQL: {problem}", "fix the expression")
    for_raw = item.get("for", "0s")
    for_s = parse_duration(for_raw) if isinstance(for_raw, str) else None
    if for_s is None:
        raise fail("for", f"`for` {for_raw!r} is not a Prometheus duration", "write it like 30s, 2m, 1h30m or 0s")
    summary = item["summary"]
    if not isinstance(summary, str):
        raise fail("summary", "summary must be text",
                   "write one sentence; {{ $labels.X }} and {{ $value }} are filled in")
    bad = template_problem(summary)
    if bad:
        raise fail(
            "summary",
            f"summary template: {bad}",
            "use only {{ $labels.<name> }}, {{ $value }} and {{ $value | humanizePercentage }}",
        )
    confidence = item.get("confidence", 0.9)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise fail("confidence", f"confidence {confidence!r} is not a number from 0 to 1", "e.g. 0.9")
    for key in ("action", "description"):
        value = item.get(key)
        if value is not None and not isinstance(value, str):
            raise fail(key, f"{key} must be text", "write it as one or two sentences")
    labels = item.get("labels") or {}
    if not isinstance(labels, dict):
        raise fail("labels", "labels must be a mapping of name: value", "e.g. labels: {team: ops}")
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_RE.fullmatch(name) or name.startswith("__"):
            raise fail("labels", f"label name {name!r} is not a valid Prometheus label name", "e.g. team, runbook")
        if name in _RESERVED_LABELS:
            raise fail("labels", f"label '{name}' is set by Argus from the rule",
                       f"drop it; {name} comes from the rule")
        if not isinstance(value, str):
            raise fail("labels", f"label {name} must have a text value, not {value!r}", "quote the value")
    xid_flag = item.get("xid", False)
    if not isinstance(xid_flag, bool):
        raise fail("xid", f"xid must be true or false, not {xid_flag!r}", "write `xid: true` on Xid rules")
    action, description = item.get("action"), item.get("description")
    return MetricRule(
        reason=reason,
        category=category,
        severity=severity,
        expr=expr.strip(),
        summary=summary.strip(),
        for_text=for_raw,
        for_s=for_s,
        action=" ".join(action.split()) if action else None,
        description=" ".join(description.split()) if description else None,
        confidence=float(confidence),
        labels={str(k): str(v) for k, v in labels.items()},
        xid=xid_flag,
        group=group,
        file=path,
        line=at,
    )


def _expr_problem(expr: str) -> str | None:
    """Cheap checks that catch typos without promtool: brackets and quotes must pair up."""
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


def _enum(kind: type[Enum], value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return None


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _key_lines(path: Path, node: yaml.MappingNode) -> dict[Any, int]:
    """Line of every key; PyYAML silently keeps the last of duplicate keys, so they are refused here."""
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


# --- export to Prometheus --------------------------------------------------------------------------

_EXPORT_HEADER = (
    "# Generated by `argus rules export` from detectors/rules/metrics/*.yaml: edit those, not this file.\n"
    "# Argus evaluates the same rules itself; CI checks that this file matches a fresh export.\n"
)


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line text as `|` blocks, so the exported PromQL reads like the source."""


def _text_representer(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_LiteralDumper.add_representer(str, _text_representer)


def prometheus_groups(rules: Iterable[MetricRule]) -> dict[str, Any]:
    """The rules as a Prometheus rule file ({"groups": [...]}), groups in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rule in rules:
        alert: dict[str, Any] = {"alert": rule.reason, "expr": rule.expr}
        if rule.for_s > 0:
            alert["for"] = rule.for_text
        alert["labels"] = {"severity": rule.severity.value, "category": rule.category.value, **rule.labels}
        annotations = {"summary": rule.summary}
        if rule.action:
            annotations["action"] = rule.action
        if rule.description:
            annotations["description"] = rule.description
        alert["annotations"] = annotations
        groups.setdefault(rule.group, []).append(alert)
    return {"groups": [{"name": name, "rules": items} for name, items in groups.items()]}


def export_prometheus_rules(rules: Iterable[MetricRule]) -> str:
    """The Prometheus rule file text; the same rules always give the same bytes."""
    body = yaml.dump(
        prometheus_groups(rules), Dumper=_LiteralDumper, sort_keys=False, width=4096, allow_unicode=True
    )
    return _EXPORT_HEADER + body


def write_export(rules: Iterable[MetricRule], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / EXPORT_FILE_NAME
    text = export_prometheus_rules(rules)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def find_promtool(promtool: str | None = None) -> str:
    found = shutil.which(promtool or "promtool")
    if found is None:
        raise MissingBinary(
            promtool or "promtool",
            hint="install Prometheus's tools (Debian: apt-get install prometheus) or pass the promtool path",
        )
    return found


_PROMTOOL_RULE_RE = re.compile(r'group "(?P<group>[^"]*)", rule (?P<index>\d+), "(?P<alert>[^"]*)": (?P<error>.*)')


def promtool_check(rules: MetricRuleSet | Sequence[MetricRule], *, promtool: str | None = None,
                   timeout_s: float = 60.0) -> None:
    """Check every expr and template with `promtool check rules` on a temporary export.

    A rule Prometheus would refuse is a RuleError naming the rule's file and line and promtool's reason.
    """
    rules = list(rules)
    binary = find_promtool(promtool)
    with tempfile.TemporaryDirectory(prefix="argus-rules-") as tmp:
        path = write_export(rules, Path(tmp))
        try:
            proc = subprocess.run(
                [binary, "check", "rules", str(path)], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RuleError(f"promtool check rules did not finish within {timeout_s:g} s",
                            hint="check that promtool runs: `promtool --version`") from None
    if proc.returncode == 0:
        return
    output = (proc.stdout + proc.stderr).strip()
    by_reason = {r.reason: r for r in rules}
    problems = []
    for line in output.splitlines():
        m = _PROMTOOL_RULE_RE.search(line)
        if m and m.group("alert") in by_reason:
            rule = by_reason[m.group("alert")]
            problems.append(f"{rule.location} (rule {rule.reason}): Prometheus rejects it: {m.group('error').strip()}")
    if not problems:
        problems.append(f"promtool check rules failed: {output[-2000:]}")
    raise RuleError("; ".join(problems), hint="fix the PromQL or template in that rule (promtool's words above)")


# --- the detector ----------------------------------------------------------------------------------


@dataclass
class _Active:
    since: datetime
    fired: bool = False


class MetricRuleDetector:
    """Turns the METRIC signals of MetricRuleCollector into findings, applying each rule's `for`.

    One finding per (rule, subject) and firing episode: while it stays active nothing more is reported; once
    it clears and comes back, it is reported again (the store folds it into the same incident by fingerprint).
    A rule that was not evaluated in a poll (Prometheus down) keeps its state.
    """

    name = "metric_rules"

    def __init__(self, rules: MetricRuleSet | Sequence[MetricRule], *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.rules = rules if isinstance(rules, MetricRuleSet) else MetricRuleSet(rules)
        self._clock = clock
        self._active: dict[tuple[str, str], _Active] = {}

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        now = self._clock()
        evaluated: set[str] = set()
        current: dict[tuple[str, str], list[Signal]] = {}
        for signal in signals:
            if signal.kind is not SignalKind.METRIC:
                continue
            reason = signal.attrs.get(RULE_ATTR)
            if not isinstance(reason, str) or self.rules.get(reason) is None:
                continue
            evaluated.add(reason)
            if not signal.attrs.get(EVALUATED_ATTR):
                current.setdefault((reason, signal.subject.key()), []).append(signal)

        for key in [k for k in self._active if k[0] in evaluated and k not in current]:
            del self._active[key]  # cleared: the next appearance starts a new pending period

        findings = []
        for key, series in current.items():
            rule = self.rules.get(key[0])
            assert rule is not None  # filtered above
            state = self._active.setdefault(key, _Active(since=now))
            if state.fired or (now - state.since).total_seconds() < rule.for_s:
                continue
            state.fired = True
            findings.append(self._finding(rule, series, state.since, now))
        return findings

    def pending(self) -> dict[tuple[str, str], datetime]:
        """(reason, subject key) -> active since, for every series pending or firing now."""
        return {k: v.since for k, v in self._active.items()}

    def _finding(self, rule: MetricRule, series: list[Signal], since: datetime, now: datetime) -> Finding:
        first = series[0]
        labels: dict[str, str] = dict(first.attrs.get("labels") or {})
        value = first.value if first.value is not None else math.nan
        summary = rule.render_summary(labels, value)
        action = rule.action
        attrs: dict[str, Any] = {
            "rule": rule.reason,
            "group": rule.group,
            "expr": rule.expr,
            "for": rule.for_text,
            "labels": labels,
            "value": value,
            "series": len(series),
        }
        if rule.xid and math.isfinite(value) and value == int(value) and value > 0:
            code = int(value)
            info = xid_catalog.lookup(code)
            summary = f"{summary}: {xid_catalog.describe(code)}"
            attrs["xid"] = code
            if info is not None:
                attrs.update(xid_meaning=info.meaning, xid_class=info.xid_class.value,
                             nvidia_action=info.nvidia_action)
                action = info.action
        evidence = tuple(_evidence(rule, s) for s in series[:_EVIDENCE_PER_FINDING])
        return Finding(
            category=rule.category,
            reason=rule.reason,
            subject=first.subject,
            summary=summary,
            severity=rule.severity,
            confidence=rule.confidence,
            evidence=evidence,
            first_seen=since,
            detected_at=now,
            recommended_action=action,
            fingerprint=fingerprint_of(rule.category, first.subject, rule.reason),
            attrs=attrs,
        )


def _evidence(rule: MetricRule, signal: Signal) -> Evidence:
    labels = dict(signal.attrs.get("labels") or {})
    name = labels.pop("__name__", "")
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    value = signal.value if signal.value is not None else math.nan
    return Evidence(
        source=signal.source,
        text=f"{name}{{{shown}}} = {go_float(value)} (rule {rule.reason}: {' '.join(rule.expr.split())})",
        at=signal.observed_at,
        value=signal.value,
    )
