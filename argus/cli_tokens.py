"""`argus tokens create|list|revoke`: API tokens, straight in the store (no running API needed).

`create` prints the token alone on stdout, once (`TOKEN=$(argus tokens create ci --role viewer)`); the
store keeps only its sha256, so a lost token is revoked and replaced, never shown again.
"""

from __future__ import annotations

import getpass
import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from argus.store.tokens import Role, TokenRecord
from core.settings import load_settings
from core.types import utcnow

tokens_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML settings file (default: $ARGUS_CONFIG)", show_default=False),
]


def register(app: typer.Typer) -> None:
    app.add_typer(tokens_app, name="tokens")


def _open_store(config: Path | None):
    from argus.wiring import open_store

    return open_store(load_settings(config))


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name for this uid (containers)
        return "cli"


@tokens_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="who or what holds the token, e.g. ops-agent, grafana")],
    role: Annotated[Role, typer.Option(help="viewer, operator, agent, admin, or user (a person who runs jobs)")],
    user: Annotated[str | None, typer.Option(help="the person a user token speaks for: the owner of its jobs "
                                                  "(default: the token's name)")] = None,
    expires_days: Annotated[
        int | None, typer.Option(min=1, max=3650, help="days until it expires (default: never)")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Create a token and print it once; only its hash is stored."""
    expires_at = utcnow() + timedelta(days=expires_days) if expires_days else None
    store = _open_store(config)
    try:
        record, token = store.create_token(name, role, created_by=_who(), expires_at=expires_at, user=user)
    finally:
        store.close()
    print(token)
    until = record.expires_at.isoformat() if record.expires_at else "never"
    speaks = f", user {record.user}" if record.user else ""
    Console(stderr=True).print(
        f"token {record.name} ({record.role.value}{speaks}, expires {until}) created; it is shown only this once",
        highlight=False,
    )


@tokens_app.command("list")
def list_(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> None:
    """List tokens (names, roles, public prefixes, dates); never the tokens themselves."""
    store = _open_store(config)
    try:
        records = store.list_tokens()
    finally:
        store.close()
    if as_json:
        for r in records:
            print(json.dumps(r.public(), ensure_ascii=False))
    elif not records:
        Console().print("no tokens")
    else:
        Console(width=140).print(_table(records))


def _table(records: list[TokenRecord]) -> Table:
    now = utcnow()
    table = Table()
    for column in ("name", "role", "user", "prefix", "state", "created", "expires", "last used"):
        table.add_column(column, overflow="fold")
    for r in records:
        state = "revoked" if r.revoked_at else ("active" if r.usable_at(now) else "expired")
        table.add_row(
            r.name, r.role.value, r.user or "-", r.prefix, state, f"{r.created_at:%Y-%m-%d %H:%M} by {r.created_by}",
            f"{r.expires_at:%Y-%m-%d %H:%M}" if r.expires_at else "never",
            f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "-",
        )
    return table


@tokens_app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="the token's name (or id)")],
    config: ConfigOption = None,
) -> None:
    """Revoke a token: it is refused from the next request on."""
    store = _open_store(config)
    try:
        record = store.revoke_token(name)
    finally:
        store.close()
    Console().print(f"token {record.name} revoked at {record.revoked_at.isoformat()}", highlight=False)
