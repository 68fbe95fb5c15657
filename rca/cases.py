"""The RCA evaluation set: folders of real failure logs with the root cause a correct report must give.

A case is a folder `NN_name/` holding one or more `.log` files and a `case.yaml` (tests/rca_cases/README.md has
the format). `load_cases` reads and checks every folder; `evaluate` runs a predictor over the cases and scores
it. A predictor is any callable `predict(case) -> (category, text)`: the deterministic rules today
(`rule_predictor`), a model later. The score does not care which: the category must match the expected one, and
the facts of the case (amounts, GPU, node, Xid, NCCL op) must appear in the text the predictor returns, which
for the rules is the summary and the evidence lines of the report.

No presentation here (bench/rca_eval.py prints); only values.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from core.errors import InputError
from core.types import Category
from detectors.engine import RuleSet
from rca.analyze import analyze_lines, iter_lines
from rca.salience import FAILURE_WORDS

CASE_FILE = "case.yaml"
# Two digits, then a lower-case slug: the number orders the table in the README, the slug says what the case is.
FOLDER_NAME = re.compile(r"^(\d{2,3})_[a-z0-9]+(?:_[a-z0-9]+)*$")  # 01..99, then 100..999
# Cases come from public threads: an issue, a pull request or a discussion, on GitHub or elsewhere.
SOURCE_URL = re.compile(r"^https://[a-z0-9.-]+\.[a-z]{2,}/\S+$")
MAX_FACTS = 5
REQUIRED_KEYS = ("source", "category", "facts", "note")
OPTIONAL_KEYS = ("logs", "hard_negative")


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    source: str
    category: Category
    facts: tuple[str, ...]
    logs: tuple[Path, ...]
    note: str
    hard_negative: bool = False

    def lines(self, stack: ExitStack) -> Iterator[str]:
        """The lines of every log of the case, in the case's order, as one stream."""
        for log in self.logs:
            yield from iter_lines(stack.enter_context(log.open("rb")))

    def text(self) -> str:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace") for log in self.logs)


class Prediction(NamedTuple):
    """What a predictor says about a case: the category, the report text the facts are looked for in, and
    (optional) why, e.g. the winning rule, shown next to a miss."""

    category: Category | str  # a Category or its value
    text: str
    reason: str | None = None
    first_evidence: str | None = None


Predictor = Callable[[Case], "Prediction | tuple[Category | str, str]"]


def load_cases(root: Path) -> list[Case]:
    """Every case folder under `root`, in folder order. A bad case stops the load with its folder named."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"RCA case folder {root} does not exist", hint="pass the folder holding the NN_name/ cases")
    folders = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))),
                     key=lambda p: (int(m.group(1)) if (m := FOLDER_NAME.match(p.name)) else 10**6, p.name))
    cases = [load_case(folder) for folder in folders]
    check_numbering([c.name for c in cases])
    return cases


def thread_of(source: str) -> str:
    """The thread a source names, as one string whatever the case says after it: its URL without the "#comment" part,
    the blanks and a trailing slash. A thread is used once across the folds, the hold-out set and the probe."""
    return source.split("#")[0].strip().rstrip("/")


def fold_of(source: str) -> str:
    """The fold a new case goes to, from its thread's URL alone ("dev" or "test"): chosen by a hash, never by how
    the rules do on it, so the test fold stays a fair sample. Cases 01-63 of tests/rca_cases predate the split."""
    return "dev" if hashlib.sha256(thread_of(source).encode()).digest()[0] % 2 == 0 else "test"


def check_numbering(names: Iterable[str]) -> None:
    """Folder numbers run 01, 02, ... without gaps or repeats, so a new case is appended, not squeezed in."""
    numbers = []
    for name in names:
        match = FOLDER_NAME.match(name)
        if not match:
            raise InputError(
                f"RCA case folder '{name}' is not named NN_slug",
                hint="use two digits (three from 100), an underscore and a lower-case slug, e.g. 07_verl_rollout_oom",
            )
        numbers.append(int(match.group(1)))
    repeated = sorted(n for n, count in Counter(numbers).items() if count > 1)
    if repeated:
        raise InputError(f"RCA case numbers used twice: {repeated}", hint="give every case folder its own number")
    expected = list(range(1, len(numbers) + 1))
    if sorted(numbers) != expected:
        missing = sorted(set(expected) - set(numbers))
        raise InputError(
            f"RCA case numbers are not 01..{len(numbers):02d}: missing {missing}",
            hint="renumber the folders so they run without gaps",
        )


def load_case(folder: Path) -> Case:
    """One case folder, checked: the source is a URL, the category is in the closed list, the logs exist and
    every fact is a verbatim substring of them."""
    folder = Path(folder)
    where = f"RCA case {folder.name}"
    raw = _read_yaml(folder / CASE_FILE, where)
    unknown = sorted(set(raw) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if unknown or missing:
        raise InputError(
            f"{where}: case.yaml has unknown keys {unknown} or lacks {missing}",
            hint=f"use only {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}",
        )
    source = raw["source"]
    if not isinstance(source, str) or not SOURCE_URL.match(source):
        raise InputError(f"{where}: source {source!r} is not a URL", hint="cite the thread the lines were copied from")
    try:
        category = Category(raw["category"])
    except ValueError:
        raise InputError(
            f"{where}: category {raw['category']!r} is not in the closed list",
            hint=f"use one of {', '.join(c.value for c in Category)}",
        ) from None
    logs = _log_paths(folder, raw.get("logs"), where)
    facts = _facts(raw["facts"], category, where)
    case = Case(
        name=folder.name,
        path=folder,
        source=source,
        category=category,
        facts=facts,
        logs=logs,
        note=str(raw["note"]).strip(),
        hard_negative=bool(raw.get("hard_negative", False)),
    )
    text = case.text()
    absent = [f for f in facts if f not in text]
    if absent:
        raise InputError(
            f"{where}: facts {absent} are not in its logs",
            hint="facts must be copied verbatim from the log lines of the case",
        )
    if not case.note:
        raise InputError(f"{where}: note is empty", hint="say in one line why the category is right")
    return case


def _read_yaml(path: Path, where: str) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{where}: {path.name} is missing", hint="every case folder needs a case.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: {path.name} is not valid YAML: {exc}", hint="fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise InputError(f"{where}: {path.name} is not a mapping", hint="write `key: value` lines")
    return raw


def _log_paths(folder: Path, listed: Any, where: str) -> tuple[Path, ...]:
    present = sorted(p for p in folder.glob("*.log") if p.is_file())
    if listed is None:
        logs = present
    elif isinstance(listed, list) and all(isinstance(n, str) for n in listed):
        logs = [folder / name for name in listed]
        lost = [p.name for p in logs if not p.is_file()]
        unread = sorted({p.name for p in present} - set(listed))
        if lost or unread:
            raise InputError(
                f"{where}: logs lists missing files {lost} and leaves out {unread}",
                hint="list every .log file of the folder exactly once, in reading order",
            )
        if len(set(listed)) != len(listed):
            raise InputError(f"{where}: logs lists a file twice", hint="list every .log file exactly once")
    else:
        raise InputError(f"{where}: logs must be a list of file names", hint="e.g. logs: [driver.log, raylet.log]")
    if not logs:
        raise InputError(f"{where}: no .log file", hint="copy the log lines into NAME.log beside case.yaml")
    return tuple(logs)


def _facts(raw: Any, category: Category, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(f, str) and f.strip() for f in raw):
        raise InputError(f"{where}: facts must be a list of non-empty strings", hint='e.g. facts: ["GPU 7"]')
    # A healthy run has nothing a report must name; every failure has at least one fact.
    least = 0 if category is Category.UNKNOWN else 1
    if not least <= len(raw) <= MAX_FACTS:
        raise InputError(
            f"{where}: {len(raw)} facts, expected {least} to {MAX_FACTS}",
            hint="name the few details a correct report must mention",
        )
    return tuple(raw)


# --- scoring ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseResult:
    case: Case
    predicted: Category
    facts_found: tuple[str, ...]
    reason: str | None = None
    first_evidence: str | None = None

    @property
    def correct(self) -> bool:
        return self.predicted is self.case.category

    @property
    def facts_share(self) -> float | None:
        """Share of the case's facts found in the prediction's text; None for a case without facts."""
        if not self.case.facts:
            return None
        return len(self.facts_found) / len(self.case.facts)


@dataclass(frozen=True)
class CategoryScore:
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


@dataclass(frozen=True)
class Scores:
    results: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def accuracy(self) -> float:
        return sum(r.correct for r in self.results) / len(self.results) if self.results else 0.0

    @property
    def facts_covered(self) -> float | None:
        """Mean share of facts found, over the cases that have facts."""
        shares = [s for r in self.results if (s := r.facts_share) is not None]
        return sum(shares) / len(shares) if shares else None

    @property
    def unknown_on_failures(self) -> float | None:
        """The share of failure logs (expected category other than unknown) that were called unknown."""
        failures = [r for r in self.results if r.case.category is not Category.UNKNOWN]
        if not failures:
            return None
        return sum(r.predicted is Category.UNKNOWN for r in failures) / len(failures)

    def unknown_profile(self) -> dict[str, int]:
        """How many logs called unknown show a failure word (rca.salience.FAILURE_WORDS: error, failed, killed,
        lost, timeout, ...): the failure logs among them and the healthy ones. A fallback that read any such word as
        a failure could gain at most the first count and would cost the second."""
        called_unknown = [r for r in self.results if r.predicted is Category.UNKNOWN]
        failures = [r for r in called_unknown if r.case.category is not Category.UNKNOWN]
        healthy = [r for r in called_unknown if r.case.category is Category.UNKNOWN]
        return {
            "failures_called_unknown": len(failures),
            "of_them_with_a_failure_word": sum(bool(FAILURE_WORDS.search(r.case.text())) for r in failures),
            "healthy_called_unknown": len(healthy),
            "of_those_with_a_failure_word": sum(bool(FAILURE_WORDS.search(r.case.text())) for r in healthy),
        }

    @property
    def misses(self) -> list[CaseResult]:
        return [r for r in self.results if not r.correct]

    def per_category(self) -> dict[Category, CategoryScore]:
        """Accuracy per expected category, in the order of the closed list; categories without cases left out."""
        scores = {}
        for category in Category:
            mine = [r for r in self.results if r.case.category is category]
            if mine:
                scores[category] = CategoryScore(sum(r.correct for r in mine), len(mine))
        return scores

    def confusion(self) -> dict[Category, dict[Category, int]]:
        """expected -> predicted -> count, for the expected categories that have cases."""
        matrix: dict[Category, dict[Category, int]] = {}
        for r in self.results:
            row = matrix.setdefault(r.case.category, {})
            row[r.predicted] = row.get(r.predicted, 0) + 1
        return {c: matrix[c] for c in Category if c in matrix}

    def to_dict(self) -> dict[str, Any]:
        return {
            "cases": len(self.results),
            "accuracy": round(self.accuracy, 4),
            "facts_covered": None if self.facts_covered is None else round(self.facts_covered, 4),
            "per_category": {
                c.value: {"correct": s.correct, "total": s.total, "accuracy": round(s.accuracy, 4)}
                for c, s in self.per_category().items()
            },
            "confusion": {e.value: {p.value: n for p, n in row.items()} for e, row in self.confusion().items()},
            "misses": [
                {
                    "case": r.case.name,
                    "expected": r.case.category.value,
                    "predicted": r.predicted.value,
                    "reason": r.reason,
                    "first_evidence": r.first_evidence,
                    "source": r.case.source,
                    "hard_negative": r.case.hard_negative,
                }
                for r in self.misses
            ],
            "results": [
                {
                    "case": r.case.name,
                    "expected": r.case.category.value,
                    "predicted": r.predicted.value,
                    "correct": r.correct,
                    "facts_found": list(r.facts_found),
                    "facts": list(r.case.facts),
                }
                for r in self.results
            ],
        }


def evaluate(cases: Iterable[Case], predict: Predictor) -> Scores:
    """Run `predict` on every case and score it. A predictor may return a Prediction or a plain
    (category, text) pair; the category may be a Category or its value."""
    results = []
    for case in cases:
        raw = predict(case)
        prediction = raw if isinstance(raw, Prediction) else Prediction(*raw)
        predicted = Category(prediction.category)
        found = tuple(f for f in case.facts if f in prediction.text)
        results.append(
            CaseResult(
                case=case,
                predicted=predicted,
                facts_found=found,
                reason=prediction.reason,
                first_evidence=prediction.first_evidence,
            )
        )
    return Scores(tuple(results))


def rule_predictor(rules: RuleSet) -> Callable[[Case], Prediction]:
    """The deterministic classifier of `argus analyze` as a predictor: the case's logs are read, in order, as
    one stream; the report text is the summary and the evidence lines."""

    def predict(case: Case) -> Prediction:
        with ExitStack() as stack:
            verdict = analyze_lines(case.name, case.lines(stack), rules)
        evidence = [row["text"] for row in verdict["evidence"]]
        text = "\n".join([verdict["summary"], *evidence])
        return Prediction(
            category=Category(verdict["category"]),
            text=text,
            reason=winning_reason(verdict["summary"], verdict["category"], rules),
            first_evidence=evidence[0] if evidence else None,
        )

    return predict


def winning_reason(summary: str, category: str, rules: RuleSet) -> str | None:
    """The rule that decided a verdict, recovered from its summary ("<category>: <description> First sign ...")
    since `argus analyze`'s report names the rule by its description only."""
    for rule in rules:
        what = rule.description or f"{rule.reason} matched."
        if rule.category.value == category and summary.startswith(f"{category}: {what} "):
            return rule.reason
    return None
