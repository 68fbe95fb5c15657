"""`argus dashboards build [--check]` and `argus dashboards ray-metrics` (the work is in argus/dashboards/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from argus.dashboards.build import DEFAULT_DIR
from argus.dashboards.check import check_dashboards
from argus.dashboards.known_metrics import RAY_METRICS_FILE
from argus.dashboards.ray_scrape import ray_metrics_text, scrape_ray_names, sd_targets
from core.errors import ArgusError

EXIT_FAILED = 2

dashboards_app = typer.Typer(help="Grafana dashboards: build them to JSON and check their PromQL.",
                             no_args_is_help=True)

DirOption = Annotated[Path, typer.Option("--dir", help="folder of the *.dashboard.py files", show_default=True)]
PromtoolOption = Annotated[str | None, typer.Option(help="promtool to run (default: from PATH)", show_default=False)]


def register(app: typer.Typer) -> None:
    app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("build")
def build(
    folder: DirOption = DEFAULT_DIR,
    check: Annotated[bool, typer.Option("--check", help="write nothing; fail when a committed JSON is stale")] = False,
    promtool: PromtoolOption = None,
) -> None:
    """Build every *.dashboard.py to JSON beside it and check every PromQL expression in it."""
    console = Console()
    built, report = _or_exit(lambda: check_dashboards(folder, promtool=promtool))
    if not report.ok:
        for problem in report.problems:
            _error(str(problem))
        _fail(f"{len(report.problems)} problem(s) in the dashboards; nothing written",
              "fix the dashboard files named above")
    console.print(f"{len(built)} dashboards, {report.queries} queries: every expression parses and names known "
                  "metrics", highlight=False)
    stale = [b for b in built if not b.is_fresh()]
    if check:
        if stale:
            _fail("stale or missing dashboard JSON: " + ", ".join(str(b.json_path) for b in stale),
                  "run `argus dashboards build` (or `make dashboards`) and commit the JSON")
        console.print("dashboards check passed", style="green")
        return
    for b in stale:
        b.json_path.write_text(b.text, encoding="utf-8")
        console.print(f"wrote {b.json_path}", highlight=False)
    if not stale:
        console.print("every JSON was already up to date", highlight=False)


@dashboards_app.command("ray-metrics")
def ray_metrics(
    out: Annotated[Path, typer.Option("--out", help="file to write")] = DEFAULT_DIR / RAY_METRICS_FILE,
    target: Annotated[list[str], typer.Option("--target", help="host:port of a Ray metrics endpoint to scrape "
                                                                "(repeatable)",
                                              show_default=False)] = [],  # noqa: B006 - typer default
    sd_file: Annotated[Path | None, typer.Option("--sd-file", help="scrape every target in Ray's "
                                                                    "prom_metrics_service_discovery.json",
                                                 show_default=False)] = None,
) -> None:
    """Write the metric names a running Ray cluster serves (dashboards/known_metrics/ray.txt) from a real scrape."""
    console = Console()
    targets = list(target) + (_or_exit(lambda: sd_targets(sd_file)) if sd_file else [])
    if not targets:
        _fail("name the Ray cluster to scrape: --target host:port (repeatable) or --sd-file",
              "Ray's service-discovery file is <ray temp dir>/prom_metrics_service_discovery.json on the head; "
              "from a source checkout, `argus-stage ray-metrics` scrapes a throwaway local cluster instead")
    names, versions = _or_exit(lambda: scrape_ray_names(targets))
    origin = f"{len(targets)} target(s)"
    if not any(n.startswith("ray_") for n in names):
        _fail(f"no Ray metric among the {len(names)} names scraped", "point --target at Ray's metrics export ports")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(ray_metrics_text(names, versions, origin), encoding="utf-8")
    console.print(f"wrote {len(names)} names (Ray {', '.join(sorted(versions)) or 'version unknown'}) to {out}",
                  highlight=False)


def _or_exit(action):
    try:
        return action()
    except ArgusError as exc:
        _fail(exc.message, exc.hint)


def _error(message: str) -> None:
    Console(stderr=True).print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)


def _fail(message: str, hint: str | None) -> None:
    _error(message)
    if hint:
        Console(stderr=True).print(f"  hint: {hint}", markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILED)
