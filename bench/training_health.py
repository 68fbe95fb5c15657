"""No false finding on a healthy run: a GRPO-like trainer (stage/localstack/jobs/metrics_trainer.py: verl's metrics
line with real-looking noise, slower checkpoint and validation steps) runs on a real local Ray cluster for
--minutes, and Argus's whole loop as `argus serve` builds it (build_pipeline: every collector and detector, the
job-log collector reading the job folder's log) ticks every second. Prints the findings the loop made (the goal:
none), the steps the run printed, the series Argus keeps for the job, and the loop's time per tick. With --fault
(nan, slow, collapse) the same run gets that fault halfway, and the finding must come. A figure, not a test.

    .venv/bin/python bench/training_health.py [--minutes 10] [--step-s 1.0] [--fault nan|slow|collapse]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

FAULTS = {"nan": "--nan-at {half}", "slow": "--slow-from {half} --slow-steps 5", "collapse": "--collapse-at {half}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--fault", choices=sorted(FAULTS), default=None)
    args = parser.parse_args()

    from argus.exporter import ArgusMetrics
    from argus.store.store import Store
    from argus.wiring import build_incidents, build_pipeline
    from control.jobs import JobController
    from control.jobspec import JobSpec
    from core.logging import setup_logging
    from core.settings import load_settings
    from stage.localstack.jobs import JOBS_DIR
    from stage.localstack.process import REGISTRY, install_exit_handlers
    from stage.localstack.ray_cluster import RayCluster

    setup_logging("WARNING")
    install_exit_handlers()
    console = Console(width=140)
    work = Path(tempfile.mkdtemp(prefix="ag-train-"))
    shared = work / "shared"
    (shared / "jobs").mkdir(parents=True)
    code = shared / "code"
    code.mkdir()
    shutil.copy(JOBS_DIR / "metrics_trainer.py", code / "train.py")
    cluster = RayCluster(work / "ray", fast_health_check=True, worker_gpus=4)
    REGISTRY.add(cluster)
    steps = int(args.minutes * 60 / args.step_s)
    extra = FAULTS[args.fault].format(half=steps // 2) if args.fault else ""
    ticks: list[float] = []
    findings: list[tuple[str, str]] = []
    try:
        with console.status("starting a Ray head and two workers"):
            cluster.start(timeout=180)
        settings = load_settings(data_dir=work / "data", shared_root=shared, ray_dashboard_url=cluster.dashboard_url,
                                 prometheus_url=None, hang_stacks=False, llm_base_url=None)
        store = Store(settings.effective_database_url)
        metrics = ArgusMetrics()
        pipeline = build_pipeline(settings, build_incidents(settings, store, metrics=metrics), metrics=metrics)
        jobs = JobController(cluster.dashboard_url, shared, code_roots=[shared])
        sid = jobs.submit(JobSpec(name="grpo-healthy", workload="grpo", owner="bench", code_path=str(code),
                                  working_dir=str(code), entrypoint=f"{sys.executable} train.py --steps {steps} "
                                  f"--step-s {args.step_s} {extra}")).submission_id
        deadline = time.monotonic() + args.minutes * 60 + 120
        with Progress(console=console) as progress:
            task = progress.add_task(f"{args.minutes:g} min of {'healthy ' if not args.fault else ''}training, "
                                     "the loop every second", total=steps)
            while time.monotonic() < deadline:
                started = time.monotonic()
                result = pipeline.run_once()
                ticks.append(time.monotonic() - started)
                findings += [(i.reason, i.summary) for i in result.opened]
                log = jobs.folder(sid).root / "logs" / "train.log"
                progress.update(task, completed=sum(1 for _ in log.open("rb")) if log.exists() else 0)
                if jobs.get(sid).ended:
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        series = sorted(metrics_names(metrics, sid))
        status = jobs.get(sid).status
        store.close()
    finally:
        REGISTRY.stop_all()
    table = Table(title=f"training health over a {'healthy ' if not args.fault else args.fault + ' '}run "
                        f"({steps} steps, {args.step_s:g} s a step)")
    for column in ("job status", "incidents opened", "series kept", "ticks", "tick p50 (ms)", "tick p95 (ms)"):
        table.add_column(column, justify="right")
    p95 = sorted(ticks)[int(0.95 * (len(ticks) - 1))] if ticks else 0.0
    table.add_row(status, str(len(findings)), str(len(series)), str(len(ticks)),
                  f"{statistics.median(ticks) * 1000:.0f}" if ticks else "-", f"{p95 * 1000:.0f}")
    console.print(table)
    console.print("series: " + ", ".join(series))
    for reason, summary in findings:
        console.print(f"- {reason}: {summary}", highlight=False)
    return 0


def metrics_names(metrics, sid: str) -> set[str]:  # type: ignore[no-untyped-def]
    text = metrics.render().decode()
    return {line.split('metric="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith("argus_job_train_metric{") and f'submission_id="{sid}"' in line}


if __name__ == "__main__":
    sys.exit(main())
