"""Evidence bundles: what a report (and the LLM) may look at for one incident, bounded and redacted.

A bundle holds the incident and its findings, the deterministic verdict over the job's logs (the first
failure in time across ranks and nodes wins, see rca/classify.py), numbered evidence lines, log windows
around the first failure, the last progress line before it, GPU and node metrics around the event, node
facts and the job spec. It is built within a token budget (tokens are estimated as characters / 4, which
over-counts English and log text for the tokenizers of the models Argus is used with), filling parts in
order of how much they explain and saying what was cut. Every text goes through the Redactor before it
is stored in the bundle, so nothing that leaves the process (prompt, report, notification) holds a secret.
Where no rule explains the failure, the lines rca/salience.py picks are numbered as evidence instead.

One module a little past 400 lines: the bundle's parts share one budget and one redactor, filled in one order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from core.line_time import times_of
from core.names import label_of
from core.types import Finding, Incident
from detectors.engine import RuleMatch, RuleSet, last_line
from detectors.stall import DEFAULT_PATTERNS as PROGRESS_PATTERNS
from rca.classify import TIER_WARNING, Classification, classify, classify_logs, clip_text, tier
from rca.collapse import groups, shape, varies
from rca.redact import Redactor
from rca.salience import salient_lines

CHARS_PER_TOKEN = 4
DEFAULT_TOKEN_BUDGET = 6000
WINDOW_BEFORE = 12
WINDOW_AFTER = 8
MAX_LINE_IN_BUNDLE = 400
MAX_LOG_BYTES = 4 * 1024 * 1024  # the tail of a log that is read: failures sit at the end
MAX_MATCHES_PER_LOG = 200
SALIENT_LINES = 30  # across the logs, when no rule explained the failure


def tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


@dataclass(frozen=True)
class LogSource:
    """One log of the failure: a job's driver or a rank, a node's raylet.out, dmesg."""

    name: str
    lines: Sequence[str]
    first_line_no: int = 1  # the file's line number of lines[0] (a tail starts mid-file)


def read_tail(path: Path, *, name: str | None = None, max_bytes: int = MAX_LOG_BYTES) -> LogSource:
    """The last `max_bytes` of a log file as a LogSource; an unreadable file is an empty one, named so."""
    label = name or path.name
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            fh.seek(start)
            raw = fh.read(max_bytes)
    except OSError as exc:
        return LogSource(name=f"{label} (unreadable: {exc.strerror or exc})", lines=())
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if start == 0:
        return LogSource(name=label, lines=lines)
    # A tail: its first line is partial, and line numbers count from the start of the tail.
    return LogSource(name=f"{label} (last {max_bytes // 1024} KiB)", lines=lines[1:])


class EvidenceLine(BaseModel):
    """A line the report quotes; `ref` is what the LLM cites."""

    ref: int
    source: str
    line: int | None = None
    text: str
    at: datetime | None = None
    why: str  # the rule that matched it, "finding", or "progress"
    repeats: int = 1  # lines of this shape collapsed into this one, the first of them (rca/collapse.py)
    varies: str | None = None  # what changed across them: "21–24 s"
    last_at: datetime | None = None  # the time of the last of them, where known

    def repeated(self) -> str:
        """" (×4, 21–24 s; the first shown)" for a collapsed line, "" for a single one."""
        if self.repeats < 2:
            return ""
        return f" (×{self.repeats}{f', {self.varies}' if self.varies else ''}; the first shown)"


class LogWindow(BaseModel):
    source: str
    first_line: int
    lines: list[str]
    focus_line: int


class MetricSummary(BaseModel):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    unit: str = ""
    points: int
    min: float
    max: float
    last: float
    first_at: datetime | None = None
    last_at: datetime | None = None


class EvidenceBundle(BaseModel):
    incident: dict[str, Any]
    findings: list[dict[str, Any]]
    verdict: dict[str, Any]
    decided_by: str | None = None  # the log whose line decided the verdict
    first_failure: EvidenceLine | None = None
    evidence: list[EvidenceLine] = Field(default_factory=list)
    windows: list[LogWindow] = Field(default_factory=list)
    last_progress: EvidenceLine | None = None
    metrics: list[MetricSummary] = Field(default_factory=list)
    node_facts: dict[str, Any] = Field(default_factory=dict)
    job: dict[str, Any] = Field(default_factory=dict)
    logs_read: list[str] = Field(default_factory=list)
    omitted: list[str] = Field(default_factory=list)
    actions: list[dict[str, str]] = Field(default_factory=list)  # the catalog's for the verdict: id, text
    hang: str | None = None  # what the ranks' stacks say of a hang, the rule engine's sentence (rca/hang.py)
    redactions: int = 0
    token_budget: int
    tokens_used: int = 0

    def line(self, ref: int) -> EvidenceLine | None:
        return next((e for e in self.evidence if e.ref == ref), None)


MetricsReader = Callable[[Incident], list[MetricSummary]]


class EvidenceBuilder:
    def __init__(
        self,
        rules: RuleSet,
        redactor: Redactor,
        *,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        metrics: MetricsReader | None = None,
    ) -> None:
        if token_budget < 500:
            raise ValueError("an evidence bundle needs a budget of at least 500 tokens")
        self.rules = rules
        self.redactor = redactor
        self.token_budget = token_budget
        self.metrics = metrics

    def build(
        self,
        incident: Incident,
        findings: Sequence[Finding],
        logs: Sequence[LogSource] = (),
        *,
        job: dict[str, Any] | None = None,
        node_facts: dict[str, Any] | None = None,
        stacks: Sequence[tuple[str, str]] = (),
    ) -> tuple[EvidenceBundle, Classification]:
        """The bundle and the deterministic verdict behind it (over the logs, else over the findings). `stacks`:
        (source, text) lines of where the ranks' stacks are (rca/hang.py), numbered after the verdict's lines."""
        red = self.redactor
        start = red.count
        budget = _Budget(self.token_budget)
        verdict, decided, matches_by_log, times_by_log = self._classify(logs, findings)

        bundle = EvidenceBundle(
            incident=red.redact_data(_incident_brief(incident)),
            findings=_findings_collapsed([red.redact_data(_finding_brief(f)) for f in findings[:10]]),
            verdict={"category": verdict.category.value, "reason": verdict.reason, "confidence": verdict.confidence,
                     "summary": red.redact(verdict.summary), "action": verdict.recommended_action},
            decided_by=logs[decided].name if decided is not None else None,
            logs_read=[f"{s.name}: {len(s.lines)} lines" for s in logs],
            token_budget=self.token_budget,
        )
        budget.take(bundle.model_dump_json())
        if len(findings) > 10:
            bundle.omitted.append(f"{len(findings) - 10} more findings")

        # Numbered evidence: the verdict's lines (the deciding one first), then the findings' own evidence.
        refs: list[EvidenceLine] = []
        for name, line_no, text in verdict.evidence:
            at = _time_at(times_by_log, logs, name, line_no)
            refs.append(EvidenceLine(ref=len(refs) + 1, source=name, line=line_no, text=_clip(red.redact(text)),
                                     at=at, why=_why(matches_by_log, name, line_no)))
        for where, text in stacks:
            if not any(r.text == _clip(red.redact(text)) for r in refs):
                refs.append(EvidenceLine(ref=len(refs) + 1, source=where, text=_clip(red.redact(text)),
                                         why="the ranks' stacks"))
        if tier(verdict) <= TIER_WARNING:
            # No rule explains the failure: the lines a reader would look at first (rca/salience.py), so the LLM
            # reads the log instead of an empty incident.
            for source in logs:
                for pick in salient_lines(source.lines, first_line_no=source.first_line_no,
                                          limit=max(5, SALIENT_LINES // max(1, len(logs)))):
                    text = _clip(red.redact(pick.text))
                    if any(r.text == text and r.source == source.name for r in refs):
                        continue
                    refs.append(EvidenceLine(ref=len(refs) + 1, source=source.name, line=pick.line_no, text=text,
                                             at=_time_at(times_by_log, logs, source.name, pick.line_no),
                                             why=f"salient: {pick.why}"))
        for finding in findings[:10]:
            for ev in finding.evidence[:5]:
                if any(r.text == _clip(red.redact(ev.text)) for r in refs):
                    continue
                refs.append(EvidenceLine(ref=len(refs) + 1, source=ev.source, line=ev.line,
                                         text=_clip(red.redact(ev.text)), at=ev.at, why=f"finding {finding.reason}"))
        refs = _collapsed(refs)
        for ref in refs:
            if not budget.take(ref.model_dump_json()):
                bundle.omitted.append(f"{len(refs) - len(bundle.evidence)} evidence lines (token budget)")
                break
            bundle.evidence.append(ref)
        bundle.first_failure = bundle.evidence[0] if bundle.evidence and verdict.winner is not None else None

        if job and budget.take(str(job)):
            bundle.job = red.redact_data(job)
        elif job:
            bundle.omitted.append("the job spec (token budget)")

        if decided is not None and verdict.winner is not None:
            source = logs[decided]
            focus = verdict.winner.line_no
            window = self._window(source, focus)
            if budget.take("\n".join(window.lines)):
                bundle.windows.append(window)
            else:
                short = self._window(source, focus, before=3, after=2)
                if budget.take("\n".join(short.lines)):
                    bundle.windows.append(short)
                bundle.omitted.append(f"most of the log window around line {focus} of {source.name} (token budget)")
            progress = self._last_progress(source, focus)
            if progress is not None and budget.take(progress.text):
                bundle.last_progress = progress

        if self.metrics is not None:
            try:
                summaries = self.metrics(incident)
            except Exception as exc:  # noqa: BLE001 - metrics are context: a report without them still stands
                bundle.omitted.append(f"metrics (could not read them: {exc})")
                summaries = []
            for summary in summaries:
                if not budget.take(summary.model_dump_json()):
                    bundle.omitted.append(f"{len(summaries) - len(bundle.metrics)} metric series (token budget)")
                    break
                bundle.metrics.append(summary)

        if node_facts:
            if budget.take(str(node_facts)):
                bundle.node_facts = red.redact_data(node_facts)
            else:
                bundle.omitted.append("node facts (token budget)")

        # Other logs' windows, while the budget lasts: what the other ranks saw at the time.
        for index, source in enumerate(logs):
            if index == decided or not matches_by_log[index]:
                continue
            window = self._window(source, matches_by_log[index][0].line_no, before=4, after=2)
            if not budget.take("\n".join(window.lines)):
                bundle.omitted.append("windows of the other logs (token budget)")
                break
            bundle.windows.append(window)

        bundle.redactions = red.count - start
        bundle.tokens_used = budget.used
        return bundle, verdict

    # -- parts -------------------------------------------------------------------------------------------

    def _classify(
        self, logs: Sequence[LogSource], findings: Sequence[Finding]
    ) -> tuple[Classification, int | None, list[list[RuleMatch]], list[list[datetime | None]]]:
        matches_by_log: list[list[RuleMatch]] = []
        times_by_log: list[list[datetime | None]] = []
        verdicts: list[tuple[Classification, datetime | None]] = []
        for source in logs:
            matches: list[RuleMatch] = []
            for match in self.rules.scan(source.lines, source=source.name, start_line=source.first_line_no):
                matches.append(match)
                if len(matches) >= MAX_MATCHES_PER_LOG:
                    break
            # the log of a job that failed or stopped: where it ended
            matches += self.rules.ending(last_line(source.lines, source.first_line_no), source.name)
            times = times_of(source.lines)
            verdict = classify(matches, lines_scanned=len(source.lines))
            at = times[verdict.winner.line_no - source.first_line_no] if verdict.winner else None
            matches_by_log.append(matches)
            times_by_log.append(times)
            verdicts.append((verdict, at))
        if verdicts and any(v.winner is not None for v, _ in verdicts):
            index, verdict = classify_logs(verdicts)
            return verdict, index, matches_by_log, times_by_log
        # No log (or none matched): classify the findings' own evidence lines, which detectors already matched.
        lines = [ev.text for f in findings for ev in f.evidence]
        matches = list(self.rules.scan(lines, source="findings"))
        verdict = classify(matches, lines_scanned=sum(len(source.lines) for source in logs) + len(lines))
        return verdict, None, matches_by_log, times_by_log

    def _window(self, source: LogSource, focus: int, *, before: int = WINDOW_BEFORE,
                after: int = WINDOW_AFTER) -> LogWindow:
        index = focus - source.first_line_no
        lo, hi = max(0, index - before), min(len(source.lines), index + after + 1)
        lines = [_clip(self.redactor.redact(t)) for t in source.lines[lo:hi]]
        return LogWindow(source=source.name, first_line=lo + source.first_line_no, lines=lines, focus_line=focus)

    def _last_progress(self, source: LogSource, focus: int) -> EvidenceLine | None:
        index = focus - source.first_line_no
        for i in range(min(index, len(source.lines)) - 1, -1, -1):
            text = source.lines[i]
            if any(p.regex.search(text[:8192]) for p in PROGRESS_PATTERNS):
                return EvidenceLine(ref=0, source=source.name, line=i + source.first_line_no,
                                    text=_clip(self.redactor.redact(text)), why="progress")
        return None


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, text: str) -> bool:
        cost = tokens(text)
        if self.used + cost > self.limit:
            return False
        self.used += cost
        return True


def _findings_collapsed(briefs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings of one detector about one subject that differ only in numbers and times, as the first of them with
    "repeats" and "varies" (as evidence lines are)."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for b in briefs:
        by_key.setdefault((b["category"], b["reason"], b["subject"], shape(b["summary"])), []).append(b)
    out = []
    for group in by_key.values():
        first = group[0]
        if len(group) > 1:
            first = {**first, "repeats": len(group), "varies": varies([b["summary"] for b in group]),
                     "last_seen": group[-1]["first_seen"]}
        out.append(first)
    return out


def _collapsed(refs: list[EvidenceLine]) -> list[EvidenceLine]:
    """Lines that differ only in numbers and timestamps as one line, the first, with the count and the range; the
    refs numbered again."""
    out: list[EvidenceLine] = []
    for group in groups(refs):
        first = group[0]
        if len(group) > 1:
            times = [e.at for e in group if e.at is not None]
            first = first.model_copy(update={"repeats": len(group), "varies": varies([e.text for e in group]),
                                             "last_at": max(times) if times else None})
        out.append(first.model_copy(update={"ref": len(out) + 1}))
    return out


def _clip(text: str) -> str:
    return clip_text(text, MAX_LINE_IN_BUNDLE)


def _time_at(times_by_log: Sequence[Sequence[datetime | None]], logs: Sequence[LogSource], source: str,
             line_no: int) -> datetime | None:
    for log, times in zip(logs, times_by_log, strict=False):
        if log.name == source and 0 <= line_no - log.first_line_no < len(times):
            return times[line_no - log.first_line_no]
    return None


def _why(matches_by_log: Sequence[Sequence[RuleMatch]], source: str, line_no: int) -> str:
    for matches in matches_by_log:
        for m in matches:
            if m.source == source and m.line_no == line_no:
                return f"rule {m.rule.reason}"
    return "finding"


def _incident_brief(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.id,
        "category": incident.category.value,
        "reason": incident.reason,
        "severity": incident.severity.value,
        "subject": {"kind": incident.subject.kind.value, "id": incident.subject.id, "name": incident.subject.name,
                    "label": label_of(incident)},
        "summary": incident.summary,
        "first_seen": incident.first_seen.isoformat(),
        "detected_at": incident.detected_at.isoformat(),
        "occurrences": incident.occurrences,
        "attrs": {k: v for k, v in incident.attrs.items() if isinstance(v, str | int | float | bool)},
    }


def _finding_brief(finding: Finding) -> dict[str, Any]:
    return {
        "category": finding.category.value,
        "reason": finding.reason,
        "subject": label_of(finding),
        "summary": clip_text(finding.summary, 400),
        "first_seen": finding.first_seen.isoformat(),
    }
