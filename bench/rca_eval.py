"""Score root-cause analysis on the evaluation set of real failure logs (tests/rca_cases/).

Loads every case (rca.cases.load_cases), runs a predictor on it and prints, with rich: accuracy per expected
category, overall accuracy, the confusion matrix (expected x predicted), the share of each case's facts found in
the report (summary and evidence lines), and the misses with the rule that won. `--json` prints the same as JSON.

Only the deterministic mode exists today: the built-in rule files and the classifier of `argus analyze`, each
case's logs read in order as one stream. Another mode (an LLM) plugs in as another predictor in PREDICTORS.

    .venv/bin/python bench/rca_eval.py
    .venv/bin/python bench/rca_eval.py --json > rca_eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.errors import ArgusError  # noqa: E402
from core.types import Category  # noqa: E402
from detectors.engine import load_rules  # noqa: E402
from rca.cases import Case, Prediction, Scores, evaluate, load_cases, rule_predictor  # noqa: E402

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "tests" / "rca_cases"
# mode -> factory of a predictor; one explicit list, so a new mode is one line here.
PREDICTORS: dict[str, Callable[[], Callable[[Case], Prediction]]] = {
    "rules": lambda: rule_predictor(load_rules([])),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="folder of NN_name/ case folders")
    parser.add_argument("--mode", choices=sorted(PREDICTORS), default="rules", help="which predictor to score")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        cases = load_cases(args.root)
    except ArgusError as exc:
        console.print(f"[red]error:[/red] {exc.message}" + (f"\n[dim]{exc.hint}[/dim]" if exc.hint else ""))
        return 2
    scores = evaluate(cases, PREDICTORS[args.mode]())
    if args.json:
        print(json.dumps({"mode": args.mode, **scores.to_dict()}, indent=2))
    else:
        show(scores, args.mode, Console())
    return 0


def show(scores: Scores, mode: str, console: Console) -> None:
    per_category = Table(title=f"RCA accuracy per category ({mode}, {len(scores.results)} cases)")
    for column in ("category", "correct", "cases", "accuracy"):
        per_category.add_column(column, justify="left" if column == "category" else "right")
    for category, score in scores.per_category().items():
        per_category.add_row(category.value, str(score.correct), str(score.total), f"{score.accuracy:.0%}")
    console.print(per_category)

    facts = scores.facts_covered
    console.print(
        f"overall accuracy: [bold]{scores.accuracy:.1%}[/bold]   "
        f"facts covered: [bold]{'n/a' if facts is None else f'{facts:.1%}'}[/bold]"
    )

    confusion = scores.confusion()
    predicted = [c for c in Category if any(c in row for row in confusion.values())]
    matrix = Table(title="confusion matrix (rows: expected, columns: predicted)")
    matrix.add_column("expected")
    for category in predicted:
        matrix.add_column(category.value, justify="right")
    for expected, row in confusion.items():
        cells = []
        for category in predicted:
            n = row.get(category, 0)
            cells.append("" if n == 0 else f"[green]{n}[/green]" if category is expected else f"[red]{n}[/red]")
        matrix.add_row(expected.value, *cells)
    console.print(matrix)

    misses = Table(title=f"misses ({len(scores.misses)})")
    for column in ("case", "expected", "predicted", "winning reason", "first evidence line"):
        misses.add_column(column, overflow="fold")
    for miss in scores.misses:
        line = miss.first_evidence or ""
        misses.add_row(
            miss.case.name + (" (hard negative)" if miss.case.hard_negative else ""),
            miss.case.category.value,
            miss.predicted.value,
            miss.reason or "-",
            line if len(line) <= 160 else line[:159] + "…",
        )
    console.print(misses)


if __name__ == "__main__":
    sys.exit(main())
