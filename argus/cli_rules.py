"""`argus rules export` and `argus rules check`: the metric rules as Prometheus alerting rules.

`export` writes alert_rules/argus-detections.rules.yml from detectors/rules/metrics/*.yaml. `check`
validates the rule files, says whether the exported file is stale, runs `promtool check rules` on it and on
the hand-written argus-health.rules.yml (whose rules must read only metrics Argus exports: PromQL on a
misspelt metric is valid and never fires), `promtool test rules` on the unit tests beside them
(alert_rules/tests/*.yml), and `amtool check-config` on the example alertmanager.yml.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from core.errors import ArgusError, MissingBinary, RuleError
from detectors.metric_rules import MetricRuleSet, load_metric_rules
from detectors.metric_rules_export import EXPORT_FILE_NAME, export_prometheus_rules, promtool_check, write_export
from detectors.promql import find_promtool, rule_file_metric_names

EXIT_FAILED = 2
DEFAULT_OUT = Path("alert_rules")
HEALTH_FILE_NAME = "argus-health.rules.yml"
ALERTMANAGER_FILE_NAME = "alertmanager.yml"
# What a health rule may read besides Argus's own metrics: Prometheus's verdict on scraping Argus.
PROMETHEUS_SERIES = frozenset({"up"})

rules_app = typer.Typer(help="Metric rules: export them to Prometheus and check them.", no_args_is_help=True)

OutOption = Annotated[Path, typer.Option("--out", help="folder of the exported rule file", show_default=True)]
RulesDirOption = Annotated[
    list[Path],
    typer.Option("--rules-dir", help="extra folder of metric rule *.yaml files (repeatable)", show_default=False),
]
PromtoolOption = Annotated[str | None, typer.Option(help="promtool to run (default: from PATH)", show_default=False)]
AmtoolOption = Annotated[str | None, typer.Option(help="amtool to run (default: from PATH)", show_default=False)]


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
    amtool: AmtoolOption = None,
) -> None:
    """Validate the metric rules, compare the export with a fresh one, check the health rules and the example
    alertmanager.yml, and run the promtool unit tests."""
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

    health = out / HEALTH_FILE_NAME
    _require(health)
    _run(console, [binary, "check", "rules", str(health)], f"promtool check rules {health}")
    _or_exit(lambda: check_reads_argus_metrics(health))
    console.print(f"{health} reads only metrics Argus exports", highlight=False)

    tests = sorted((out / "tests").glob("*.yml")) if (out / "tests").is_dir() else []
    if tests:
        _run(console, [binary, "test", "rules", *map(str, tests)], f"promtool test rules ({len(tests)} files)")

    alertmanager = out / ALERTMANAGER_FILE_NAME
    _require(alertmanager)
    amtool_binary = _or_exit(lambda: find_amtool(amtool))
    _run(console, [amtool_binary, "check-config", str(alertmanager)], f"amtool check-config {alertmanager}",
         hint="fix the Alertmanager configuration where amtool points")
    console.print("rules check passed", style="green")


def unknown_metrics(path: Path) -> dict[str, set[str]]:
    """alert -> the metrics it reads that Argus does not export (nor Prometheus's `up`); empty when all is well."""
    from argus.exporter import ArgusMetrics, exported_series_names  # FastAPI loads only for this check

    known = exported_series_names(ArgusMetrics().registry) | PROMETHEUS_SERIES
    return {alert: names - known for alert, names in rule_file_metric_names(path).items() if names - known}


def check_reads_argus_metrics(path: Path) -> None:
    unknown = unknown_metrics(path)
    if unknown:
        listed = "; ".join(f"{alert} reads {', '.join(sorted(names))}" for alert, names in sorted(unknown.items()))
        raise RuleError(f"{path}: {listed}, which Argus does not export (the rule would never fire)",
                        hint="use the names Argus serves on /metrics (argus/exporter.py lists them)")


def find_amtool(amtool: str | None = None) -> str:
    """Alertmanager's amtool, found like promtool: on PATH unless a path is given."""
    found = shutil.which(amtool or "amtool")
    if found is None:
        raise MissingBinary(
            amtool or "amtool",
            hint="install Alertmanager's tools (Debian: apt-get install prometheus-alertmanager) or pass its path",
        )
    return found


def _load(rules_dirs: list[Path]) -> MetricRuleSet:
    return _or_exit(lambda: load_metric_rules(rules_dirs))


def _or_exit(action):
    try:
        return action()
    except ArgusError as exc:
        _fail(exc.message, exc.hint)


def _require(path: Path) -> None:
    if not path.is_file():
        _fail(f"{path} does not exist",
              f"alert_rules/{path.name} ships with Argus: copy it into {path.parent} (or point --out at alert_rules)")


def _run(console: Console, argv: list[str], what: str,
         hint: str = "fix the rules or the unit tests promtool names above") -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        _fail(f"{what} did not finish within 120 s", f"check that it runs: `{Path(argv[0]).name} --version`")
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        _fail(f"{what} failed:\n{output}", hint)
    console.print(f"{what}: ok", highlight=False)


def _fail(message: str, hint: str | None) -> None:
    err = Console(stderr=True)
    err.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)
    if hint:
        err.print(f"  hint: {hint}", markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILED)
