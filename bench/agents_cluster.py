"""Node agents on a real local Ray cluster of many workers: line to finding on every node, and kernel-log lines.

Brings up a Ray head and --workers workers on loopback addresses (127.0.1.x, apart from the test session's), the real
central (the app `argus serve` runs, with a node-agent inbox, under uvicorn) and its fleet supervisor, which submits
the fleet job through the Jobs API; waits until an agent answers from every node. Then --rounds times, on every node
at once, appends a host OOM kill to the node's raylet.out and a kernel line (an Xid 79 in even rounds, a fatal PCIe
AER error in odd ones) to the node's own kernel log file (`node_agent_kernel_log` with {node_ip}: a file this bench
controls, since /dev/kmsg is one for all the loopback nodes), and times each line from its write to the finding the
log rules make of it on the central (the Ray log collector's `from_agents` and the LogRuleDetector, every --tick
seconds). Prints p50/p95/max per kind and the findings' categories. Goal (issue 17): p95 <= 5 s.

    .venv/bin/python bench/agents_cluster.py --workers 8 --rounds 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray.job_submission import JobSubmissionClient  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from argus.agents.fleet import FleetSupervisor  # noqa: E402
from argus.agents.inbox import AgentInbox  # noqa: E402
from argus.store.store import Store  # noqa: E402
from collectors.offsets import OffsetStore  # noqa: E402
from collectors.ray_logs import RayLogsCollector  # noqa: E402
from core.logging import setup_logging  # noqa: E402
from detectors.engine import load_rules  # noqa: E402
from detectors.log_rules import LogRuleDetector  # noqa: E402
from stage.localstack.central import Central  # noqa: E402
from stage.localstack.process import install_exit_handlers  # noqa: E402
from stage.localstack.ray_cluster import RayCluster  # noqa: E402

KERNEL = {0: "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
          1: "pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0"}
KIND_OF = {"host_oom": "raylet", "gpu_hardware": "kernel"}  # what each line becomes


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tick", type=float, default=1.0, help="the central's poll interval")
    parser.add_argument("--interval", type=float, default=1.0, help="each agent's read-and-send interval")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    setup_logging("WARNING")
    install_exit_handlers()
    console = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="argus-agents-"))
    ips = tuple(f"127.0.1.{i}" for i in range(2, 2 + args.workers))
    cluster = RayCluster(work / "ray", head_ip="127.0.1.1", worker_ips=ips, fast_health_check=True)
    kernel_dir = work / "kernel"
    store = Store(f"sqlite:///{work / 'argus.db'}")
    _, token = store.create_token("node-agents", "node_agent", created_by="bench")
    inbox = AgentInbox(stale_after_s=15)
    central = Central(store, inbox)
    supervisor: FleetSupervisor | None = None
    figures: dict[str, Any] = {}
    try:
        with console.status(f"starting a Ray head and {args.workers} workers"):
            cluster.start(timeout=300)
        nodes = [cluster.head, *cluster.workers]
        for node in nodes:
            (kernel_dir / node.ip).mkdir(parents=True)
            (kernel_dir / node.ip / "kern.log").write_text("")
        central.start()
        client = JobSubmissionClient(cluster.dashboard_url)
        supervisor = FleetSupervisor(lambda: client, central_url=central.url, token=token, inbox=inbox,
                                     interval_s=args.interval, kernel_log=str(kernel_dir / "{node_ip}" / "kern.log"),
                                     reconcile_s=2.0)
        began = time.monotonic()
        supervisor.ensure()
        ids = {n.raylet_node_id(): n for n in nodes}
        with console.status("waiting for an agent on every node"):
            while not set(ids) <= inbox.covered():
                if time.monotonic() - began > 300:
                    raise SystemExit(f"agents answered from {len(inbox.covered())} of {len(ids)} nodes in 300 s")
                time.sleep(0.5)
        figures["agents_up_s"] = round(time.monotonic() - began, 1)
        collector = RayLogsCollector(cluster.dashboard_url, OffsetStore(work / "offsets.json"))
        latencies: dict[str, list[float]] = {"raylet": [], "kernel": []}
        categories: dict[str, int] = {}
        for r in range(args.rounds):
            detector = LogRuleDetector(load_rules())  # a fresh one: each round's findings are new
            inbox.take()
            written: dict[tuple[str, str], float] = {}
            for node in nodes:
                log_dir = node.log_dir()
                assert log_dir is not None
                with (log_dir / "raylet.out").open("a") as f:
                    f.write(f"[E] Out of memory: Killed process {4000 + r} (python) round={r}\n")
                written[(node.raylet_node_id() or "", "raylet")] = time.monotonic()
                with (kernel_dir / node.ip / "kern.log").open("a") as f:
                    f.write(f"[{time.ctime()}] {KERNEL[r % 2]}\n")
                written[(node.raylet_node_id() or "", "kernel")] = time.monotonic()
            deadline = time.monotonic() + 60
            while written and time.monotonic() < deadline:
                time.sleep(args.tick)
                signals = collector.from_agents(inbox.take(), datetime.now(timezone.utc))
                now = time.monotonic()
                for finding in detector.detect(signals):
                    kind = KIND_OF.get(finding.category.value, "other")
                    key = (finding.subject.id, kind)
                    if key in written:
                        latencies[kind].append(now - written.pop(key))
                        categories[f"{kind}:{finding.category.value}"] = (
                            categories.get(f"{kind}:{finding.category.value}", 0) + 1)
            figures.setdefault("missed", 0)
            figures["missed"] += len(written)
        for kind, values in latencies.items():
            if values:
                figures[kind] = {"n": len(values), "p50_s": round(statistics.median(values), 2),
                                 "p95_s": round(pct(values, 0.95), 2), "max_s": round(max(values), 2)}
        figures["categories"] = categories
        figures["nodes"] = len(nodes)
    finally:
        if supervisor is not None:
            supervisor.stop()
        central.stop()
        store.close()
        cluster.stop()
    table = Table(title=f"node agents on a Ray cluster of {figures.get('nodes')} nodes: write to finding")
    for col in ("line", "n", "p50 s", "p95 s", "max s"):
        table.add_column(col)
    for kind in ("raylet", "kernel"):
        f = figures.get(kind)
        if f:
            table.add_row(kind, str(f["n"]), str(f["p50_s"]), str(f["p95_s"]), str(f["max_s"]))
    console.print(table)
    console.print(f"agents up on every node after {figures.get('agents_up_s')} s; missed {figures.get('missed')}; "
                  f"categories {figures.get('categories')}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
