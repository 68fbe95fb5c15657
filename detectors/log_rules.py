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

- A node-scoped fault (host OOM, node lost, GPU hardware) is about the node the line names, not always the one
  that wrote it (the GCS on the head reports every node's OOM kills and deaths): such a line is filed under the
  named node, its IP as the subject's name; a line without a stamp of its own that names no node is about the
  node its message's first line named (named_node.MessageHeads). On a job's line the named node is recorded as
  the affected node (`AFFECTED_NODE_ID` / `AFFECTED_NODE_IP`), so the job's incident and the node's are
  joined (argus.incidents).
- History is not news: a line the collector marked as history (`attrs["history"]`: read from a file's backlog
  and written longer ago than the history window) opens nothing and is no temporary event; it stays as context
  for the lines after it. Lines carry their own time (`attrs["line_time"]`) where the collector dated them: that
  is the time the finding and its evidence quote.
- An error that did not end its job is a warning: when a job's state turns SUCCEEDED, the findings its own log
  lines opened end as recoveries (`recoveries()`) that close their incidents at severity warning, naming the
  line. An error line of a job already SUCCEEDED when it is read is filed at warning and closed the same way; one
  of a job already FAILED or STOPPED is marked `job_ended` (the desk files it with the fault already told).
- Restarts: with a `memory` (core.ports.DetectorMemory), the findings each job's lines opened are saved after every
  detect that changed them and loaded at construction (detectors/log_rules_state.py), so a job that succeeds after
  an Argus restart still closes the incidents its lines opened before it. The jobs' last statuses are not saved:
  Ray lists finished jobs on every poll, so the first poll after a restart says SUCCEEDED again. A line of a
  succeeded job judged before any poll said so (Ray not answering) opens its finding at its rule's severity, kept
  like any other, and the first poll that says SUCCEEDED closes it.

State is bounded: a few lines of context per file for the most recent `max_sources` files, a few
temporary matches for the most recent `max_subjects` subjects, the last status and the reported findings of
the most recent `max_subjects` jobs, and the reported (subject, category) pairs for the most recent
`max_reported`.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from loguru import logger

from core import signal_keys as keys
from core.ports import DetectorMemory
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
    utcnow,
)
from detectors.engine import ANY_SOURCE, LogRule, RuleSet
from detectors.log_rules_state import OpenFinding, recalled, remembered
from detectors.memory import SavedState, StateUnreadable, job_key, keep_newest
from detectors.named_node import NODE_SCOPED, MessageHeads, NamedNode, node_named_in
from detectors.timestamps import parse_iso

SUCCEEDED = "SUCCEEDED"  # Ray's JobStatus for a job whose entrypoint exited 0
ENDED_UNSUCCESSFULLY = frozenset({"FAILED", "STOPPED"})  # Ray's other terminal JobStatus values


class _Lru(OrderedDict):
    def __init__(self, cap: int, on_evict: Callable[[Any], None] | None = None) -> None:
        """`on_evict`: told each key let go past `cap` (to forget it where it was saved)."""
        super().__init__()
        self.cap = cap
        self.on_evict = on_evict

    def touch(self, key: Any, factory: Callable[[], Any]) -> Any:
        value = self.get(key)
        if value is None:
            value = self[key] = factory()
            while len(self) > self.cap:
                evicted, _ = self.popitem(last=False)
                if self.on_evict is not None:
                    self.on_evict(evicted)
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
        memory: DetectorMemory | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`memory`: where the findings waiting for their job's outcome are kept across restarts (loaded here, saved
        after each detect); None keeps them in this process only."""
        self.rules = rules
        self.context_lines = context_lines
        self.evidence_chars = evidence_chars
        self.temporary_per_subject = temporary_per_subject
        self._clock = clock
        self._by_stream: dict[str, RuleSet] = {}
        self._context: _Lru = _Lru(max_sources)  # source -> deque of recent signals
        self._heads = MessageHeads(max_sources)  # cluster log source -> the first line of its current message
        self._temporary: _Lru = _Lru(max_subjects)  # subject key -> deque of (rule, signal)
        self._reported: _Lru = _Lru(max_reported)  # (subject key, category) -> True
        self._status: _Lru = _Lru(max_subjects)  # job id -> its last status, from JOB_STATE
        self._changed: set[str] = set()  # jobs whose open findings may differ from what was saved
        # job id -> [OpenFinding] reported from its own lines, still open
        self._by_job: _Lru = _Lru(max_subjects, on_evict=self._changed.add)
        self._recovered: list[Recovery] = []
        self._saved = SavedState(memory, self.name)
        self._recall()

    def _rules_for(self, stream: str) -> RuleSet:
        rules = self._by_stream.get(stream)
        if rules is None:
            rules = self._by_stream[stream] = self.rules if stream == ANY_SOURCE else self.rules.for_source(stream)
        return rules

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        findings: list[Finding] = []
        for signal in signals:
            if signal.kind is SignalKind.JOB_STATE and signal.subject.kind is SubjectKind.JOB:
                self._on_job_state(signal)
                continue
            if signal.kind is not SignalKind.LOG_LINE or not signal.text:
                continue
            context = self._context.touch(signal.source, lambda: deque(maxlen=self.context_lines))
            continues = signal.subject.kind is SubjectKind.NODE and not self._heads.see(signal.source, signal.text)
            if not signal.attrs.get(keys.HISTORY):
                matched = self._rules_for(str(signal.attrs.get(keys.STREAM) or ANY_SOURCE)).match(signal.text)
                if matched:
                    finding = self._on_match(signal, matched, tuple(context), continues)
                    if finding is not None:
                        findings.append(self._judged_by_outcome(finding))
            context.append(signal)
        self._remember()
        return findings

    def recoveries(self) -> list[Recovery]:
        """Findings of jobs that SUCCEEDED since the last call, to close at warning (the second verb: core.ports)."""
        done, self._recovered = self._recovered, []
        return done

    # -- a job's outcome ---------------------------------------------------------------------------------------

    def _on_job_state(self, signal: Signal) -> None:
        job_id = signal.subject.id
        status = str(signal.attrs.get(keys.STATUS) or "")
        self._status.touch(job_id, lambda: status)
        self._status[job_id] = status
        if status == SUCCEEDED and job_id in self._by_job:
            self._changed.add(job_id)
            for kept in self._by_job.pop(job_id):
                self._recover(kept, job_id)

    def _judged_by_outcome(self, finding: Finding) -> Finding:
        """Keep a job's finding to close when the job succeeds; one already SUCCEEDED is a warning, closed now."""
        if finding.subject.kind is not SubjectKind.JOB:
            return finding
        job_id = finding.subject.id
        status = self._status.get(job_id)
        if status in ENDED_UNSUCCESSFULLY:  # read after the job ended: the incident desk files it with what was told
            return finding.model_copy(update={"attrs": {**finding.attrs, keys.JOB_ENDED: status}})
        if status != SUCCEEDED:
            self._keep(job_id, OpenFinding.of(finding))
            return finding
        if finding.severity.rank > Severity.WARNING.rank:
            finding = finding.model_copy(update={
                "severity": Severity.WARNING,
                "summary": f"{finding.summary} (job {job_id} went on to succeed: a warning)",
            })
        self._recover(OpenFinding.of(finding), job_id)
        return finding

    def _keep(self, job_id: str, finding: OpenFinding) -> None:
        kept: list[OpenFinding] = self._by_job.touch(job_id, list)
        # The same fault reported again (after a restart, which forgets what was reported) is one incident, one close.
        if all(k.fingerprint != finding.fingerprint for k in kept):
            kept.append(finding)
            self._changed.add(job_id)

    def _recover(self, finding: OpenFinding, job_id: str) -> None:
        self._recovered.append(Recovery(
            fingerprint=finding.fingerprint,
            reason=f"job {job_id} SUCCEEDED: the error at {finding.file}:{finding.line} did not end it",
            detector=self.name,
            observed_at=self._clock(),
            severity=min(finding.severity, Severity.WARNING, key=lambda s: s.rank),
        ))
        job = Subject(kind=SubjectKind.JOB, id=job_id)
        self._reported.pop((job.key(), finding.category), None)  # a new run's fault is news again

    # -- memory across restarts (detectors/log_rules_state.py) -------------------------------------------------

    def _recall(self) -> None:
        """The jobs' open findings remembered from before a restart: of the readable ones, those of the jobs
        reported to most recently, as many as the bound keeps (the others are forgotten, as if evicted)."""
        readable: list[tuple[str, str, list[OpenFinding]]] = []
        for key, value in self._saved.load().items():
            try:
                job_id, kept = recalled(key, value)
            except StateUnreadable as err:
                logger.warning("log rule detector: the remembered findings of job {} are unreadable ({}): it starts "
                               "fresh", key, err)
                self._saved.forget_loaded(key)
                continue
            readable.append((key, job_id, kept))
        for job_id, kept in keep_newest(self._saved, readable, self._by_job.cap,
                                        lambda kept: max(f.reported_at for f in kept)):
            self._by_job[job_id] = kept
        if self._by_job:
            logger.info("log rule detector remembers the open findings of {} job(s) from before the restart",
                        len(self._by_job))

    def _remember(self) -> None:
        """Save the jobs whose open findings changed this tick: one write at most, none when nothing changed."""
        changed, self._changed = self._changed, set()
        self._saved.save({job_key(job_id): remembered(job_id, self._by_job.get(job_id) or [])
                          for job_id in changed})

    def _on_match(self, signal: Signal, matched: list[LogRule], context: tuple[Signal, ...],
                  continues: bool = False) -> Finding | None:
        """`continues`: the line continues a cluster log's message begun on an earlier line (it has no stamp)."""
        permanent = [r for r in matched if r.permanent]
        heads_node = self._heads.node_of(signal.source) if continues else None
        subject = _subject_named_in(signal, permanent, heads_node) or signal.subject
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
        return Evidence(source=signal.source, text=note + text, line=signal.line, at=_written_at(signal))

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
            first_seen=_written_at(signal),
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
                **_affected_node(rule, signal, subject),
            },
        )


def _written_at(signal: Signal) -> datetime:
    """When the line was written: the time the collector read from it (a backlog line), else when it was read."""
    return parse_iso(signal.attrs.get(keys.LINE_TIME)) or signal.observed_at


# Ray node ids are 28 bytes, written as 56 hex digits. Unlabelled, the last resort for a node's death only (older
# Ray lines say "Node <id> is dead"); a worker id has the same shape, so other faults need a labelled id.
_RAY_NODE_ID = re.compile(r"(?<![0-9a-fA-F])([0-9a-f]{56})(?![0-9a-fA-F])")


def _subject_named_in(signal: Signal, permanent: list[LogRule], heads_node: NamedNode | None = None) -> Subject | None:
    """The node a cluster log line is about, when the line names it (detectors/named_node.py).

    A node-scoped fault (NODE_SCOPED: a node's death, a host OOM, a GPU's hardware) is about the node it happened
    on, and that is not always the node that wrote the line: the GCS on the head logs every other node's death and
    every worker the memory monitor killed anywhere. Filed under the head, the finding would blame the wrong node
    and miss the incident the fault opens for the right one (same fingerprint: Ray's node state, that node's own
    raylet). The IP the line gives beside the node becomes the subject's name. A line that names no node but
    continues a message whose first line did (`heads_node`: Ray's advice after the GCS's report of an OOM kill) is
    about that node. None: the writer is the subject.
    """
    if signal.subject.kind is not SubjectKind.NODE or not signal.text:
        return None
    rule = max(permanent, key=lambda r: r.priority, default=None)
    if rule is None or rule.category not in NODE_SCOPED:
        return None
    named = node_named_in(signal.text)
    if named is None and rule.category is Category.NODE_LOST:
        bare = _RAY_NODE_ID.search(signal.text)
        named = NamedNode(bare.group(1)) if bare else None
    named = named or heads_node
    if named is None:
        return None
    if named.id == signal.subject.id:
        if signal.subject.name or not named.ip:
            return None
        return signal.subject.model_copy(update={"name": named.ip})
    return Subject(kind=SubjectKind.NODE, id=named.id, name=named.ip)


def _affected_node(rule: LogRule, signal: Signal, subject: Subject) -> dict[str, str]:
    """On a job's finding of a node-scoped fault: the node the text names as where it struck (AFFECTED_NODE_*,
    beside NODE_ID/NODE_IP, which say where the line was written). The correlator joins that node's own incident
    to the job's with it."""
    if subject.kind is not SubjectKind.JOB or rule.category not in NODE_SCOPED or not signal.text:
        return {}
    named = node_named_in(signal.text)
    if named is None:
        return {}
    return {keys.AFFECTED_NODE_ID: named.id, **({keys.AFFECTED_NODE_IP: named.ip} if named.ip else {})}
