"""The `argus` command. Entry point: the only place (with `serve` and `demo`) that sets up logging."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.errors import ArgusError
from core.logging import setup_logging
from core.names import entrypoint_of, label_of
from core.settings import Settings, load_settings
from core.types import Category, IncidentState

app = typer.Typer(
    name="argus",
    help="Argus: detect, explain and remediate failures of GPU training jobs on Ray clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
incidents_app = typer.Typer(help="Read incidents from the store.", no_args_is_help=True)
db_app = typer.Typer(help="The incident database.", no_args_is_help=True)
config_app = typer.Typer(help="Settings.", no_args_is_help=True)
app.add_typer(incidents_app, name="incidents")
app.add_typer(db_app, name="db")
app.add_typer(config_app, name="config")

out = Console()
err = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML settings file (default: $ARGUS_CONFIG)", show_default=False),
]


def _settings(config: Path | None, **overrides) -> Settings:
    return load_settings(config, **{k: v for k, v in overrides.items() if v is not None})


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="address to listen on (default: api_host)")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (default: api_port)")] = None,
) -> None:
    """Run the API and the detection loop until interrupted."""
    import uvicorn

    from argus.service import ArgusService

    settings = _settings(config, api_host=host, api_port=port)
    setup_logging(settings.log_level, settings.data_dir / "logs" / "argus.log")
    # Threads that work (the alert filer, report writers) hold the interpreter for 5 ms slices by default; a request
    # waits for a slice at each database or socket call it makes, which in an alert storm made reads take seconds.
    # 1 ms slices cost the workers a little throughput and give the API's readers their answers in milliseconds.
    sys.setswitchinterval(0.001)
    service = ArgusService(settings)
    try:
        app = service.start()
        uvicorn.run(
            app,
            host=settings.api_host,
            port=settings.api_port,
            log_config=None,  # uvicorn's records go through the loguru intercept set up above
        )
    finally:
        service.stop()


def _incident_rows(items) -> Table:
    table = Table(expand=True)
    table.add_column("id", no_wrap=True, min_width=16)
    for column in ("state", "category", "subject", "first seen (UTC)"):
        table.add_column(column, overflow="fold")
    table.add_column("summary", overflow="fold", ratio=1, min_width=30)
    for i in items:
        table.add_row(
            i.id,
            f"{i.state.value}\n{i.severity.value}",
            i.category.value,
            Text(label_of(i)),  # names come from job metadata: shown as text, never as rich markup
            i.first_seen.strftime("%m-%d %H:%M:%S"),
            i.summary if len(i.summary) <= 160 else i.summary[:159] + "…",
        )
    return table


@incidents_app.command("list")
def incidents_list(
    config: ConfigOption = None,
    state: Annotated[IncidentState | None, typer.Option(help="only this state")] = None,
    category: Annotated[Category | None, typer.Option(help="only this category")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> None:
    """List incidents, newest first."""
    from argus.wiring import open_store

    store = open_store(_settings(config))
    try:
        items = store.list_incidents(state=state, category=category, limit=limit)
    finally:
        store.close()
    if as_json:
        for i in items:
            print(json.dumps({**i.model_dump(mode="json"), "reopened": i.reopened}, ensure_ascii=False))
    elif not items:
        out.print("no incidents")
    else:
        # below ~120 columns the summary column collapses; a wider line that wraps reads better
        Console(width=max(out.width, 120)).print(_incident_rows(items))


@incidents_app.command("show")
def incidents_show(
    incident_id: Annotated[str, typer.Argument(help="incident id, e.g. inc-0123456789ab")],
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one incident with its findings and evidence."""
    from argus.wiring import open_store

    store = open_store(_settings(config))
    try:
        incident = store.get_incident(incident_id)
        findings = store.findings_for(incident_id)
    finally:
        store.close()
    if as_json:
        body = {
            "incident": {**incident.model_dump(mode="json"), "reopened": incident.reopened},  # as the API shows it
            "findings": [f.model_dump(mode="json") for f in findings],
        }
        print(json.dumps(body, ensure_ascii=False))
        return
    out.print(
        f"[bold]{incident.id}[/] {incident.state.value} [bold red]{incident.category.value}[/] "
        f"({incident.severity.value}), seen {incident.occurrences}x"
        + (f", reopened {incident.reopened}x" if incident.reopened else "")
        + (f", resolved {incident.resolution}" if incident.resolution else "")
    )
    out.print(Text(f"subject: {label_of(incident)} (id {incident.subject.id})"))
    if (entrypoint := entrypoint_of(incident)) is not None:
        out.print(Text(f"entrypoint: {entrypoint}"))
    out.print(f"first seen {incident.first_seen.isoformat()}, detected {incident.detected_at.isoformat()}")
    out.print(f"\n{incident.summary}\n")
    if incident.recommended_action:
        out.print(f"[bold]what to do:[/] {incident.recommended_action}\n")
    for f in findings:
        out.print(f"[bold]{f.reason}[/] ({f.confidence:.0%}): {f.summary}")
        for e in f.evidence:
            where = f"{e.source}:{e.line}" if e.line else e.source
            out.print(f"  {where}  {e.text}", markup=False, highlight=False)


@incidents_app.command("report")
def incidents_report(
    incident_id: Annotated[str, typer.Argument(help="incident id, e.g. inc-0123456789ab")],
    config: ConfigOption = None,
    write: Annotated[bool, typer.Option("--write", help="write a new report now, then show it")] = False,
    llm: Annotated[bool, typer.Option(help="with --write: let the configured LLM write it")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="print the Markdown source")] = False,
) -> None:
    """Show an incident's latest root-cause report (Markdown), or write one now with --write."""
    from rich.markdown import Markdown

    from argus.wiring import build_reports, open_store

    settings = _settings(config)
    store = open_store(settings)
    try:
        if write:
            with err.status(f"writing the report for {incident_id}" + (" (the LLM may take a minute)"
                                                                        if llm and settings.llm_base_url else "")):
                build_reports(settings, store).write(incident_id, llm=llm)
        reports = store.reports_for(incident_id)
    finally:
        store.close()
    if not reports:
        err.print(f"incident {incident_id} has no report yet: run `argus incidents report {incident_id} --write`")
        raise typer.Exit(1)
    latest = reports[-1]
    if as_json:
        print(json.dumps(latest.model_dump(mode="json"), ensure_ascii=False))
    elif raw:
        print(latest.markdown, end="")
    else:
        out.print(Markdown(latest.markdown))


@db_app.command("upgrade")
def db_upgrade(config: ConfigOption = None) -> None:
    """Create or migrate the database to the newest schema."""
    from argus.store.migrate import current_revision, upgrade

    settings = _settings(config)
    upgrade(settings.effective_database_url)
    out.print(f"database at revision {current_revision(settings.effective_database_url)}")


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the effective settings (file, environment and defaults merged)."""
    settings = _settings(config)
    print(json.dumps(settings.model_dump(mode="json"), indent=2))


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="leave the stack running until Ctrl-C at the end")] = False,
    work_dir: Annotated[Path, typer.Option(help="where the demo keeps its state and logs")] = Path(".stack/demo"),
) -> None:
    """Bring up a local Ray cluster and its monitoring, cause six faults, and show Argus detect, explain and act."""
    # The demo lives in the stage (stage/), not in the application: the one import of it under argus/.
    try:
        from stage.demo import run_demo
    except ModuleNotFoundError as exc:
        if exc.name != "stage" and not (exc.name or "").startswith("stage."):
            raise
        raise ArgusError(
            "the demo is not installed: it is part of the `stage` package, which comes with a source checkout "
            "and is not in the argus-gpu wheel",
            hint="in a source checkout run `make demo`, or `pip install -e ./stage` and then `argus demo`",
        ) from None
    raise typer.Exit(run_demo(work_dir=work_dir, keep=keep, console=out))


def _register_plugins() -> None:
    from argus.cli_analyze import register as register_analyze
    from argus.cli_dashboards import register as register_dashboards
    from argus.cli_doctor import register as register_doctor
    from argus.cli_jobs import register as register_jobs
    from argus.cli_mcp import register as register_mcp
    from argus.cli_rules import register as register_rules
    from argus.cli_tokens import register as register_tokens

    register_analyze(app)
    register_dashboards(app)
    register_doctor(app)
    register_jobs(app)
    register_mcp(app)
    register_rules(app)
    register_tokens(app)


def main() -> None:
    setup_logging("WARNING")  # read commands stay quiet; `serve` sets the configured level
    try:
        _register_plugins()
        app()
    except ArgusError as exc:
        err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.hint:
            err.print(f"[bold]what to do:[/] {exc.hint}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
