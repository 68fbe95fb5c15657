"""Fault-to-finding latency on a real local Ray cluster, every fault class the loop detects live.

Brings up a Ray head and two workers (each advertising 4 GPUs; there are no real GPUs), Prometheus
scraping Ray and a DCGM exporter SIMULATOR on worker 1, and Argus's full loop (`build_pipeline`, polling
every --poll seconds). Then, --runs times:
- gpu_oom: a job's driver prints a CUDA OOM traceback line (text printed by the job, no GPU) at a time it
  announces; latency = incident - that time. Budget 30 s.
- nccl_hang: a real 2-rank gloo job (stage/localstack/jobs/gloo_steps.py) prints `step N ... ts=<time>` every
  0.5 s until one rank stops taking part (it sleeps in its step) and the other waits in all_reduce; latency =
  incident - last step. The stall detector runs with its production thresholds: a silence of max(20 s, 3 x step)
  is a suspicion that the ranks' stacks, sampled twice 3 s apart, confirm. Budget 30 s.
- idle_gpu: a job holds worker 1's 4 GPUs while the simulator reports them busy, then 0% from a known
  time; latency = incident - that time. Budget window + 30 s (--idle-window, default 60 s; production 600 s).
- node_lost: SIGKILL of worker 1's raylet; latency = incident - kill, next to Ray's own DEAD verdict.
  Budget Ray's verdict + 10 s. The head's health check is tuned (500 ms x 3) as in the demo.
Prints median and p95 per fault and whether each run met its budget.

    .venv/bin/python bench/detection_latency.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

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
from stage.localstack.prometheus import Prometheus  # noqa: E402
from stage.localstack.ray_cluster import RayCluster  # noqa: E402
from stage.sim.dcgm_exporter import DcgmExporterSim  # noqa: E402

OOM_JOB = textwrap.dedent('''
    import sys, time
    at = float(sys.argv[1])
    print("loading model", flush=True)
    time.sleep(max(0.0, at - time.time()))
    print("Traceback (most recent call last):", flush=True)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
          "capacity of 79.11 GiB of which 1.06 GiB is free.", flush=True)
    sys.exit(1)
''')
IDLE_JOB = textwrap.dedent('''
    import time, ray
    ray.init()

    @ray.remote(num_gpus=4, num_cpus=0, resources={"worker1": 0.1})
    class Holder:
        def ready(self):
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote())
    print("holding 4 GPUs", flush=True)
    time.sleep(3600)
''')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--idle-window", type=float, default=60.0)
    args = parser.parse_args()
    setup_logging("ERROR")
    install_exit_handlers()
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="argus-latency-"))
    results: dict[str, list[tuple[float, float]]] = {}  # fault -> [(latency, budget)]
    ray_verdicts: list[float] = []
    try:
        with console.status("starting Ray (head + 2 workers), a DCGM simulator and Prometheus"):
            cluster = RayCluster(work / "ray", fast_health_check=True, worker_gpus=4,
                                 head_env={"RAY_DASHBOARD_ENABLE_PROFILING": "1"})  # the stacks that confirm hangs
            REGISTRY.add(cluster)
            cluster.start()
            sim = DcgmExporterSim("gpu-node-1", gpus=4, host=cluster.worker(1).ip).start()
            REGISTRY.add(sim)
            sim.set_all(util=90)
            prometheus = Prometheus(work / "prometheus", ray_sd_file=cluster.sd_file,
                                    static_targets={"dcgm": [f"{sim.host}:{sim.port}"]})
            REGISTRY.add(prometheus)
            prometheus.start()
        settings = load_settings(data_dir=work / "argus", ray_dashboard_url=cluster.dashboard_url,
                                 prometheus_url=prometheus.url, poll_interval_s=args.poll,
                                 idle_gpu_window_s=args.idle_window, shared_root=work / "shared")
        store = Store(settings.effective_database_url)
        daemon = Daemon(build_pipeline(settings, build_incidents(settings, store)), interval_s=args.poll)
        daemon.start()
        scripts = work / "jobs"
        scripts.mkdir()
        for name, text in (("oom", OOM_JOB), ("idle", IDLE_JOB)):
            (scripts / f"{name}.py").write_text(text)
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(cluster.dashboard_url)
        for run in range(1, args.runs + 1):
            console.print(f"[bold]round {run}/{args.runs}[/]: gpu_oom, nccl_hang and idle_gpu at once")
            threads = [
                threading.Thread(target=_oom, args=(client, scripts, store, run, results)),
                threading.Thread(target=_stall, args=(client, scripts, store, run, results)),
                threading.Thread(target=_idle, args=(client, scripts, store, sim, run, args.idle_window, results)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            console.print(f"round {run}: node_lost")
            _lost(cluster, store, results, ray_verdicts)
        daemon.stop()
        store.close()
    finally:
        REGISTRY.stop_all()
    table = Table(title=f"fault to incident, seconds ({args.runs} runs each, Argus polling every {args.poll:g} s)")
    for col in ("fault", "median", "p95", "max", "budget", "runs within budget", "missed"):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for fault, rows in results.items():
        lat = sorted(r[0] for r in rows if r[0] is not None)
        ok = sum(1 for r in rows if r[0] is not None and r[0] <= r[1])
        missed = sum(1 for r in rows if r[0] is None)
        table.add_row(fault, *(f"{x:.1f}" for x in (statistics.median(lat), _p95(lat), max(lat))) if lat else
                      ("-", "-", "-"), f"{statistics.median(r[1] for r in rows):.1f}", f"{ok}/{len(rows)}", str(missed))
    if ray_verdicts:
        table.add_row("(Ray's own DEAD verdict)", f"{statistics.median(ray_verdicts):.1f}",
                      f"{_p95(sorted(ray_verdicts)):.1f}", f"{max(ray_verdicts):.1f}", "", "")
    console.print(table)
    return 0


def _p95(values: list[float]) -> float:
    return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]


def _wait_incident(store, category: Category, subject_or_job: str, timeout: float, since: float):
    """The incident of this fault and when Argus saw it: opened after `since`, or an earlier one (the same node
    lost again) reopened by a finding after `since`; (None, None) when none came within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for incident in store.list_incidents(category=category, limit=200):
            if incident.subject.id != subject_or_job and subject_or_job not in str(incident.attrs):
                continue
            if incident.detected_at.timestamp() >= since:
                return incident, incident.detected_at.timestamp()
            later = [f.detected_at.timestamp() for f in store.findings_for(incident.id)
                     if f.detected_at.timestamp() >= since]
            if later:
                return incident, min(later)
        time.sleep(0.2)
    return None, None


def _record(results, fault, latency, budget) -> None:
    """One run of a fault: its latency, or None when Argus opened no incident for it (a miss, counted)."""
    results.setdefault(fault, []).append((latency, budget))


def _oom(client, scripts, store, run, results) -> None:
    at = time.time() + 10
    sid = client.submit_job(entrypoint=f"{sys.executable} {scripts / 'oom.py'} {at}",
                            submission_id=f"oom-{run}-{int(at)}", entrypoint_resources={"worker2": 0.1})
    incident, seen = _wait_incident(store, Category.GPU_OOM, sid, timeout=120, since=at - 60)
    _record(results, "gpu_oom", seen - at if seen is not None else None, 30.0)


def _stall(client, scripts, store, run, results) -> None:
    command = [sys.executable, str(JOBS_DIR / "gloo_steps.py"), "--world", "2", "--fault", "sleep", "--fault-rank",
               "1", "--stall-after", "12", "--steps", "100000", "--interval-start", "0.5", "--interval-end", "0.5",
               "--timeout", "900", "--stamp"]
    sid = client.submit_job(entrypoint=" ".join(command), submission_id=f"stall-{run}-{int(time.time())}",
                            entrypoint_resources={"worker2": 0.1})
    incident, seen = _wait_incident(store, Category.NCCL_HANG, sid, timeout=240, since=time.time() - 600)
    stamps = [float(t.split("ts=")[1].split()[0]) for f in (store.findings_for(incident.id) if incident else [])
              for e in f.evidence for t in [e.text] if "ts=" in t]
    _record(results, "nccl_hang", seen - max(stamps) if seen is not None and stamps else None, 30.0)
    if seen is None:  # say why, so a miss can be told from a job that never got to train
        tail = client.get_job_logs(sid).splitlines()[-3:]
        print(f"nccl_hang run {run}: no incident for {sid} ({client.get_job_status(sid).value}); its log ends {tail}")
    client.stop_job(sid)


def _idle(client, scripts, store, sim, run, window, results) -> None:
    from ray.util.state import list_actors

    sim.set_all(util=90)
    sid = client.submit_job(entrypoint=f"{sys.executable} {scripts / 'idle.py'}",
                            submission_id=f"idle-{run}-{int(time.time())}", entrypoint_resources={"worker2": 0.1},
                            metadata={"owner": "bench"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list_actors(
            address=client.get_address(), filters=[("class_name", "=", "Holder"), ("state", "=", "ALIVE")]):
        time.sleep(0.5)
    time.sleep(5)  # let Argus see the GPUs held and busy
    idle_from = time.time()
    sim.set_all(util=0)
    incident, seen = _wait_incident(store, Category.IDLE_GPU, sid, timeout=window + 120, since=idle_from)
    _record(results, "idle_gpu", seen - idle_from if seen is not None else None, window + 30)
    client.stop_job(sid)
    sim.set_all(util=90)


def _lost(cluster, store, results, ray_verdicts) -> None:
    node_id = cluster.worker(1).node_id
    time.sleep(3)
    killed = cluster.kill_worker(1)
    incident, seen = _wait_incident(store, Category.NODE_LOST, node_id, timeout=120, since=killed)
    verdict = None
    deadline = time.monotonic() + 60
    while incident and verdict is None and time.monotonic() < deadline:
        verdict = next((f.first_seen for f in store.findings_for(incident.id)
                        if f.reason == "RayNodeDead" and f.first_seen.timestamp() >= killed), None)
        time.sleep(0.2)
    if verdict:
        ray_verdicts.append(verdict.timestamp() - killed)
    _record(results, "node_lost", seen - killed if seen is not None else None,
            (verdict.timestamp() - killed if verdict else 15.0) + 10)
    cluster.restart_worker(1)


if __name__ == "__main__":
    sys.exit(main())
