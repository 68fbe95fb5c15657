"""The `argus-stage` command: the stage's tools that are not the application (today the DCGM simulator)."""

from __future__ import annotations

import typer

from stage.sim.cli import register as register_sim

app = typer.Typer(
    name="argus-stage",
    help="The stage Argus is tested and shown on: tools that are not part of Argus itself.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
register_sim(app)


@app.callback()
def _commands() -> None:
    # A callback keeps `dcgm-sim` a subcommand; with a single command typer would make it the default.
    pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
