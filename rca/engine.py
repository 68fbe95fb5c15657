"""One report for one incident: evidence, the deterministic verdict, the LLM's narrative where one is
configured and works, the category decision, and the rendered report.

The deterministic verdict combines two kinds of knowledge. A detector that observed the fault itself
(Ray's node state, DCGM metrics, stalled progress, idle GPUs) is direct evidence; a log signature is read
evidence. A root-cause signature in the logs (an OOM, a hardware fault, a lost node, a full disk) beats an
observation, because it says why (an OOM kill is why the node was lost); the echo signatures below it
(NCCL errors, tracebacks) do not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from core.names import placement_of
from core.types import Action, Category, Finding, Incident, Report
from detectors.engine import RuleSet
from detectors.job_failure import UNMATCHED_REASON
from rca.actions import ActionCatalog, Chosen, load_catalog
from rca.classify import TIER_ROOT_CAUSE, Classification, clip_text, tier
from rca.evidence import EvidenceBuilder, EvidenceBundle, LogSource, MetricsReader
from rca.grounding import Dropped, Evidence, ground
from rca.hang import Hang, hang_of
from rca.redact import Redactor
from rca.report import ReportInput, impact_of, render
from rca.verdict import decide

if TYPE_CHECKING:
    from rca.llm import LlmAnalysis, LlmWriter  # langchain loads only where an LLM is configured


class RcaEngine:
    def __init__(
        self,
        rules: RuleSet,
        redactor: Callable[[], Redactor],
        *,
        writer: LlmWriter | None = None,
        metrics: MetricsReader | None = None,
        token_budget: int = 6000,
        catalog: ActionCatalog | None = None,
    ) -> None:
        self.rules = rules
        self.redactor = redactor
        self.writer = writer
        self.metrics = metrics
        self.token_budget = token_budget
        self.catalog = catalog or load_catalog()
        self._log_reasons = {rule.reason for rule in (*rules.rules, *rules.endings)} | {UNMATCHED_REASON}

    def report(
        self,
        incident: Incident,
        findings: Sequence[Finding],
        logs: Sequence[LogSource] = (),
        *,
        job: dict[str, Any] | None = None,
        node_facts: dict[str, Any] | None = None,
        actions: Sequence[Action] = (),
        last_checkpoint_at: datetime | None = None,
        use_llm: bool = True,
    ) -> Report:
        redactor = self.redactor()
        builder = EvidenceBuilder(self.rules, redactor, token_budget=self.token_budget, metrics=self.metrics)
        found = hang_of(findings, actions)
        bundle, from_logs = builder.build(incident, findings, logs, job=job, node_facts=node_facts,
                                          stacks=found.lines if found else ())
        verdict, observed = self.deterministic(incident, findings, from_logs, hang=found)
        # What the stacks say stands only for a hang: a root cause in the logs (an OOM) is not explained by them.
        hang = found.redacted(redactor.redact) if found is not None and verdict.category is Category.NCCL_HANG \
            else None
        # The verdict quotes findings and log lines: it leaves the process in the report, so it is redacted too.
        verdict = replace(verdict, summary=redactor.redact(verdict.summary),
                          evidence=[(s, n, redactor.redact(t)) for s, n, t in verdict.evidence])
        bundle.verdict.update(category=verdict.category.value, reason=verdict.reason, confidence=verdict.confidence,
                              summary=verdict.summary)
        bundle.hang = hang.sentence if hang is not None else None
        bundle.redactions = redactor.count
        bundle.actions = [{"id": a.id, "text": a.text} for a in self.catalog.for_verdict(verdict.category,
                                                                                          verdict.reason)]
        outcome = decision = None
        cited: tuple[int, ...] = ()
        dropped: list[Dropped] = []
        if self.writer is not None and use_llm:
            outcome = self.writer.analyze(bundle)
            if outcome.ok and outcome.analysis is not None:
                lines = {r: line for r in outcome.analysis.evidence_refs if (line := bundle.line(r)) is not None}
                cited = tuple(lines)
                texts = [line.text for line in lines.values()]
                decision = decide(verdict, outcome.analysis.category, outcome.analysis.confidence, texts, self.rules,
                                  detected=observed)
                grounded, dropped = grounded_prose(outcome.analysis, evidence_of(bundle, incident, findings))
                outcome = replace(outcome, analysis=grounded)
        # Where the job's GPUs were: the incident's own attrs, else the newest finding that knew (a later finding
        # may have been filed once the placement was seen).
        placement = placement_of(incident.attrs) or next(
            (p for f in reversed(findings) if (p := placement_of(f.attrs))), ())
        accepted = decision is not None and decision.accepted and outcome is not None and outcome.analysis is not None
        final = decision.category if decision else verdict.category
        chosen: Chosen = self.catalog.choose(
            final, verdict.reason if final is verdict.category else None,
            outcome.analysis.next_steps if accepted and outcome is not None and outcome.analysis else None)
        impact = impact_of(incident, bundle, last_checkpoint_at=last_checkpoint_at,
                           placement=placement).redacted(redactor.redact)
        bundle.redactions = redactor.count
        return render(ReportInput(incident=incident, bundle=bundle, verdict=verdict, impact=impact, actions=actions,
                                  llm=outcome, decision=decision, llm_configured=self.writer is not None,
                                  cited=cited, redact=redactor.redact, dropped=tuple(dropped), chosen=chosen,
                                  hang=hang, curves=curves_of(findings)))

    def deterministic(self, incident: Incident, findings: Sequence[Finding], from_logs: Classification, *,
                      hang: Hang | None = None) -> tuple[Classification, bool]:
        """The verdict and whether it rests on a direct observation (see the module docstring). A hang's verdict
        states what the ranks' stacks say first (`hang`, rca/hang.py), with their lines first in its evidence."""
        verdict, observed = self._deterministic(incident, findings, from_logs)
        if hang is None or verdict.category is not Category.NCCL_HANG:
            return verdict, observed
        prefix = f"{verdict.category.value}: "
        rest = verdict.summary[len(prefix):] if verdict.summary.startswith(prefix) else verdict.summary
        stacks = [(source, 0, clip_text(text)) for source, text in hang.lines]
        # A log signature's deciding line stays first (the LLM review quotes it); the stacks come right after it.
        head = verdict.evidence[:1] if verdict.winner is not None else []
        evidence = [*head, *stacks, *verdict.evidence[len(head):]][:10]
        return replace(verdict, summary=f"{prefix}{hang.sentence} {rest}", evidence=evidence), observed

    def _deterministic(self, incident: Incident, findings: Sequence[Finding],
                       from_logs: Classification) -> tuple[Classification, bool]:
        observed = [f for f in findings if f.reason not in self._log_reasons and f.category is not Category.UNKNOWN]
        if not observed or tier(from_logs) >= TIER_ROOT_CAUSE:
            return from_logs, False
        best = max(observed, key=lambda f: (f.category is incident.category, f.confidence))
        evidence = [(e.source, e.line or 0, clip_text(e.text)) for e in best.evidence[:10]]
        summary = f"{best.category.value}: {best.summary}"
        if from_logs.winner is not None:
            summary += f" The logs show {from_logs.category.value} ({from_logs.reason}), read as its consequence."
        return Classification(category=best.category, reason=best.reason, summary=summary, evidence=evidence,
                              confidence=round(best.confidence, 2),
                              recommended_action=best.recommended_action or from_logs.recommended_action), True


def curves_of(findings: Sequence[Finding]) -> tuple[tuple[str, tuple[tuple[int, str], ...]], ...]:
    """The recent values of each training series a finding fired on (detectors/training_health.py keeps them in its
    attrs), once per series; values as text (a NaN stays "nan")."""
    curves: dict[str, tuple[tuple[int, str], ...]] = {}
    for f in findings:
        series, recent = f.attrs.get("series"), f.attrs.get("recent")
        if f.category is not Category.TRAINING_ANOMALY or not isinstance(series, str) or not isinstance(recent, list):
            continue
        points = []
        for point in recent[-50:]:
            if isinstance(point, (list, tuple)) and len(point) == 2 and isinstance(point[0], int):
                value = point[1]
                points.append((point[0], f"{value:.4g}" if isinstance(value, float) else str(value)[:24]))
        curves.setdefault(series[:64], tuple(points))
    return tuple(curves.items())


def evidence_of(bundle: EvidenceBundle, incident: Incident, findings: Sequence[Finding]) -> Evidence:
    """All the LLM's prose may rest on: the bundle (not its bookkeeping), the incident's and findings' own fields."""
    texts = [bundle.model_dump_json(exclude={"token_budget", "tokens_used", "redactions", "omitted", "logs_read"}),
             json.dumps(incident.attrs, default=str), incident.summary]
    times = [incident.first_seen, incident.detected_at]
    for f in findings:
        texts += [f.summary, json.dumps(f.attrs, default=str), *(e.text for e in f.evidence)]
        times += [f.first_seen, *(e.at for e in f.evidence if e.at is not None)]
    for e in [*bundle.evidence, *([bundle.last_progress] if bundle.last_progress else [])]:
        times += [t for t in (e.at, e.last_at) if t is not None]
    return Evidence(texts, times)


def grounded_prose(analysis: LlmAnalysis, evidence: Evidence) -> tuple[LlmAnalysis, list[Dropped]]:
    """The LLM's summary and root cause without the sentences that state what the evidence does not show."""
    summary, left_summary = ground("summary", analysis.summary, evidence)
    root_cause, left_cause = ground("root_cause", analysis.root_cause, evidence)
    return analysis.model_copy(update={"summary": summary, "root_cause": root_cause}), left_summary + left_cause
