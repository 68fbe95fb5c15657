"""One detection cycle at the scale of a large cluster: 1,250 nodes x 8 GPUs (10,000 GPUs).

Runs Argus's real collectors' conversion code and every detector, through the real pipeline and a real
SQLite store, on a simulated cluster: Ray's state API and Prometheus are replaced by in-process
stand-ins that return records of the shape the real ones return (generated here, not recorded), so
what is measured is Argus's own work per cycle, not the network. Prints the cycle time (median, max
over the cycles), the time per collector and detector, and the peak RSS of the process.

    .venv/bin/python bench/detect_scale.py                 # 1,250 nodes x 8 GPUs, 5 cycles
    .venv/bin/python bench/detect_scale.py --nodes 250 --cycles 3
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.exporter import ArgusMetrics  # noqa: E402
from argus.store.store import Store  # noqa: E402
from argus.wiring import (  # noqa: E402
    build_detectors,
    build_incidents,
    build_pipeline,
    build_stall_detector,
)
from collectors.metric_rules import MetricRuleCollector  # noqa: E402
from collectors.placement import GpuPlacementCollector, PrometheusGpuCollector  # noqa: E402
from collectors.prometheus import PrometheusTargetsCollector  # noqa: E402
from collectors.ray_state import RayStateCollector  # noqa: E402
from core.logging import setup_logging  # noqa: E402
from core.settings import load_settings  # noqa: E402
from core.types import Signal, SignalKind, Subject, SubjectKind  # noqa: E402
from detectors.metric_rules import load_metric_rules  # noqa: E402

GPUS_PER_NODE = 8


class SimulatedRayState:
    """Stands in for `ray.util.state`: the records a cluster of this size returns, as dicts."""

    def __init__(self, nodes: int, jobs: int, rng: random.Random) -> None:
        self.nodes = [
            {"node_id": f"{i:056x}", "node_ip": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", "state": "ALIVE",
             "is_head_node": i == 0, "node_name": f"gpu-{i:04d}", "resources_total": {"GPU": GPUS_PER_NODE},
             "labels": {}, "state_message": None, "start_time_ms": 1_700_000_000_000, "end_time_ms": 0}
            for i in range(nodes)
        ]
        per_job = max(1, nodes // jobs)
        self.jobs, self.actors = [], []
        for j in range(jobs):
            job_id = f"{j + 2:08x}"
            self.jobs.append({"job_id": job_id, "submission_id": f"raysubmit_{j:06d}", "status": "RUNNING",
                              "entrypoint": "python3 -m verl.trainer.main_ppo", "metadata": {"owner": f"user{j % 40}"},
                              "driver_node_id": self.nodes[0]["node_id"], "start_time": 1_700_000_000_000})
            for n in range(j * per_job, min(nodes, (j + 1) * per_job)):
                for _ in range(GPUS_PER_NODE):
                    self.actors.append({"actor_id": f"{len(self.actors):032x}", "job_id": job_id, "state": "ALIVE",
                                        "node_id": self.nodes[n]["node_id"], "required_resources": {"GPU": 1.0},
                                        "placement_group_id": None})
        rng.shuffle(self.actors)

    def list_nodes(self, **_: Any) -> list[dict]:
        return self.nodes

    def list_jobs(self, **_: Any) -> list[dict]:
        return self.jobs

    def list_actors(self, filters=None, **_: Any) -> list[dict]:
        return self.actors

    def list_placement_groups(self, **_: Any) -> list[dict]:
        return []

    def list_tasks(self, **_: Any) -> list[dict]:
        return []


class SimulatedPrometheus:
    """Stands in for PrometheusClient: instant-query results for 10,000 DCGM GPUs and every target."""

    url = "http://prometheus.sim:9090"

    def __init__(self, ray: SimulatedRayState, rng: random.Random) -> None:
        now = time.time()
        self.util = []
        for node in ray.nodes[1:]:
            for g in range(GPUS_PER_NODE):
                labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": str(g), "UUID": f"GPU-{node['node_id'][:8]}-{g}",
                          "device": f"nvidia{g}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node["node_name"],
                          "instance": f"{node['node_ip']}:9400", "job": "dcgm"}
                self.util.append({"metric": labels, "value": [now, str(rng.choice([0, 0, 35, 97, 100]))]})
        self.up = [{"metric": {"__name__": "up", "job": job, "instance": f"{n['node_ip']}:{port}"}, "value": [now, "1"]}
                   for n in ray.nodes for job, port in (("dcgm", 9400), ("ray", 8080))]

    def query(self, promql: str) -> list[dict]:
        if promql == "DCGM_FI_DEV_GPU_UTIL":
            return self.util
        if promql == "up":
            return self.up
        return []  # the metric rules: a healthy cluster matches none of them


class LogLines:
    """Log lines as the log collectors emit them: every job prints a few step lines per cycle."""

    name = "ray_logs"

    def __init__(self, ray: SimulatedRayState, lines_per_job: int) -> None:
        self.jobs = [j["submission_id"] for j in ray.jobs]
        self.lines_per_job = lines_per_job
        self.step = 0

    def collect(self) -> list[Signal]:
        self.step += 1
        now = datetime.now(timezone.utc)
        out = []
        for sid in self.jobs:
            for k in range(self.lines_per_job):
                line = self.step * self.lines_per_job + k
                out.append(Signal(
                    kind=SignalKind.LOG_LINE, source=f"ray://10.0.0.1/job-driver-{sid}.log",
                    subject=Subject(kind=SubjectKind.JOB, id=sid), observed_at=now - timedelta(milliseconds=k),
                    text=f"(TaskRunner pid=4242) step:{line} - actor/entropy:0.61 - critic/score/mean:0.42 "
                         f"- timing_s/step:{12.5 + k:.2f} - perf/throughput:1523.4",
                    line=line, attrs={"stream": "job-logs", "file": f"job-driver-{sid}.log"}))
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--jobs", type=int, default=125)
    parser.add_argument("--lines-per-job", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    setup_logging("ERROR")
    console = Console()
    rng = random.Random(7)
    ray = SimulatedRayState(args.nodes + 1, args.jobs, rng)  # + the CPU-only head
    prom = SimulatedPrometheus(ray, rng)
    work = Path(tempfile.mkdtemp(prefix="argus-scale-"))
    settings = load_settings(data_dir=work, prometheus_url=prom.url, idle_gpu_window_s=60)
    store = Store(settings.effective_database_url)
    metrics = ArgusMetrics()
    collectors = [
        RayStateCollector("http://ray.sim:8265", state_api=ray),
        GpuPlacementCollector("http://ray.sim:8265", state_api=ray, on_placement=metrics.set_job_gpus),
        LogLines(ray, args.lines_per_job),
        PrometheusTargetsCollector(prom),
        MetricRuleCollector(prom, load_metric_rules()),
        PrometheusGpuCollector(prom),
    ]
    stall = build_stall_detector(settings)
    detectors = build_detectors(settings, load_metric_rules(), stall)
    pipeline = build_pipeline(settings, build_incidents(settings, store, metrics=metrics), metrics=metrics,
                              collectors=collectors, detectors=detectors, stall=stall)

    spent: dict[str, list[float]] = {}
    for c in collectors:  # time each part, wrapping the real objects
        c.collect = _timed(c.collect, spent.setdefault(f"collect {c.name}", []))
    for d in detectors:
        d.detect = _timed(d.detect, spent.setdefault(f"detect {d.name}", []))
    cycles = []
    pipeline.run_once()  # warm-up: imports, first store writes
    for part in spent.values():
        part.clear()
    for _ in track(range(args.cycles), description=f"{args.nodes * GPUS_PER_NODE:,} GPUs, cycle", console=console):
        t0 = time.perf_counter()
        result = pipeline.run_once()
        cycles.append(time.perf_counter() - t0)
        if result.errors:
            console.print(f"[red]errors: {result.errors}[/]")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store.close()

    table = Table(title=f"one detection cycle: {args.nodes:,} nodes x {GPUS_PER_NODE} GPUs, {args.jobs} jobs, "
                        f"{args.jobs * args.lines_per_job:,} log lines")
    table.add_column("part")
    table.add_column("median s", justify="right")
    table.add_column("max s", justify="right")
    for name, times in sorted(spent.items(), key=lambda kv: -statistics.median(kv[1] or [0])):
        if times:
            table.add_row(name, f"{statistics.median(times):.3f}", f"{max(times):.3f}")
    whole = (f"[bold]{statistics.median(cycles):.3f}", f"[bold]{max(cycles):.3f}")
    table.add_row("[bold]whole cycle (goal <= 1 s)", *whole)
    table.add_row("[bold]peak RSS (goal <= 1024 MiB)", f"[bold]{peak_mib:.0f} MiB", "")
    console.print(table)
    return 0


def _timed(fn, sink: list[float]):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            sink.append(time.perf_counter() - t0)
    return wrapper


if __name__ == "__main__":
    sys.exit(main())
