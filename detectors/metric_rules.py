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
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from core.errors import MissingBinary, RuleError
from core.types import Category, Evidence, Finding, Severity, Signal, SignalKind, fingerprint_of, utcnow
from detectors import xid as xid_catalog
from detectors.rule_files import RuleFile, RuleItem, rule_paths

EXPORT_FILE_NAME = "argus-detections.rules.yml"

# Signal attributes written by collectors.metric_rules.MetricRuleCollector.
RULE_ATTR = "rule"  # the reason of the rule whose query produced the signal
EVALUATED_ATTR = "rule_evaluated"  # marks the one signal per evaluated rule that says "I ran"

_FILE_KEYS = {"group", "rules"}
_REQUIRED_RULE_KEYS = ("reason", "category", "severity", "expr", "summary")
_OPTIONAL_RULE_KEYS = ("for", "action", "description", "confidence", "labels", "xid")
# Keys of log rules, found in a metric rule file: the hint says where they belong.
_LOG_FILE_KEYS = dict.fromkeys(
    ("source", "pattern"), "; log rules (source, pattern) belong in detectors/rules/, not detectors/rules/metrics/"
)
_LOG_RULE_KEYS = dict.fromkeys(
    ("pattern", "type", "source"), "; this looks like a log rule, which belongs in detectors/rules/"
)
_RESERVED_LABELS = {"severity", "category", "alertname"}
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


def load_metric_rules(extra_dirs: Iterable[Path] = ()) -> MetricRuleSet:
    """The built-in metric rules plus every *.yaml / *.yml in the extra folders, validated together."""
    paths = rule_paths(builtin_metric_rule_dir(), extra_dirs, "metric rule")
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
    rule_file = RuleFile.read(
        path,
        kind="metric rule",
        empty_hint="write a `rules:` list, or delete the file",
        shape="`rules` (and optional `group`)",
        shape_hint="see detectors/rules/metrics/gpu_hardware.yaml for the shape",
        allowed=_FILE_KEYS,
        misplaced=_LOG_FILE_KEYS,
    )
    rule_file.require("rules", hint="add a `rules:` list")
    group = rule_file.data.get("group", f"argus-{path.stem.replace('_', '-')}")
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise RuleError(
            f"{path}:{rule_file.keys.get('group', 1)}: group {group!r} is not a valid rule group name",
            hint="use letters, digits, '-', '_' and '.', e.g. argus-gpu-hardware",
        )
    return [_build_rule(path, item_node, item, group) for item_node, item in rule_file.rule_items()]


def _build_rule(path: Path, node: yaml.Node, item: Any, group: str) -> MetricRule:
    rule = RuleItem(path, node, item, kind="metric rule", hint=f"give it {', '.join(_REQUIRED_RULE_KEYS)}")
    fail = rule.fail
    rule.check_keys(
        _REQUIRED_RULE_KEYS,
        _OPTIONAL_RULE_KEYS,
        misplaced=_LOG_RULE_KEYS,
    )
    reason = rule.reason("GpuXidDrainAndReset")
    category = rule.choice("category", Category)
    severity = rule.choice("severity", Severity)
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
    confidence = rule.confidence(0.9)
    action = rule.text("action", "write it as one or two sentences")
    description = rule.text("description", "write it as one or two sentences")
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
        confidence=confidence,
        labels={str(k): str(v) for k, v in labels.items()},
        xid=xid_flag,
        group=group,
        file=path,
        line=rule.line,
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


def find_amtool(amtool: str | None = None) -> str:
    """Alertmanager's amtool, found like promtool: on PATH unless a path is given."""
    found = shutil.which(amtool or "amtool")
    if found is None:
        raise MissingBinary(
            amtool or "amtool",
            hint="install Alertmanager's tools (Debian: apt-get install prometheus-alertmanager) or pass its path",
        )
    return found


# --- which metrics a PromQL expression reads --------------------------------------------------------

_PROMQL_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_PROMQL_COMMENT_RE = re.compile(r"#[^\n]*")
_PROMQL_MATCHERS_RE = re.compile(r"\{[^{}]*\}")
_PROMQL_RANGE_RE = re.compile(r"\[[^\[\]]*\]")
_PROMQL_GROUPING_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.I)
_PROMQL_NAME_RE = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                              "bool", "offset", "inf", "nan"})


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (`up`, `argus_actions_total`...), without functions, keywords,
    label names or strings. Good enough to catch a misspelt metric, which Prometheus accepts and never fires on."""
    text = _PROMQL_STRING_RE.sub('""', expr)
    text = _PROMQL_COMMENT_RE.sub(" ", text)
    text = _PROMQL_MATCHERS_RE.sub(" ", text)
    text = _PROMQL_RANGE_RE.sub(" ", text)
    text = _PROMQL_GROUPING_RE.sub(" ", text)
    return {m.group(1) for m in _PROMQL_NAME_RE.finditer(text) if m.group(1).lower() not in _PROMQL_KEYWORDS}


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
                names.setdefault(key, set()).update(promql_metric_names(rule["expr"]))
    return names


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
