"""`argus jobs queue`: the job queue, straight from the store (no running API needed): each job's place, gang,
state (queued, running, finished, expired, cancelled, failed) and the reason it waits or waited."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from control.queue import QueueEntry, QueueState
from core.settings import load_settings
from core.types import utcnow

jobs_app = typer.Typer(help="Jobs Argus starts: the queue they wait in.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")


def entry_json(entry: QueueEntry) -> dict[str, object]:
    return {"submission_id": entry.submission_id, "owner": entry.owner, "state": entry.job_state(),
            "queue_state": entry.state.value, "ray_status": entry.ray_status, "nnodes": entry.gang.nnodes,
            "gpus_per_node": entry.gang.gpus_per_node, "pool": entry.gang.pool, "reason": entry.reason,
            "enqueued_at": entry.enqueued_at.isoformat(), "waited_s": entry.waited_s,
            "started_at": entry.started_at.isoformat() if entry.started_at else None,
            "ended_at": entry.ended_at.isoformat() if entry.ended_at else None}


def _waited(entry: QueueEntry, now: datetime) -> str:
    seconds = entry.waited_s if entry.waited_s is not None else (
        (now - entry.enqueued_at).total_seconds() if entry.state is QueueState.QUEUED else None)
    return "-" if seconds is None else f"{seconds:.0f} s"


@jobs_app.command("queue")
def queue(
    state: Annotated[list[QueueState] | None, typer.Option(
        "--state", help="only these queue states (repeat it): queued, started, finished, expired, cancelled, "
                        "failed")] = None,
    owner: Annotated[str | None, typer.Option(help="only this user's jobs")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="the newest N entries")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML settings file (default: "
                                                "$ARGUS_CONFIG)", show_default=False)] = None,
) -> None:
    """The job queue, oldest first."""
    from argus.wiring import open_store

    store = open_store(load_settings(config))
    try:
        entries = store.job_queue.list(states=state or None, owner=owner, limit=limit)
    finally:
        store.close()
    if as_json:
        for entry in entries:
            print(json.dumps(entry_json(entry), ensure_ascii=False))
        return
    if not entries:
        Console().print("the job queue is empty")
        return
    now = utcnow()
    table = Table(title="job queue (oldest first)")
    for column in ("#", "job", "owner", "gang", "state", "waited", "reason"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        gang = f"{entry.gang.nnodes}×{entry.gang.gpus_per_node} GPU" + (f" in {entry.gang.pool}" if entry.gang.pool
                                                                         else "")
        shown = entry.job_state() + (f" ({entry.ray_status})" if entry.state is QueueState.STARTED else "")
        table.add_row(str(entry.position), entry.submission_id, entry.owner, gang, shown, _waited(entry, now),
                      entry.reason)
    Console(width=160).print(table)
