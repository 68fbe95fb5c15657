"""`argus rules export` and `argus rules check`: the metric rules as Prometheus alerting rules.

`export` writes alert_rules/argus-detections.rules.yml from detectors/rules/metrics/*.yaml. `check`
validates the rule files, says whether the exported file is stale, and runs `promtool check rules` on it
and `promtool test rules` on the unit tests beside it (alert_rules/tests/*.yml).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from core.errors import ArgusError
from detectors.metric_rules import (
    EXPORT_FILE_NAME,
    MetricRuleSet,
    export_prometheus_rules,
    find_promtool,
    load_metric_rules,
    promtool_check,
    write_export,
)

EXIT_FAILED = 2
DEFAULT_OUT = Path("alert_rules")

rules_app = typer.Typer(help="Metric rules: export them to Prometheus and check them.", no_args_is_help=True)

OutOption = Annotated[Path, typer.Option("--out", help="folder of the exported rule file", show_default=True)]
RulesDirOption = Annotated[
    list[Path],
    typer.Option("--rules-dir", help="extra folder of metric rule *.yaml files (repeatable)", show_default=False),
]
PromtoolOption = Annotated[str | None, typer.Option(help="promtool to run (default: from PATH)", show_default=False)]


def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")


@rules_app.command("export")
def export(out: OutOption = DEFAULT_OUT, rules_dirs: RulesDirOption = []) -> None:  # noqa: B006 - typer default
    """Write the metric rules as a Prometheus rule file (<out>/argus-detections.rules.yml)."""
    console = Console()
    ruleset = _load(rules_dirs)
    path = write_export(ruleset, out)
    console.print(f"wrote {len(ruleset)} rules to {path}", highlight=False)


@rules_app.command("check")
def check(
    out: OutOption = DEFAULT_OUT,
    rules_dirs: RulesDirOption = [],  # noqa: B006 - typer default
    promtool: PromtoolOption = None,
) -> None:
    """Validate the metric rules, compare the exported file with a fresh export, and run promtool on both."""
    console = Console()
    ruleset = _load(rules_dirs)
    binary = _or_exit(lambda: find_promtool(promtool))
    _or_exit(lambda: promtool_check(ruleset, promtool=binary))
    console.print(f"{len(ruleset)} metric rules are valid PromQL", highlight=False)

    exported = out / EXPORT_FILE_NAME
    fresh = export_prometheus_rules(ruleset)
    if not exported.is_file():
        _fail(f"{exported} does not exist", "run `argus rules export` and commit the file")
    if exported.read_text(encoding="utf-8") != fresh:
        _fail(f"{exported} is stale: it differs from a fresh export of the metric rules",
              "run `argus rules export` and commit the file")
    _run(console, [binary, "check", "rules", str(exported)], f"promtool check rules {exported}")

    tests = sorted((out / "tests").glob("*.yml")) if (out / "tests").is_dir() else []
    if tests:
        _run(console, [binary, "test", "rules", *map(str, tests)], f"promtool test rules ({len(tests)} files)")
    console.print("rules check passed", style="green")


def _load(rules_dirs: list[Path]) -> MetricRuleSet:
    return _or_exit(lambda: load_metric_rules(rules_dirs))


def _or_exit(action):
    try:
        return action()
    except ArgusError as exc:
        _fail(exc.message, exc.hint)


def _run(console: Console, argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        _fail(f"{what} did not finish within 120 s", "check that promtool runs: `promtool --version`")
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        _fail(f"{what} failed:\n{output}", "fix the rules or the unit tests promtool names above")
    console.print(f"{what}: ok", highlight=False)


def _fail(message: str, hint: str | None) -> None:
    err = Console(stderr=True)
    err.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)
    if hint:
        err.print(f"  hint: {hint}", markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILED)
