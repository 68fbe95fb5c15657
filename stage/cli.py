"""The `argus-stage` command: the stage's tools that are not the application (the DCGM simulator, and the
throwaway local Ray cluster that dashboards/known_metrics/ray.txt is scraped from)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from argus.dashboards.build import DEFAULT_DIR
from argus.dashboards.known_metrics import RAY_METRICS_FILE
from argus.dashboards.ray_scrape import ray_metrics_text
from core.errors import ArgusError
from stage.sim.cli import register as register_sim

app = typer.Typer(
    name="argus-stage",
    help="The stage Argus is tested and shown on: tools that are not part of Argus itself.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
register_sim(app)


@app.command("ray-metrics")
def ray_metrics(
    out: Annotated[Path, typer.Option("--out", help="file to write")] = DEFAULT_DIR / RAY_METRICS_FILE,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the local cluster's metrics")] = 180.0,
) -> None:
    """Start a throwaway local Ray cluster, scrape the metric names it serves, and write them (ray.txt)."""
    from stage.localstack.ray_metrics import scrape_local_ray

    console = Console()
    try:
        with console.status("starting a local Ray cluster and scraping it (a minute or two)"):
            names, versions = scrape_local_ray(timeout=timeout)
    except ArgusError as exc:
        console.print(f"error: {exc.message}" + (f"\n  hint: {exc.hint}" if exc.hint else ""), highlight=False)
        raise typer.Exit(2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(ray_metrics_text(names, versions, "a local idle cluster (head + one worker)"), encoding="utf-8")
    console.print(f"wrote {len(names)} names (Ray {', '.join(sorted(versions)) or 'version unknown'}) to {out}",
                  highlight=False)


@app.callback()
def _commands() -> None:
    # A callback keeps `dcgm-sim` a subcommand; with a single command typer would make it the default.
    pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
