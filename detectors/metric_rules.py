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
`promtool_check` in detectors/metric_rules_export.py (promtool parses it exactly as Prometheus will), which
also writes the rules as a Prometheus rule file. Summaries are Prometheus templates, restricted to
`{{ $labels.<name> }}`, `{{ $value }}` and `{{ $value | humanizePercentage }}` (detectors/alert_templates.py)
so that the text Argus writes and the text Alertmanager sends are the same.

`MetricRuleDetector` applies `for` the way Prometheus does: a (rule, subject) must be active in every
evaluation for the whole duration before it fires, and starts over when it disappears. It applies `for` to the
end as well: a firing (rule, subject) whose series are absent from every evaluation for `for` (with `for: 0`,
from one evaluation) has ended, and its incident may close (`recoveries()`); one that comes back sooner was a
blip of the same fault. An evaluation that did not happen (Prometheus down, the query rejected) is no absence.

Across an Argus restart, with a `memory` (core.ports.DetectorMemory), each pending or firing (rule, subject) carries
on (detectors/metric_rules_state.py): a restart is an evaluation outage like any other. A pending one fires once
active for `for` since it first was, a firing one is not reported again, and one that has ended is told as a
recovery after `for`, closing the incident the earlier process opened.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from core import signal_keys
from core.errors import RuleError
from core.ports import DetectorMemory
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    fingerprint_of,
    utcnow,
)
from detectors import xid as xid_catalog
from detectors.alert_templates import go_float, render_template, template_problem
from detectors.memory import SavedState, StateUnreadable
from detectors.metric_rules_state import ActiveRule, memory_key, recalled, remembered
from detectors.promql import bracket_problem
from detectors.rule_files import RuleFile, RuleItem, rule_paths

# Signal attributes written by collectors.metric_rules.MetricRuleCollector.
RULE_ATTR = signal_keys.RULE  # the reason of the rule whose query produced the signal
EVALUATED_ATTR = signal_keys.RULE_EVALUATED  # marks the one signal per evaluated rule that says "I ran"

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
    problem = bracket_problem(expr)
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


# --- the detector ----------------------------------------------------------------------------------


class MetricRuleDetector:
    """Turns the METRIC signals of MetricRuleCollector into findings, applying each rule's `for`.

    One finding per (rule, subject) and firing episode: while it stays active nothing more is reported; once
    it has cleared (absent for `for`, told by `recoveries()`) and comes back, it is reported again (the store
    folds it into the same incident by fingerprint). A rule that was not evaluated in a poll (Prometheus down)
    keeps its state. The series of one subject are one fault: it ends when all of them are gone.
    """

    name = "metric_rules"

    def __init__(self, rules: MetricRuleSet | Sequence[MetricRule], *,
                 memory: DetectorMemory | None = None, clock: Callable[[], datetime] = utcnow) -> None:
        """`memory`: where the pending and firing (rule, subject) pairs are kept across restarts (loaded here,
        saved after each detect); None keeps them in this process only."""
        self.rules = rules if isinstance(rules, MetricRuleSet) else MetricRuleSet(rules)
        self._clock = clock
        self._active: dict[tuple[str, str], ActiveRule] = {}
        self._recovered: list[Recovery] = []
        self._saved = SavedState(memory, self.name)
        self._recall()

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
            self._absent(key, now)

        findings = []
        for key, series in current.items():
            rule = self.rules.get(key[0])
            assert rule is not None  # filtered above
            state = self._active.setdefault(key, ActiveRule(since=now))
            state.absent_since = None  # back before it had cleared: the same episode goes on
            if state.fired or (now - state.since).total_seconds() < rule.for_s:
                continue
            finding = self._finding(rule, series, state.since, now)
            state.fired, state.fingerprint, state.subject = True, finding.fingerprint, finding.subject
            findings.append(finding)
        self._remember()
        return findings

    def recoveries(self) -> list[Recovery]:
        """The firing (rule, subject) pairs that have been absent for their rule's `for` since the last call."""
        done, self._recovered = self._recovered, []
        return done

    # -- memory across restarts (detectors/metric_rules_state.py) ---------------------------------------------

    def _recall(self) -> None:
        """The pairs remembered from before a restart, for the rules still in the set (a pair of a rule no longer
        loaded is forgotten: nothing will evaluate it again)."""
        for key, value in self._saved.load().items():
            try:
                pair, state = recalled(key, value)
            except StateUnreadable as err:
                logger.warning("metric rule detector: the remembered state of {} is unreadable ({}): it starts fresh",
                               key, err)
                self._saved.forget_loaded(key)
                continue
            if self.rules.get(pair[0]) is None:
                if state.fired:  # no recovery will come for it: the incident is a person's to close
                    logger.warning("metric rule {} is no longer loaded: its firing state on {} is forgotten, and "
                                   "incident {} stays open until closed by hand", pair[0], pair[1], state.fingerprint)
                self._saved.forget_loaded(key)
                continue
            self._active[pair] = state
        if self._active:
            logger.info("metric rule detector remembers {} pending or firing rule(s) from before the restart",
                        len(self._active))

    def _remember(self) -> None:
        """Save the pairs as they are after this tick (only what changed is written); forget the ended ones."""
        values: dict[str, dict[str, Any] | None] = dict.fromkeys(self._saved.keys())
        values.update((memory_key(*pair), remembered(*pair, state)) for pair, state in self._active.items())
        self._saved.save(values)

    def _absent(self, key: tuple[str, str], now: datetime) -> None:
        state = self._active[key]
        if not state.fired:
            del self._active[key]  # cleared while pending: the next appearance starts a new pending period
            return
        rule = self.rules.get(key[0])
        assert rule is not None  # only rules of the set get a state
        state.absent_since = state.absent_since or now
        if (now - state.absent_since).total_seconds() < rule.for_s:
            return
        del self._active[key]
        who = (state.subject.name or state.subject.id) if state.subject is not None else key[1]
        cleared = f"since {state.absent_since:%Y-%m-%d %H:%M:%S} UTC" if rule.for_s else "in the last evaluation"
        self._recovered.append(Recovery(
            fingerprint=state.fingerprint, detector=self.name, observed_at=now,
            reason=f"metric rule {rule.reason} no longer holds for {who}: `{' '.join(rule.expr.split())}` "
            f"returned no series for it {cleared} (for: {rule.for_text})"))

    def pending(self) -> dict[tuple[str, str], datetime]:
        """(reason, subject key) -> active since, for every series pending or firing now (a firing one stays
        until it has cleared for its rule's `for`)."""
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
