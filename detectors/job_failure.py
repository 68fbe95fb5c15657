"""Failed jobs: the log rules run over the message Ray keeps for a FAILED job, one finding per job.

When a job fails, Ray's JobInfo `message` holds the tail of the driver's output (the exception with its
text, e.g. "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on
memory"). That tail is often the only evidence left when the job's log files are not collected, or are
collected late, so this detector classifies it with the same rules as the logs: the highest-priority
permanent match wins, the first line among equals (later lines are usually consequences). A failure no
rule explains is still an interruption: it is reported as `unknown` with the message tail as evidence.

A host OOM (any node-scoped fault) records the node the message names as where it struck ("Memory on the node
(IP: ..., ID: ...)") as AFFECTED_NODE_ID / AFFECTED_NODE_IP, so the incident that node's own logs open joins the
job's (argus.incidents.correlate).

Reported once per job while this detector lives. The fingerprint is category + job, the same as the log
rule detector's, so the same OOM seen in the job's log lines and in its final message is one incident.
Jobs that ended more than `lookback_s` before they were first seen (history at start-up) are skipped.

Recovery: a failed job's fault ends when a resubmission of it reached RUNNING (detectors/resubmissions.py
says which jobs are resubmissions; a job a person submits by hand is not assumed to be one). Then its incident
may close (`recoveries()`). Without a resubmission it stays open for a person. A failed job whose resubmission
already ran when it is first seen (Argus restarted meanwhile) is not reported again; its recovery still is,
so an incident left open from before the restart closes. Failures past the lookback are classified only for
that: their fingerprint.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from core import signal_keys as keys
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    SubjectKind,
    utcnow,
)
from detectors.engine import RuleSet, root_cause
from detectors.named_node import NODE_SCOPED, node_named_in
from detectors.resubmissions import JobRuns
from detectors.timestamps import parse_iso

UNMATCHED_REASON = "JobFailed"
UNMATCHED_ACTION = (
    "No known failure signature is in the job's final message: read the job's driver log "
    "(`ray job logs <submission_id>`) and the Ray dashboard; add a rule under detectors/rules/ if this is a "
    "new kind of failure."
)
_EVIDENCE_CHARS = 500
_TAIL_LINES = 5


class JobFailureDetector:
    name = "job_failure"

    def __init__(
        self,
        rules: RuleSet,
        *,
        stream: str = "job-logs",
        report_unmatched: bool = True,
        lookback_s: float = 3600.0,
        max_remembered: int = 100_000,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        # The message is the tail of the driver's output, so it is read with the job log stream's rules.
        self.rules = rules.for_source(stream)
        self.report_unmatched = report_unmatched
        self.lookback = timedelta(seconds=lookback_s)
        self.max_remembered = max_remembered
        self._clock = clock
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._runs = JobRuns(max_jobs=max_remembered)
        self._awaiting: OrderedDict[str, str] = OrderedDict()  # failed job -> fingerprint, until a resubmission runs
        self._recovered: list[Recovery] = []
        self._checked = -1  # the JobRuns generation the waiting jobs were last checked against
        self._fresh = False  # a job joined the waiting ones since that check

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        self._runs.observe(signals)
        findings = []
        for signal in signals:
            if signal.kind is not SignalKind.JOB_STATE or signal.subject.kind is not SubjectKind.JOB:
                continue
            if signal.attrs.get(keys.STATUS) != "FAILED" or signal.subject.id in self._reported:
                continue
            self._remember(signal.subject.id)
            ended = parse_iso(signal.attrs.get(keys.END_TIME)) or signal.observed_at
            finding = self._classify(signal, ended)
            if finding is None:
                continue
            self._await_resubmission(signal.subject.id, finding.fingerprint)
            fresh = self._clock() - ended <= self.lookback
            if fresh and self._runs.resubmission_ran(signal.subject.id) is None:
                findings.append(finding)
        self._resubmitted()
        return findings

    def recoveries(self) -> list[Recovery]:
        """Failed jobs whose resubmission reached RUNNING since the last call (see the module docstring)."""
        done, self._recovered = self._recovered, []
        return done

    def _resubmitted(self) -> None:
        if self._checked == self._runs.generation and not self._fresh:
            return  # no resubmission ran since the last check, and no job joined the waiting ones
        self._checked, self._fresh = self._runs.generation, False
        for job_id, fingerprint in list(self._awaiting.items()):
            new = self._runs.resubmission_ran(job_id)
            if new is None:
                continue
            del self._awaiting[job_id]
            now = self._runs.status(new)
            self._recovered.append(Recovery(
                fingerprint=fingerprint, detector=self.name, observed_at=self._clock(),
                reason=f"job {job_id} was resubmitted as {new}, which reached RUNNING"
                + (f" (now {now})" if now and now != "RUNNING" else "")))

    def _remember(self, job_id: str) -> None:
        self._reported[job_id] = None
        while len(self._reported) > self.max_remembered:
            self._reported.popitem(last=False)

    def _await_resubmission(self, job_id: str, fingerprint: str) -> None:
        self._awaiting[job_id] = fingerprint
        self._fresh = True
        while len(self._awaiting) > self.max_remembered:
            self._awaiting.popitem(last=False)

    def _classify(self, signal: Signal, ended: datetime) -> Finding | None:
        message = signal.text or signal.attrs.get(keys.MESSAGE) or ""
        lines = message.splitlines()
        source = f"{signal.source}/{signal.subject.id}/message"
        matches = [m for m in self.rules.scan(lines, source=source) if m.rule.permanent]
        if not matches:
            return self._unmatched(signal, lines, source, ended) if self.report_unmatched else None
        winner = root_cause(matches)  # the same order as the log rules and `argus analyze`
        assert winner is not None
        rule = winner.rule
        others = sorted({m.rule.reason for m in matches} - {rule.reason})
        evidence = [_evidence(winner.source, winner.text, winner.line_no, ended)]
        evidence += [_evidence(m.source, m.text, m.line_no, ended) for m in matches if m is not winner][:5]
        evidence.append(self._status_evidence(signal, ended))
        also = f" Also matched: {', '.join(others)}." if others else ""
        return Finding(
            category=rule.category,
            reason=rule.reason,
            subject=signal.subject,
            summary=f"Job {signal.subject.id} FAILED: {rule.description or rule.reason} "
            f"(line {winner.line_no} of Ray's job message: {_clip(winner.text, 300)}).{also}",
            severity=rule.severity,
            confidence=rule.confidence,
            evidence=tuple(evidence),
            first_seen=ended,
            detected_at=self._clock(),
            recommended_action=rule.action,
            attrs={
                **self._attrs(signal, rule_reason=rule.reason, matched=[m.rule.reason for m in matches]),
                **_affected_node(rule.category, [winner.text, *lines]),
            },
        )

    def _unmatched(self, signal: Signal, lines: list[str], source: str, ended: datetime) -> Finding:
        first = max(1, len(lines) - _TAIL_LINES + 1)
        tail = [_evidence(source, text, n, ended) for n, text in enumerate(lines[-_TAIL_LINES:], start=first)]
        error_type = signal.attrs.get(keys.ERROR_TYPE) or "no error type"
        return Finding(
            category=Category.UNKNOWN,
            reason=UNMATCHED_REASON,
            subject=signal.subject,
            summary=f"Job {signal.subject.id} FAILED ({error_type}); no known failure signature in its message: "
            f"{_clip(lines[-1] if lines else '(empty message)', 300)}",
            severity=Severity.WARNING,
            confidence=0.3,
            evidence=(*tail, self._status_evidence(signal, ended)),
            first_seen=ended,
            detected_at=self._clock(),
            recommended_action=UNMATCHED_ACTION,
            attrs=self._attrs(signal, rule_reason=None, matched=[]),
        )

    @staticmethod
    def _status_evidence(signal: Signal, ended: datetime) -> Evidence:
        attrs = signal.attrs
        return Evidence(
            source=signal.source,
            text=f"job {signal.subject.id} status=FAILED error_type={attrs.get(keys.ERROR_TYPE)} "
            f"entrypoint={_clip(str(attrs.get(keys.ENTRYPOINT) or ''), 200)}",
            at=ended,
        )

    @staticmethod
    def _attrs(signal: Signal, *, rule_reason: str | None, matched: list[str]) -> dict:
        attrs = signal.attrs
        return {
            keys.SUBMISSION_ID: attrs.get(keys.SUBMISSION_ID) or signal.subject.id,
            keys.JOB_ID: attrs.get(keys.JOB_ID),
            "error_type": attrs.get(keys.ERROR_TYPE),
            "driver_node_id": attrs.get(keys.DRIVER_NODE_ID),
            "end_time": attrs.get(keys.END_TIME),
            "rule": rule_reason,
            "matched": matched,
        }


def _affected_node(category: Category, texts: list[str]) -> dict[str, str]:
    """For a node-scoped fault (a host OOM): the node the message names as where it struck, the winning line first
    (AFFECTED_NODE_ID / AFFECTED_NODE_IP; argus.incidents joins that node's own incident to the job's with it)."""
    if category not in NODE_SCOPED:
        return {}
    named = next((n for text in texts if (n := node_named_in(text)) is not None), None)
    if named is None:
        return {}
    return {keys.AFFECTED_NODE_ID: named.id, **({keys.AFFECTED_NODE_IP: named.ip} if named.ip else {})}


def _evidence(source: str, text: str, line: int, at: datetime) -> Evidence:
    return Evidence(source=source, text=_clip(text, _EVIDENCE_CHARS), line=line, at=at)


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
