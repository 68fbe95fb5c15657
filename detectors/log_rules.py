"""Log lines to findings with the YAML log rules.

Per LOG_LINE signal: the rules for its stream (`attrs["stream"]`, cached per stream) are tried with the
rule set's combined prefilter, so a line that matches nothing costs one regex search.

- A permanent match is a finding: one per (subject, category) for the life of this detector. The
  fingerprint is category + subject, so the same fault seen again after a restart folds into the same
  incident. When several rules match one line, the highest priority wins.
- A temporary match (e.g. "Health check failed for node ...") is not a finding: on its own it would
  open an incident for a blip. It is kept, a few per subject, and quoted as evidence if a permanent
  match on the same subject follows, so the report shows the warnings that led up to the failure.
- Evidence: the matching line (source, line number, time) after the lines just before it in the same
  file, and earlier temporary matches; each line cut to `evidence_chars`.

State is bounded: a few lines of context per file for the most recent `max_sources` files, a few
temporary matches for the most recent `max_subjects` subjects, and the reported (subject, category)
pairs for the most recent `max_reported`.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from core import signal_keys as keys
from core.types import Category, Evidence, Finding, Signal, SignalKind, Subject, SubjectKind, utcnow
from detectors.engine import ANY_SOURCE, LogRule, RuleSet


class _Lru(OrderedDict):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def touch(self, key: Any, factory: Callable[[], Any]) -> Any:
        value = self.get(key)
        if value is None:
            value = self[key] = factory()
            while len(self) > self.cap:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return value


class LogRuleDetector:
    name = "log_rules"

    def __init__(
        self,
        rules: RuleSet,
        *,
        context_lines: int = 3,
        evidence_chars: int = 2000,
        temporary_per_subject: int = 5,
        max_sources: int = 4096,
        max_subjects: int = 4096,
        max_reported: int = 100_000,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.rules = rules
        self.context_lines = context_lines
        self.evidence_chars = evidence_chars
        self.temporary_per_subject = temporary_per_subject
        self._clock = clock
        self._by_stream: dict[str, RuleSet] = {}
        self._context: _Lru = _Lru(max_sources)  # source -> deque of recent signals
        self._temporary: _Lru = _Lru(max_subjects)  # subject key -> deque of (rule, signal)
        self._reported: _Lru = _Lru(max_reported)  # (subject key, category) -> True

    def _rules_for(self, stream: str) -> RuleSet:
        rules = self._by_stream.get(stream)
        if rules is None:
            rules = self._by_stream[stream] = self.rules if stream == ANY_SOURCE else self.rules.for_source(stream)
        return rules

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        findings: list[Finding] = []
        for signal in signals:
            if signal.kind is not SignalKind.LOG_LINE or not signal.text:
                continue
            context = self._context.touch(signal.source, lambda: deque(maxlen=self.context_lines))
            matched = self._rules_for(str(signal.attrs.get(keys.STREAM) or ANY_SOURCE)).match(signal.text)
            if matched:
                finding = self._on_match(signal, matched, tuple(context))
                if finding is not None:
                    findings.append(finding)
            context.append(signal)
        return findings

    def _on_match(self, signal: Signal, matched: list[LogRule], context: tuple[Signal, ...]) -> Finding | None:
        permanent = [r for r in matched if r.permanent]
        subject = _subject_named_in(signal, permanent) or signal.subject
        subject_key = subject.key()
        if not permanent:
            rule = max(matched, key=lambda r: r.priority)
            events = self._temporary.touch(subject_key, lambda: deque(maxlen=self.temporary_per_subject))
            events.append((rule, signal))
            return None
        rule = max(permanent, key=lambda r: r.priority)
        if self._reported.touch((subject_key, rule.category), lambda: False):
            return None
        self._reported[(subject_key, rule.category)] = True
        earlier = tuple(self._temporary.get(subject_key) or ())
        return self._finding(rule, signal, subject, context, earlier)

    def _evidence(self, signal: Signal, note: str = "") -> Evidence:
        text = signal.text or ""
        if len(text) > self.evidence_chars:
            text = text[: self.evidence_chars] + " [...]"
        if signal.attrs.get(keys.TRUNCATED):
            text += " [line truncated]"
        return Evidence(source=signal.source, text=note + text, line=signal.line, at=signal.observed_at)

    def _finding(
        self,
        rule: LogRule,
        signal: Signal,
        subject: Subject,
        context: tuple[Signal, ...],
        earlier: tuple[tuple[LogRule, Signal], ...],
    ) -> Finding:
        evidence = [self._evidence(s, f"[{r.reason}] ") for r, s in earlier]
        evidence += [self._evidence(s) for s in context]
        evidence.append(self._evidence(signal))
        where = f"{signal.source}:{signal.line}" if signal.line is not None else signal.source
        text = signal.text or ""
        quoted = text if len(text) <= 300 else text[:297] + "..."
        return Finding(
            category=rule.category,
            reason=rule.reason,
            subject=subject,
            summary=f"{rule.description or rule.reason} ({subject.kind.value} {subject.id}, {where}): {quoted}",
            severity=rule.severity,
            confidence=rule.confidence,
            evidence=tuple(evidence),
            first_seen=signal.observed_at,
            detected_at=self._clock(),
            recommended_action=rule.action,
            attrs={
                "rule": rule.reason,
                "rule_location": rule.location,
                "stream": signal.attrs.get(keys.STREAM),
                "file": signal.attrs.get(keys.FILE) or signal.source,
                "line": signal.line,
                keys.NODE_ID: signal.attrs.get(keys.NODE_ID),
                keys.NODE_IP: signal.attrs.get(keys.NODE_IP),
                "temporary_before": [r.reason for r, _ in earlier],
            },
        )


# Ray node ids are 28 bytes, written as 56 hex digits ("node_id=...", "node id: ...", "for node ...").
_RAY_NODE_ID = re.compile(r"(?<![0-9a-fA-F])([0-9a-f]{56})(?![0-9a-fA-F])")


def _subject_named_in(signal: Signal, permanent: list[LogRule]) -> Subject | None:
    """The node a cluster log line is about, when that is not the node that wrote it.

    The GCS on the head logs every other node's death; filed under the head, the finding would blame
    the wrong node and miss the incident Ray's node state opens for the dead one (same fingerprint).
    """
    if signal.subject.kind is not SubjectKind.NODE or not signal.text:
        return None
    if not any(r.category is Category.NODE_LOST for r in permanent):
        return None
    found = _RAY_NODE_ID.search(signal.text)
    if found is None or found.group(1) == signal.subject.id:
        return None
    return Subject(kind=SubjectKind.NODE, id=found.group(1))
