"""Kill-to-incident time for a lost node, on a real local Ray cluster.

Kills worker 1's raylet N times (restarting it in between) and prints, per run and as median / max:
when Ray declared the node DEAD (its own end time for the node) and when Argus opened the incident,
both in seconds after the kill. Argus polls at --poll seconds.

    .venv/bin/python bench/lost_node.py -n 5               # health check tuned to 500 ms x 3
    .venv/bin/python bench/lost_node.py -n 3 --ray-defaults # Ray's default health check (3 s x 5)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.daemon import Daemon  # noqa: E402
from argus.store.store import Store  # noqa: E402
from argus.wiring import build_incidents, build_pipeline  # noqa: E402
from core.logging import setup_logging  # noqa: E402
from core.settings import load_settings  # noqa: E402
from stage.localstack.process import REGISTRY, install_exit_handlers  # noqa: E402
from stage.localstack.ray_cluster import RayCluster  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--runs", type=int, default=5)
    parser.add_argument("--poll", type=float, default=1.0, help="Argus poll interval, seconds")
    parser.add_argument("--ray-defaults", action="store_true", help="Ray's default health check (3 s x 5)")
    args = parser.parse_args()
    setup_logging("ERROR")
    install_exit_handlers()
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="argus-bench-"))
    rows: list[tuple[float, float]] = []
    try:
        cluster = RayCluster(work / "ray", fast_health_check=not args.ray_defaults)
        REGISTRY.add(cluster)
        with console.status("starting a Ray head and two workers"):
            cluster.start()
        settings = load_settings(data_dir=work / "argus", ray_dashboard_url=cluster.dashboard_url,
                                 poll_interval_s=args.poll)
        store = Store(settings.effective_database_url)
        daemon = Daemon(build_pipeline(settings, build_incidents(settings, store)), interval_s=args.poll)
        daemon.start()
        with Progress(console=console) as progress:
            task = progress.add_task("kill, detect, restart", total=args.runs)
            for run in range(args.runs):
                if run:
                    cluster.restart_worker(1)
                node_id = cluster.worker(1).node_id
                time.sleep(2 * args.poll)  # let Argus see the node ALIVE first, as in production
                killed = cluster.kill_worker(1)
                deadline = time.monotonic() + 120
                incident = None
                while incident is None and time.monotonic() < deadline:
                    found = store.list_incidents(subject_id=node_id, limit=1)
                    incident = found[0] if found else None
                    time.sleep(0.05)
                if incident is None:
                    console.print(f"[red]run {run + 1}: no incident within 120 s[/]")
                    continue
                rows.append((incident.first_seen.timestamp() - killed, incident.detected_at.timestamp() - killed))
                progress.advance(task)
        daemon.stop()
        store.close()
    finally:
        REGISTRY.stop_all()
    table = Table(title=f"lost node: seconds from SIGKILL of the raylet (poll {args.poll}s, "
                  f"{'Ray default' if args.ray_defaults else 'tuned 500 ms x 3'} health check)")
    table.add_column("run")
    table.add_column("Ray DEAD verdict", justify="right")
    table.add_column("Argus incident", justify="right")
    for i, (dead, detected) in enumerate(rows, 1):
        table.add_row(str(i), f"{dead:.2f}", f"{detected:.2f}")
    if rows:
        dead_s, det_s = [r[0] for r in rows], [r[1] for r in rows]
        table.add_row("median", f"{statistics.median(dead_s):.2f}", f"{statistics.median(det_s):.2f}")
        table.add_row("max", f"{max(dead_s):.2f}", f"{max(det_s):.2f}")
    console.print(table)
    return 0 if len(rows) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
