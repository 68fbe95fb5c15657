"""`argus analyze PATH...`: classify failed-job logs offline, one verdict per file.

Registered on the main Typer app by `register(app)`; the command owns no state beyond the rule set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.errors import ArgusError
from detectors.engine import RuleSet, load_rules
from rca.analyze import analyze_stream

EXIT_INPUT_FAILED = 2
STDIN = "-"


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)


def analyze(
    paths: list[str] = typer.Argument(..., metavar="PATH...", help="log files to classify; '-' reads stdin"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per file, one per line"),
    rules_dirs: list[Path] = typer.Option(
        [], "--rules-dir", help="extra folder of *.yaml rule files (repeatable)", show_default=False
    ),
) -> None:
    """Classify failed-job logs: category, summary, evidence lines, confidence and what to do."""
    out = Console(soft_wrap=False)
    err = Console(stderr=True)
    try:
        rules = load_rules(rules_dirs)
    except ArgusError as exc:
        _error(err, exc.message, exc.hint)
        raise typer.Exit(EXIT_INPUT_FAILED) from None

    failed = False
    for path in paths:
        try:
            result = _analyze_one(path, rules)
        except OSError as exc:
            failed = True
            reason = exc.strerror or str(exc)
            _error(err, f"cannot read {path}: {reason}", "check the path and that you may read it")
            continue
        if as_json:
            sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            _render(out, result)
    if failed:
        raise typer.Exit(EXIT_INPUT_FAILED)


def _analyze_one(path: str, rules: RuleSet) -> dict[str, Any]:
    if path == STDIN:
        return analyze_stream(STDIN, sys.stdin.buffer, rules)
    with open(path, "rb") as stream:
        return analyze_stream(path, stream, rules)


def _error(err: Console, message: str, hint: str | None) -> None:
    err.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)
    if hint:
        err.print(f"  hint: {hint}", markup=False, highlight=False, soft_wrap=True)


def _render(out: Console, result: dict[str, Any]) -> None:
    colour = "green" if result["category"] == "unknown" else "bold red"
    out.rule(Text(result["path"], style="bold"), style="dim")
    out.print(Text.assemble((result["category"], colour), f"  confidence {result['confidence']:.2f}"))
    out.print(result["summary"], markup=False, highlight=False, soft_wrap=True)
    if result["evidence"]:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False)
        table.add_column("line", justify="right", no_wrap=True)
        table.add_column("text", overflow="fold")
        for row in result["evidence"]:
            table.add_row(str(row["line"]), Text(row["text"]))
        out.print(table)
    if result["recommended_action"]:
        action = Text.assemble(("What to do: ", "bold"), result["recommended_action"])
        out.print(action, highlight=False, soft_wrap=True)
