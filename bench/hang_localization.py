"""Injected hangs on a real local Ray cluster: does Argus call each one, how soon, and does it name the right rank?

Brings up a Ray head and two workers on loopback (dashboard profiling on, py-spy beside Ray) and Argus's full loop
(`build_pipeline`: the Ray log collector, the stall detector with its production thresholds, the stack sampler),
polling every --poll seconds. Then, --rounds times, one real gloo job per fault at once (stage/localstack/jobs/
gloo_steps.py, --world alternating 4 and 2 by round), each with one rank going wrong after --stall-after steps:
- sleep: the rank sleeps in its training step (a dataloader or a dead GPU would look alike);
- stop: SIGSTOP (state T);
- spin: a busy Python loop outside the collective;
- lock: blocked on a lock no one releases.
The fault rank is a different rank each round. For each job it waits for the nccl_hang incident and reads its
finding: the rank the finding names (pid and node, from the stacks) against the ranks the job itself reports
(--ranks-file), how it was confirmed (stacks or silence), and the time from the job's last step line (ts= stamped
by the job) to the incident. Goals: every hang named right, confirmed at most 30 s after the last step (p95).

    .venv/bin/python bench/hang_localization.py --rounds 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.daemon import Daemon  # noqa: E402
from argus.store.store import Store  # noqa: E402
from argus.wiring import build_incidents, build_pipeline  # noqa: E402
from core.logging import setup_logging  # noqa: E402
from core.settings import load_settings  # noqa: E402
from core.types import Category  # noqa: E402
from stage.localstack.jobs import JOBS_DIR  # noqa: E402
from stage.localstack.process import REGISTRY, install_exit_handlers  # noqa: E402
from stage.localstack.ray_cluster import RayCluster  # noqa: E402

FAULTS = ("sleep", "stop", "spin", "lock")
GOAL_S = 30.0


@dataclass
class Hang:
    round: int
    fault: str
    world: int
    rank: int
    sid: str
    ranks_file: str
    named: bool = False
    named_rank: str = ""
    confirmed_by: str = ""
    latency_s: float | None = None
    why: str = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--poll", type=float, default=2.0, help="Argus's loop interval, seconds (production: 2-10)")
    parser.add_argument("--stall-after", type=int, default=12, help="steps before the fault")
    parser.add_argument("--interval", type=float, default=0.5, help="the jobs' step interval, seconds")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON: the summary")
    args = parser.parse_args()
    setup_logging("ERROR")
    install_exit_handlers()
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="argus-hangs-"))
    hangs: list[Hang] = []
    try:
        with console.status("starting Ray (head + 2 workers) with dashboard profiling"):
            cluster = RayCluster(work / "ray", head_env={"RAY_DASHBOARD_ENABLE_PROFILING": "1"})
            REGISTRY.add(cluster)
            cluster.start()
        settings = load_settings(data_dir=work / "argus", ray_dashboard_url=cluster.dashboard_url,
                                 poll_interval_s=args.poll, shared_root=work / "shared",
                                 prometheus_url=None)  # hangs need no Prometheus
        store = Store(settings.effective_database_url)
        daemon = Daemon(build_pipeline(settings, build_incidents(settings, store)), interval_s=args.poll)
        daemon.start()
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(cluster.dashboard_url)
        for n in range(1, args.rounds + 1):
            world = 4 if n % 2 else 2
            round_hangs = [_submit(client, work, n, fault, world, (n + i) % world, args)
                           for i, fault in enumerate(FAULTS)]
            with console.status(f"round {n}/{args.rounds}: {len(FAULTS)} jobs of {world} ranks, one rank at fault "
                                "in each; waiting for Argus's incidents"):
                for hang in round_hangs:
                    _judge(store, hang, timeout=240)
            for hang in round_hangs:
                _stop(client, hang)
                console.print(f"  {hang.fault:5} world {hang.world} rank {hang.rank}: "
                              f"{'named' if hang.named else 'NOT named'} ({hang.why}); by {hang.confirmed_by or '-'}"
                              f", {hang.latency_s if hang.latency_s is not None else '-'} s after the last step")
            hangs += round_hangs
        daemon.stop()
        store.close()
    finally:
        REGISTRY.stop_all()
    summary = _summary(hangs)
    table = Table(title=f"injected hangs ({args.rounds} rounds, Argus polling every {args.poll:g} s)")
    for col in ("fault", "hangs", "named right", "by stacks", "median s", "max s"):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for fault in FAULTS:
        rows = [h for h in hangs if h.fault == fault]
        lat = sorted(h.latency_s for h in rows if h.latency_s is not None)
        table.add_row(fault, str(len(rows)), str(sum(h.named for h in rows)),
                      str(sum(h.confirmed_by == "stacks" for h in rows)),
                      f"{statistics.median(lat):.1f}" if lat else "-", f"{max(lat):.1f}" if lat else "-")
    console.print(table)
    console.print(f"named the right rank: {summary['named']}/{summary['hangs']}; confirmed after the last step: "
                  f"p95 {summary['p95_s']} s (goal {GOAL_S:g} s), median {summary['median_s']} s")
    if args.json:
        print(json.dumps({**summary, "hangs": [asdict(h) for h in hangs]}))
    return 0 if summary["named"] == summary["hangs"] else 1


def _submit(client: Any, work: Path, n: int, fault: str, world: int, rank: int, args: argparse.Namespace) -> Hang:
    sid = f"hang-{fault}-{n}-{uuid.uuid4().hex[:6]}"
    ranks_file = work / f"{sid}-ranks.json"
    command = [sys.executable, str(JOBS_DIR / "gloo_steps.py"), "--world", str(world), "--fault", fault,
               "--fault-rank", str(rank), "--stall-after", str(args.stall_after), "--steps", "100000",
               "--interval-start", str(args.interval), "--interval-end", str(args.interval), "--timeout", "900",
               "--stamp", "--ranks-file", str(ranks_file)]
    client.submit_job(entrypoint=" ".join(command), submission_id=sid, metadata={"bench": "hang_localization"})
    return Hang(n, fault, world, rank, sid, str(ranks_file))


def _judge(store: Store, hang: Hang, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        incident = next((i for i in store.list_incidents(category=Category.NCCL_HANG, limit=200)
                         if i.subject.id == hang.sid), None)
        if incident is not None:
            break
        time.sleep(0.5)
    else:
        hang.why = f"no nccl_hang incident within {timeout:.0f} s"
        return
    findings = [f for f in store.findings_for(incident.id) if f.category is Category.NCCL_HANG]
    finding = min(findings, key=lambda f: f.first_seen)
    hang.confirmed_by = str(finding.attrs.get("confirmed_by") or "")
    stamps = [float(word[3:]) for word in str(finding.attrs.get("last_progress_line") or "").split()
              if word.startswith("ts=")]
    if stamps:
        hang.latency_s = round(incident.detected_at.timestamp() - stamps[-1], 1)
    ranks = json.loads(Path(hang.ranks_file).read_text())["ranks"]
    at_fault = ranks[hang.rank]
    culprits = (finding.attrs.get("localization") or {}).get("culprits") or []
    hang.named_rank = "; ".join(f"pid {c.get('pid')} node {c.get('node')}" for c in culprits)
    hang.named = [(c.get("pid"), c.get("node")) for c in culprits] == [(at_fault["pid"], at_fault["node"])]
    hang.why = (f"named pid {at_fault['pid']} on {at_fault['node']}" if hang.named
                else f"rank {hang.rank} is pid {at_fault['pid']} on {at_fault['node']}, the finding named "
                     f"[{hang.named_rank or 'no rank'}]")


def _stop(client: Any, hang: Hang) -> None:
    import signal

    import psutil

    if hang.fault == "stop":  # a stopped rank ignores SIGTERM until it runs again
        try:
            pid = json.loads(Path(hang.ranks_file).read_text())["ranks"][hang.rank]["pid"]
            psutil.Process(pid).send_signal(signal.SIGCONT)
        except (OSError, psutil.Error, KeyError, IndexError, ValueError):
            pass
    try:
        client.stop_job(hang.sid)
    except Exception:  # noqa: BLE001 - an ended job needs no stop
        pass


def _summary(hangs: list[Hang]) -> dict[str, Any]:
    lat = sorted(h.latency_s for h in hangs if h.latency_s is not None)
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))] if lat else None
    return {"hangs": len(hangs), "named": sum(h.named for h in hangs),
            "called": sum(h.confirmed_by != "" for h in hangs),
            "by_stacks": sum(h.confirmed_by == "stacks" for h in hangs),
            "median_s": round(statistics.median(lat), 1) if lat else None, "p95_s": p95,
            "within_goal": sum(1 for x in lat if x <= GOAL_S)}


if __name__ == "__main__":
    sys.exit(main())
