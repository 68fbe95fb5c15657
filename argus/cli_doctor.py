"""`argus doctor`: checks what Argus needs around it (argus/doctor.py) and prints what to fix; exit 1 when any
check fails. Registered on the main Typer app by `register(app)`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from core.settings import load_settings

MARKS = {"ok": "[green]✓ ok[/]", "warn": "[yellow]! warn[/]", "fail": "[red]✗ fail[/]", "skip": "[dim]- skip[/]"}


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="the checks as a JSON list")] = False,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML settings file (default: $ARGUS_CONFIG)",
                                                show_default=False)] = None,
) -> None:
    """Check the database, clocks, Ray, py-spy on the nodes, Prometheus and dcgm-exporter, the shared root, SSH to the
    registered nodes and the LLM; say what to fix."""
    from argus.doctor import as_json as checks_json
    from argus.doctor import exit_code, run_checks

    settings = load_settings(config)
    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=err, transient=True,
                  disable=as_json) as progress:
        progress.add_task("checking what Argus needs…", total=None)
        checks = run_checks(settings)
    if as_json:
        print(json.dumps(checks_json(checks), indent=2))
    else:
        table = Table(title="argus doctor", show_lines=False)
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for check in checks:
            table.add_row(check.name, MARKS[check.status], check.detail, check.fix or "")
        Console().print(table)
        failed = [c.name for c in checks if c.status == "fail"]
        Console().print(f"[red]{len(failed)} to fix: {', '.join(failed)}[/]" if failed else "[green]nothing to fix[/]")
    raise typer.Exit(exit_code(checks))
