"""`dcgm-sim`: run the dcgm-exporter SIMULATOR in the foreground (demos, manual tests) until Ctrl-C."""

from __future__ import annotations

import signal
import socket
import sys
import threading

import typer

from core.errors import ArgusError
from stage.sim.dcgm_exporter import DEFAULT_DRIVER_VERSION, DEFAULT_MODEL_NAME, MAX_GPUS, DcgmExporterSim


def register(app: typer.Typer) -> None:
    """Add the `dcgm-sim` command to `app`."""
    app.command("dcgm-sim", help="Serve a SIMULATED dcgm-exporter /metrics (no GPU data) until Ctrl-C.")(
        dcgm_sim
    )


def dcgm_sim(
    hostname: str = typer.Option(socket.gethostname(), help="Hostname label of the simulated node."),
    gpus: int = typer.Option(8, min=1, max=MAX_GPUS, help="Number of simulated GPUs."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(9400, min=0, max=65535, help="Port to listen on (0: any free port)."),
    model_name: str = typer.Option(DEFAULT_MODEL_NAME, help="modelName label."),
    driver_version: str = typer.Option(DEFAULT_DRIVER_VERSION, help="DCGM_FI_DRIVER_VERSION label."),
    jitter: bool = typer.Option(True, help="Small idle noise on temperature, power and SM clock."),
    seed: int = typer.Option(0, help="Seed of the idle noise; one seed gives one sequence."),
) -> None:
    try:
        sim = DcgmExporterSim(
            hostname,
            gpus=gpus,
            model_name=model_name,
            host=host,
            port=port,
            driver_version=driver_version,
            jitter=jitter,
            seed=seed,
        ).start()
    except ArgusError as exc:
        typer.echo(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), err=True)
        raise typer.Exit(code=2) from None

    stop = threading.Event()
    # SIGTERM (from a process manager) ends the simulator as cleanly as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    typer.echo(
        f"dcgm-exporter SIMULATOR for {sim.hostname} ({gpus} simulated GPUs) serving {sim.metrics_url}"
    )
    typer.echo(f'set GPU state: POST {sim.url}/sim/gpus/<index> with JSON, e.g. {{"util": 0, "xid": 79}}')
    # Tests and scripts read the URL from a pipe, where stdout is block-buffered.
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sim.stop()
    typer.echo("dcgm-exporter simulator stopped")
