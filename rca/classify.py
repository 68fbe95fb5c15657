"""Deterministic classification: from rule matches to one category, a summary and bounded evidence.

How priority and time interact (one priority scale across all rule files, see detectors/rules/*.yaml):

1. Permanent matches decide; temporary ones (warnings) only suggest a category, with lower confidence,
   when no permanent match exists (then the highest priority wins, the first line among equals). Among
   permanent matches, signatures (a known failure in its own words) decide before generic rules (the shape
   of a failure: a traceback's last line, "node ... died"), which speak only where no signature matched,
   at their own lower confidence, capped at GENERIC_CAP.
2. Permanent matches at or above ROOT_CAUSE_PRIORITY (hardware, lost node, host / GPU OOM, full disk)
   are root causes. When the log holds any, the echo categories below the line (NCCL errors and
   timeouts, user tracebacks) are demoted: a lost node or an OOM on one rank makes the other ranks time
   out or fail, and those lines may even be printed first (Ray needs seconds to declare a node dead).
3. Within the winning tier the first failure in time (the earliest line) wins over its echoes; on the
   same line the higher priority wins. So among root causes, an OOM that killed a raylet beats the lost
   node it caused; among echoes, a rank's Python error beats the timeouts of the ranks waiting for it.

Time is the line order of one log; matches from several logs should be classified per log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePath

from core.limits import MAX_LINE_CHARS
from core.types import Category
from detectors.engine import ROOT_CAUSE_PRIORITY, RuleMatch, root_cause, root_cause_pool

MAX_EVIDENCE = 10
MAX_EVIDENCE_CHARS = 500
UNKNOWN_CONFIDENCE = 0.1
TEMPORARY_ONLY_FACTOR = 0.6
TEMPORARY_ONLY_CAP = 0.5
CORROBORATION_STEP = 0.02
CORROBORATION_MAX = 0.04
MAX_CONFIDENCE = 0.99
GENERIC_CAP = 0.6
# How strongly a verdict explains a failure (tier()): a root-cause signature, another signature (an echo such as an
# NCCL timeout or a traceback), a generic rule's reading, warnings only, nothing.
TIER_ROOT_CAUSE, TIER_SIGNATURE, TIER_GENERIC, TIER_WARNING, TIER_NONE = 4, 3, 2, 1, 0
UNKNOWN_ACTION = (
    "No known failure signature matched: read the last lines of the log and the Ray dashboard; if this is a "
    "new kind of failure, add a rule for it under detectors/rules/."
)


@dataclass(frozen=True)
class Classification:
    category: Category
    reason: str | None
    summary: str
    evidence: list[tuple[str, int, str]] = field(default_factory=list)  # (source, line, text)
    confidence: float = 0.0
    recommended_action: str | None = None
    winner: RuleMatch | None = field(default=None, compare=False, repr=False)  # the deciding match


def classify(matches: Sequence[RuleMatch], *, lines_scanned: int | None = None) -> Classification:
    if not matches:
        scanned = f" in {lines_scanned} lines" if lines_scanned is not None else ""
        return Classification(
            category=Category.UNKNOWN,
            reason=None,
            summary=f"No known failure signature was found{scanned}.",
            evidence=[],
            confidence=UNKNOWN_CONFIDENCE,
            recommended_action=UNKNOWN_ACTION,
        )

    pool = root_cause_pool(matches)
    permanent = [m for m in pool if m.rule.permanent]
    winner = root_cause(matches)
    assert winner is not None  # matches is not empty
    rule = winner.rule

    same_category = {m.rule.reason for m in pool if m.rule.category is rule.category} - {rule.reason}
    if permanent:
        boost = min(CORROBORATION_MAX, CORROBORATION_STEP * len(same_category))
        confidence = min(GENERIC_CAP if rule.generic else MAX_CONFIDENCE, rule.confidence + boost)
    else:
        confidence = min(TEMPORARY_ONLY_CAP, rule.confidence * TEMPORARY_ONLY_FACTOR)

    return Classification(
        category=rule.category,
        reason=rule.reason,
        summary=_summary(winner, matches, permanent=bool(permanent)),
        evidence=_evidence(winner, matches),
        confidence=round(confidence, 2),
        recommended_action=rule.action,
        winner=winner,
    )


def tier(result: Classification) -> int:
    """How strongly a verdict explains a failure (TIER_*; the order root_cause_pool uses within one log)."""
    if result.winner is None:
        return TIER_NONE
    rule = result.winner.rule
    if not rule.permanent:
        return TIER_WARNING
    if rule.generic:
        return TIER_GENERIC
    return TIER_ROOT_CAUSE if rule.priority >= ROOT_CAUSE_PRIORITY else TIER_SIGNATURE


def classify_logs(verdicts: Sequence[tuple[Classification, datetime | None]]) -> tuple[int, Classification]:
    """One verdict for several logs of one failure (ranks, nodes), each classified on its own, with the time
    of its deciding line when the line carries one. Returns the index of the deciding log and its verdict.

    The strongest tier wins (a lost node or an OOM on one rank beats the NCCL timeouts on the others);
    within it the first failure in time, when every candidate's line has a time; otherwise the higher
    priority, then the order the logs were given in."""
    if not verdicts:
        raise ValueError("classify_logs needs at least one verdict")
    best = max(tier(v) for v, _ in verdicts)
    candidates = [(i, v, at) for i, (v, at) in enumerate(verdicts) if tier(v) == best]

    def priority(v: Classification) -> int:
        return v.winner.rule.priority if v.winner else 0

    if best >= TIER_GENERIC and all(at is not None for _, _, at in candidates):
        index, chosen, _ = min(candidates, key=lambda c: (c[2], -priority(c[1]), c[0]))
    else:
        index, chosen, _ = min(candidates, key=lambda c: (-priority(c[1]), c[0]))
    if len(verdicts) > 1 and chosen.winner is not None:
        others = sorted({v.category.value for v, _ in verdicts if v.winner is not None} - {chosen.category.value})
        shown = f"; the others show: {', '.join(others)}." if others else "."
        across = f" Decided across {len(verdicts)} logs{shown}"
        chosen = replace(chosen, summary=chosen.summary + across)
    return index, chosen


def clip_text(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _evidence(winner: RuleMatch, matches: Sequence[RuleMatch]) -> list[tuple[str, int, str]]:
    """The winning line first, then lines backing the same category, then the rest, in time order."""
    ordered = sorted(matches, key=lambda m: (m.rule.category is not winner.rule.category, m.line_no))
    rows: list[tuple[str, int, str]] = []
    seen: set[tuple[str, int]] = set()
    for m in [winner, *ordered]:
        key = (m.source, m.line_no)
        if key in seen:
            continue
        seen.add(key)
        text = clip_text(m.text)
        if m.truncated:
            text += f" [line cut at {MAX_LINE_CHARS} characters before matching]"
        rows.append((m.source, m.line_no, text))
        if len(rows) >= MAX_EVIDENCE:
            break
    return rows


def _summary(winner: RuleMatch, matches: Sequence[RuleMatch], *, permanent: bool) -> str:
    rule = winner.rule
    what = rule.description or f"{rule.reason} matched."
    where = f"First sign at line {winner.line_no} of {PurePath(winner.source).name or winner.source}."
    # A signature's verdict does not list the generic tier's readings of other lines: they decide nothing there.
    others = sorted({m.rule.reason for m in matches if rule.generic or not m.rule.generic} - {rule.reason})
    tail = f" Also matched: {', '.join(others)}." if others else ""
    if permanent and rule.priority >= ROOT_CAUSE_PRIORITY and not rule.generic:
        echoes = sorted(
            {m.rule.category.value for m in matches
             if m.rule.permanent and not m.rule.generic and m.rule.priority < ROOT_CAUSE_PRIORITY}
            - {rule.category.value}
        )
        if echoes:
            tail += f" Treated as consequences of it: {', '.join(echoes)}."
    hedge = "" if permanent else " Only warning-level signs were found; the job may not have failed from this."
    if permanent and rule.generic:
        hedge = (" No known failure signature matched; this is a generic rule's reading of the failure's shape, "
                 "so the confidence is low.")
    return f"{rule.category.value}: {what} {where}{tail}{hedge}"
