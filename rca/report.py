"""The report: Markdown an engineer reads and JSON a tool reads, from one set of facts.

Sections: Summary; Root cause (category, confidence, and how it was decided); Evidence (quoted lines with
their source); Timeline; Impact (job, nodes, GPUs, GPU-hours lost); Recommended actions; What Argus did;
About this report (generator, model, what was redacted or cut). Text from logs is quoted in code spans or
blocks, never interpreted as Markdown (a log line cannot inject a link or a heading).

"What Argus did" lists each remediation step with what it did once it is final (its outcome's message: "resubmitted
job-a as job-a-r1 from checkpoint global_step_40 (step 40) ...", "job X cannot be resubmitted safely: ...", "not
resubmitted: it would start from scratch ..."), else its preview at planning (core.steps); the JSON carries the
same per action, with each resubmitted job's checkpoint and step. `with_actions` rewrites only that section and its
JSON in a stored report, so the report follows the steps as they end without another LLM pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from core.names import ID_MAX, Named, PlacedGpus, clean, label_of, node_of
from core.refs import refs_of
from core.signal_keys import JOB_NAME, OWNER
from core.steps import said
from core.types import Action, Category, Incident, Report
from rca.actions import Chosen
from rca.classify import Classification, tier
from rca.evidence import EvidenceBundle
from rca.grounding import Dropped, told
from rca.hang import Hang
from rca.llm import LlmAnalysis, LlmOutcome
from rca.verdict import CATEGORY_MEANINGS, Decision


@dataclass(frozen=True)
class Impact:
    """Who and what the incident hit, named as people name them (core.names). `label`: the incident's subject
    ("job <sid> (<name>, owner <owner>)", "node <name> (<ip>)"); `nodes`: node labels; `placement`: the GPUs the
    job held per node, where Argus saw them (empty: not known)."""

    job: str | None = None
    owner: str | None = None
    nodes: tuple[str, ...] = ()
    gpus: float | None = None
    gpu_hours_lost: float | None = None
    basis: str = ""  # how gpu_hours_lost was counted
    job_name: str | None = None
    label: str = ""
    placement: tuple[tuple[str, float], ...] = ()  # (node label, GPUs held there)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "job_name": self.job_name, "owner": self.owner, "label": self.label,
                "nodes": list(self.nodes), "gpus": self.gpus,
                "placement": [{"node": n, "gpus": g} for n, g in self.placement],
                "gpu_hours_lost": self.gpu_hours_lost, "basis": self.basis}

    def redacted(self, redact: Callable[[str], str]) -> Impact:
        """The same impact with every name passed through `redact` (a report's Redactor: IPs and users masked
        where the settings ask)."""
        def r(text: str | None) -> str | None:
            return redact(text) if text else text

        return replace(self, job=r(self.job), owner=r(self.owner), job_name=r(self.job_name), label=redact(self.label),
                       nodes=tuple(redact(n) for n in self.nodes),
                       placement=tuple((redact(n), g) for n, g in self.placement))


def impact_of(incident: Incident, bundle: EvidenceBundle, *, last_checkpoint_at: datetime | None = None,
              placement: Sequence[PlacedGpus] = ()) -> Impact:
    """Who and what the incident hit. Nodes and GPUs: where the job's GPUs were (`placement`, as the placement
    collector last saw them), else the node the incident names and the job's spec (nnodes x gpus_per_node).
    GPU-hours lost: the job's GPUs times the time from its last checkpoint (the work to redo) to detection, else
    from the failure to detection (GPUs held while failing)."""
    job, refs = bundle.job, refs_of(incident)
    raw_spec = job.get("spec")
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    attrs = dict(incident.attrs)
    # The job's folder (its JobSpec) fills in what the incident's attrs do not say.
    for key, value in ((JOB_NAME, spec.get("name")), (OWNER, job.get("owner") or spec.get("owner"))):
        if clean(attrs.get(key)) is None and clean(value):
            attrs[key] = value
    named = Named(incident.subject, attrs)
    sid = refs.submission_id or clean(job.get("submission_id"))
    placed = tuple((p.label, p.gpus) for p in placement)
    if placed:
        nodes = [label for label, _ in placed]
        gpus: float | None = sum(g for _, g in placed) or None
    else:
        here = node_of(named)
        nodes = sorted({str(n) for n in (here, *job.get("nodes", ())) if n})
        gpus = job.get("gpus")
        if gpus is None and spec:
            gpus = (spec.get("nnodes") or 1) * (spec.get("gpus_per_node") or 0) or None
    hours = basis = None
    if gpus:
        if last_checkpoint_at is not None and last_checkpoint_at <= incident.detected_at:
            span = incident.detected_at - last_checkpoint_at
            basis = f"{gpus:g} GPUs × {_hours(span.total_seconds())} from the last checkpoint to detection"
        else:
            span = max(incident.detected_at - incident.first_seen, timedelta(0))
            basis = (f"{gpus:g} GPUs × {_hours(span.total_seconds())} from the failure to detection "
                     "(no checkpoint time known)")
        hours = round(gpus * span.total_seconds() / 3600, 2)
    return Impact(job=clean(sid, ID_MAX), owner=clean(attrs.get(OWNER)), nodes=tuple(nodes), gpus=gpus,
                  gpu_hours_lost=hours, basis=basis or "", job_name=clean(attrs.get(JOB_NAME)),
                  label=label_of(named), placement=placed)


@dataclass(frozen=True)
class ReportInput:
    incident: Incident
    bundle: EvidenceBundle
    verdict: Classification  # the deterministic one
    impact: Impact
    actions: Sequence[Action] = ()
    llm: LlmOutcome | None = None
    decision: Decision | None = None
    llm_configured: bool = False
    cited: tuple[int, ...] = field(default_factory=tuple)  # the LLM's refs that exist in the bundle
    redact: Callable[[str], str] | None = None  # for the steps' own words (the report's Redactor)
    chosen: Chosen | None = None  # the catalog's recommended actions (rca/actions.py), in the LLM's order if it chose
    dropped: tuple[Dropped, ...] = ()  # sentences of the LLM's prose no evidence shows (rca/grounding.py)
    hang: Hang | None = None  # what the ranks' stacks say of a hang (rca/hang.py); only where the verdict is one
    # the recent values of the training series that fired (detectors/training_health.py): (series, [(step, value)])
    curves: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()


STRAGGLER_PREFIX = "straggler_"  # rca/metrics.py names a GPU that stands out from the job's others so
CURVE_POINTS = 12  # the values of a training series a report shows: enough to see the turn, narrow enough to read


def render(inp: ReportInput) -> Report:
    incident, bundle, verdict = inp.incident, inp.bundle, inp.verdict
    analysis: LlmAnalysis | None = inp.llm.analysis if inp.llm and inp.llm.ok else None
    accepted = analysis is not None and inp.decision is not None and inp.decision.accepted
    category = inp.decision.category if inp.decision else verdict.category
    confidence = inp.decision.confidence if inp.decision else verdict.confidence
    summary = analysis.summary if accepted and analysis is not None and analysis.summary else verdict.summary
    root_cause = analysis.root_cause if accepted and analysis is not None and analysis.root_cause else verdict.summary
    left_out = told(list(inp.dropped)) if accepted else []
    hang = inp.hang if inp.hang is not None and category is Category.NCCL_HANG else None
    if hang is not None and accepted:  # the rules' fact stands: prose that does not name the culprit gets it first
        summary, root_cause = hang.first_in(summary), hang.first_in(root_cause)
    subject = inp.impact.label or label_of(incident)

    md: list[str] = [f"# {category.value} on {_inline(subject)} ({incident.id})", ""]
    md += ["## Summary", "", _para(summary), ""]

    md += ["## Root cause", "", f"**Category:** `{category.value}` ({CATEGORY_MEANINGS[category]}). "
           f"**Confidence:** {confidence:.2f}.", ""]
    md += [_para(root_cause), ""]
    if verdict.reason:
        md.append(f"Deciding signature: `{verdict.reason}`" + (f" in `{_code(bundle.decided_by)}`." if bundle.decided_by
                                                                 else "."))
    if inp.decision is not None:
        md.append(f"LLM review: {inp.decision.note}.")
        md += [f"LLM prose check: {_inline(line)}." for line in left_out]
    elif inp.llm is not None and not inp.llm.ok:
        md.append(f"The LLM ({inp.llm.model}) could not write this report: {_inline(inp.llm.error or '')}. "
                  "This is the rule engine's report.")
    md.append("")

    md += ["## Evidence", ""]
    if bundle.evidence:
        for e in bundle.evidence:
            where = f"{e.source}:{e.line}" if e.line else e.source
            mark = " (cited by the LLM)" if e.ref in inp.cited else ""
            md.append(f"{e.ref}. `{_code(where)}` ({e.why}){_inline(e.repeated())}{mark}")
            md.append(f"   `{_code(e.text)}`")
    else:
        md.append("No log line matched a failure signature.")
    if bundle.last_progress is not None:
        p = bundle.last_progress
        md += ["", f"Last progress before the failure: `{_code(p.source)}:{p.line}` `{_code(p.text)}`"]
    for w in bundle.windows[:2]:
        md += ["", f"Log around line {w.focus_line} of `{_code(w.source)}`:", "", "```text"]
        md += [f"{w.first_line + i:>6}{'>' if w.first_line + i == w.focus_line else ' '} {_fence(t)}"
               for i, t in enumerate(w.lines)]
        md.append("```")
    for series, points in inp.curves:
        last = points[-CURVE_POINTS:]
        md += ["", f"Recent values of `{_code(series)}`, from the job's step lines:", "",
               "| step | " + " | ".join(str(step) for step, _ in last) + " |",
               "|---|" + "---|" * len(last),
               f"| {_cell(series)} | " + " | ".join(_cell(value) for _, value in last) + " |"]
    suspects = [m for m in bundle.metrics if m.name.startswith(STRAGGLER_PREFIX)]
    if suspects:
        md += ["", "Straggler suspects (each of the job's GPUs against the job's others, over the same window):", ""]
        md += [f"- GPU {_inline(m.labels.get('gpu', '?'))} on {_inline(m.labels.get('node_ip', '?'))}: "
               f"{m.name[len(STRAGGLER_PREFIX):].replace('_', ' ')} {m.last:g} {m.unit} against the job's median of "
               f"{_inline(m.labels.get('job_median', '?'))} {m.unit}" for m in suspects]
    if bundle.metrics:
        md += ["", "| metric | node | min | max | last |", "|---|---|---|---|---|"]
        for m in bundle.metrics:
            node = _cell(m.labels.get("node_ip", ""))
            md.append(f"| {m.name} {m.unit} | {node} | {m.min:g} | {m.max:g} | {m.last:g} |")
    md.append("")

    md += ["## Timeline", ""]
    for when, what in _timeline(inp, analysis if accepted else None):
        md.append(f"- {when}: {_inline(what)}")
    md.append("")

    imp = inp.impact
    md += ["## Impact", ""]
    if imp.job:
        who = ", ".join(p for p in (imp.job_name, f"owner {imp.owner}" if imp.owner else None) if p)
        md.append(f"- Job: `{_code(imp.job)}`" + (f" ({_inline(who)})" if who else ""))
    else:
        md.append("- Job: none named by the evidence")
    if imp.placement:
        md.append("- Nodes (where the job's GPUs were): "
                  + ", ".join(f"`{_code(n)}` ({g:g} GPU{'s' if g != 1 else ''})" for n, g in imp.placement))
    elif imp.nodes:
        md.append(f"- Nodes: {', '.join(f'`{_code(n)}`' for n in imp.nodes)} (where the evidence was seen; "
                  "Argus did not see where the job's GPUs were)" if imp.job else
                  f"- Nodes: {', '.join(f'`{_code(n)}`' for n in imp.nodes)}")
    else:
        md.append("- Nodes: not known (Argus did not see the job hold GPUs, and the evidence names no node)")
    md.append(f"- GPUs: {imp.gpus:g}" if imp.gpus else
              "- GPUs: not known (no placement seen and no job spec with nnodes and gpus_per_node)")
    if imp.gpu_hours_lost is not None:
        md.append(f"- GPU-hours lost: {imp.gpu_hours_lost:g} ({imp.basis})")
    md.append("")

    md += ["## Recommended actions", ""]
    steps = [a.text for a in inp.chosen.actions] if inp.chosen else []
    if verdict.recommended_action and category is verdict.category:
        steps.insert(0, verdict.recommended_action)
    elif incident.recommended_action:
        steps.insert(0, incident.recommended_action)
    md += [f"{i}. {_inline(s)}" for i, s in enumerate(dict.fromkeys(steps), start=1)] or ["None known."]
    refused = list(inp.chosen.refused) if inp.chosen and accepted else []
    if refused:
        shown = "; ".join(f"'{_inline(_cut(s, 80))}'" for s in refused[:3])
        md += ["", f"{len(refused)} of the LLM's next steps {'was' if len(refused) == 1 else 'were'} left out: "
               f"not in the action catalog (rca/actions.yaml): {shown}."]
    md.append("")

    md += actions_section(inp.actions, inp.redact)

    generator = f"llm:{inp.llm.model}" if accepted and inp.llm else "deterministic"
    md += ["## About this report", ""]
    if accepted and inp.llm:
        who = f"the LLM {inp.llm.model} in {inp.llm.seconds:.1f} s from the evidence above; its category was checked"
    elif inp.llm is not None and inp.llm.ok:
        who = f"the rule engine; the LLM {inp.llm.model}'s analysis was not used (see Root cause)"
    elif inp.llm is not None:
        who = f"the rule engine; the LLM {inp.llm.model} failed ({_inline(inp.llm.error or 'no detail')})"
    else:
        who = "the rule engine" + ("" if inp.llm_configured else "; no LLM is configured")
    md.append(f"Written by {who}.")
    md.append(f"Evidence: {bundle.tokens_used} of {bundle.token_budget} tokens; {bundle.redactions} values redacted "
              f"before anything left Argus; logs read: {', '.join(_inline(x) for x in bundle.logs_read) or 'none'}.")
    if bundle.omitted:
        md.append(f"Left out: {'; '.join(_inline(x) for x in bundle.omitted)}.")

    data = {
        "incident": incident.id,
        "category": category.value,
        "confidence": confidence,
        "summary": summary,
        "root_cause": root_cause,
        "rule": verdict.reason,
        "hang": hang.as_dict() if hang is not None else None,
        "deterministic": {"category": verdict.category.value, "confidence": verdict.confidence,
                          "tier": tier(verdict)},
        "llm": None if inp.llm is None else {
            "model": inp.llm.model, "ok": inp.llm.ok, "seconds": inp.llm.seconds, "error": inp.llm.error,
            "category": analysis.category if analysis else None,
            "confidence": analysis.confidence if analysis else None,
            "cited": list(inp.cited),  # the evidence refs the LLM cited that exist (see "evidence")
            "accepted": bool(accepted), "note": inp.decision.note if inp.decision else None,
            "left_out": [{"field": d.field, "sentence": d.sentence, "claims": list(d.claims)}
                         for d in (inp.dropped if accepted else ())],
            "refused_steps": refused,
        },
        "evidence": [e.model_dump(mode="json") for e in bundle.evidence],
        "metrics": [m.model_dump(mode="json") for m in bundle.metrics],  # readings around it; straggler_* suspects
        "curves": {series: [[step, value] for step, value in points] for series, points in inp.curves},
        "timeline": [{"at": w, "event": e} for w, e in _timeline(inp, analysis if accepted else None)],
        "impact": inp.impact.as_dict(),
        "recommended_actions": list(dict.fromkeys(steps)),
        "recommended_action_ids": [a.id for a in inp.chosen.actions] if inp.chosen else [],
        "actions": actions_data(inp.actions, inp.redact),
        "redactions": bundle.redactions,
        "omitted": bundle.omitted,
    }
    return Report(id="", incident_id=incident.id, category=category, confidence=confidence, summary=summary[:2000],
                  markdown="\n".join(md).rstrip() + "\n", generator=generator, data=data)


STEP_TEXT_MAX = 1500  # characters of one step's own words in the report
_SECTION = "## What Argus did"


def actions_section(actions: Sequence[Action], redact: Callable[[str], str] | None = None) -> list[str]:
    """The "What Argus did" section's lines (its heading first, a blank line last)."""
    r = redact or _same
    md = [_SECTION, ""]
    for a in actions:
        step = said(a)
        where = r(a.target.name or a.target.id)
        line = f"- `{a.kind}` on {a.target.kind.value} `{_code(where)}`: {step.status}" + (
            f" ({_inline(r(a.reason))})" if a.reason else "")
        if step.text:
            line += f". {'Outcome' if step.final else 'Preview'}: {_inline(_cut(r(step.text), STEP_TEXT_MAX))}"
        md.append(line)
    if not actions:
        md.append("Nothing yet: no remediation step has been planned for this incident.")
    md.append("")
    return md


def actions_data(actions: Sequence[Action], redact: Callable[[str], str] | None = None) -> list[dict[str, Any]]:
    """The report's JSON of the steps: each one's state and own words, and, for a resubmit, each job's fate
    (resubmitted as which job, from which checkpoint and step, or why not)."""
    r = redact or _same
    out = []
    for a in actions:
        step = said(a)
        item: dict[str, Any] = {
            "id": a.id, "kind": a.kind, "state": a.state.value, "target": r(a.target.id), "dry_run": a.dry_run,
            "status": step.status, "message": _cut(r(step.text), STEP_TEXT_MAX) if step.final else None,
            "preview": _cut(r(str(a.result["preview"])), STEP_TEXT_MAX) if a.result.get("preview") else None,
        }
        jobs = a.result.get("jobs")
        if isinstance(jobs, list):
            item["jobs"] = [{k: r(v) if isinstance(v, str) else v for k, v in j.items()
                             if k in ("job", "state", "new", "resumes", "step", "checkpoint", "message")}
                            for j in jobs[:20] if isinstance(j, dict)]
        out.append(item)
    return out


def with_actions(report: Report, actions: Sequence[Action], redact: Callable[[str], str] | None = None) -> Report:
    """`report` telling `actions` as they are now in "What Argus did" and its JSON; the rest as it was written."""
    data = {**report.data, "actions": actions_data(actions, redact)}
    section = "\n".join(actions_section(actions, redact))
    md = report.markdown
    start = md.find(f"\n{_SECTION}\n")
    if start < 0:  # a report from before the section existed: it is added at the end
        markdown = md.rstrip() + "\n\n" + section.rstrip() + "\n"
    else:
        end = md.find("\n## ", start + len(_SECTION) + 2)
        markdown = md[:start + 1] + section + ("\n" + md[end + 1:] if end >= 0 else "")
    return report.model_copy(update={"markdown": markdown, "data": data})


def _same(text: str) -> str:
    return text


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _timeline(inp: ReportInput, analysis: LlmAnalysis | None) -> list[tuple[str, str]]:
    if analysis is not None and analysis.timeline:
        return [(t.at or "time not shown", t.event) for t in analysis.timeline]
    events: list[tuple[datetime, str]] = []
    bundle, incident = inp.bundle, inp.incident
    if bundle.last_progress is not None and bundle.last_progress.at is not None:
        events.append((bundle.last_progress.at, f"last progress: {bundle.last_progress.text[:160]}"))
    for e in bundle.evidence:
        if e.at is not None:
            events.append((e.at, f"{e.source}: {e.text[:160]}"))
    events.append((incident.first_seen, f"failure first seen: {incident.summary[:160]}"))
    events.append((incident.detected_at, "Argus detected it"))
    for a in inp.actions:
        events.append((a.created_at, f"{a.kind} {a.state.value}"))
    events.sort(key=lambda e: e[0])
    return [(when.isoformat(timespec="seconds"), what) for when, what in events[:20]]


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def _para(text: str) -> str:
    return _inline(text)


def _inline(text: Any) -> str:
    """Prose from logs or an LLM, shown as text: Markdown's active characters are escaped."""
    out = str(text).replace("\r", " ").replace("\n", " ")
    for ch in "\\`*_[]<>#|!":
        out = out.replace(ch, "\\" + ch)
    return out


def _code(text: Any) -> str:
    """Inside a code span: backticks would end it, newlines would break it."""
    return str(text).replace("`", "'").replace("\r", " ").replace("\n", " ")


def _cell(text: str) -> str:
    return _code(text).replace("|", "/")


def _fence(text: str) -> str:
    return text.replace("```", "'''")
