"""Training health on a real job: a trainer on the session's Ray cluster prints verl's step lines into its job
folder's log (as verl's scripts `tee` them), its steps slow down threefold for a few steps, then its loss turns
NaN (stage/localstack/jobs/metrics_trainer.py: verl's metrics line with real-looking noise). Argus's loop (the
job-log collector, the training-health detector, the exporter) finds the slowdown, then the NaN, and the job's
series are in the session's Prometheus, scraped from Argus's /metrics.

Real: the Ray cluster, the job (submitted through the Jobs API, its steps timed by its own clock), the log file
on disk, JobLogsCollector, Pipeline, ArgusMetrics under uvicorn, Prometheus scraping it. Nothing is simulated.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest

from argus.api.app import create_app
from argus.exporter import ArgusMetrics
from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from control.jobs import JobController
from control.jobspec import JobSpec
from core.types import Category, IncidentState, Severity
from detectors.training_health import TrainingHealthDetector
from stage.localstack.jobs import JOBS_DIR
from tests.helpers import served_app, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.prometheus, pytest.mark.timeout(300)]

ARGS = "--steps 60 --step-s 0.3 --slow-from 26 --slow-steps 4 --slow-factor 3 --nan-at 45 --hold 600"


def test_a_real_job_whose_steps_slow_down_and_loss_turns_nan(ray_cluster, prometheus_stack, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    code = shared / "code"
    code.mkdir(parents=True)
    shutil.copy(JOBS_DIR / "metrics_trainer.py", code / "train.py")
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    jobs = JobController(ray_cluster.dashboard_url, shared, code_roots=[shared])
    metrics = ArgusMetrics()
    detector = TrainingHealthDetector()
    pipeline = Pipeline(collectors=[JobLogsCollector(shared, OffsetStore(tmp_path / "offsets.json"))],
                        detectors=[detector], incidents=IncidentDesk(store),
                        on_tick=lambda _r: metrics.set_train_metrics(detector.series()))
    prometheus = prometheus_stack.prometheus
    sid = jobs.submit(JobSpec(name="train-health", workload="grpo", owner="alice", entrypoint=f"{sys.executable} "
                              f"train.py {ARGS}", code_path=str(code), working_dir=str(code))).submission_id
    try:
        with served_app(create_app(store=store, metrics=metrics)) as url:
            prometheus.set_targets("argus-training", [url.removeprefix("http://")])
            opened: list = []

            def found(reason: str) -> bool:
                opened.extend(pipeline.run_once().opened)
                return any(i.reason == reason for i in opened)

            wait_until("the slowdown finding", lambda: found("StepSlowdown"), timeout=120, interval=0.5)
            slow = next(i for i in opened if i.reason == "StepSlowdown")
            assert slow.category is Category.TRAINING_ANOMALY and slow.severity is Severity.WARNING
            assert "a straggler suspect" in slow.summary and slow.subject.id == sid
            wait_until("the NaN finding", lambda: found("NonFiniteLossOrGradient"), timeout=120, interval=0.5)
            nan = next(i for i in opened if i.reason == "NonFiniteLossOrGradient")
            assert nan.severity is Severity.CRITICAL and "pg_loss is nan at step 45" in nan.summary
            assert {i.reason for i in opened} == {"StepSlowdown", "NonFiniteLossOrGradient"}  # nothing else fired
            wait_until("the slowdown to end", lambda: pipeline.run_once() is not None and store.get_incident(
                slow.id).state is IncidentState.RESOLVED, timeout=60, interval=0.5)

            grad_norm = f'argus_job_train_metric{{submission_id="{sid}",metric="grad_norm"}}'
            prometheus.wait_for_series(grad_norm, timeout=60)
            # The job's grad_norm is NaN from step 45 on and the exporter passes NaN on as it is, so the latest sample
            # is NaN or not depending on when Prometheus last scraped: the samples before the NaN are what to check.
            [history] = prometheus.query(f"{grad_norm}[10m]")
            values = [float(value) for _, value in history["values"]]
            assert any(0.5 < v < 1.5 for v in values), values
            assert all(math.isnan(v) or 0.0 < v < 10.0 for v in values), values
            names = {s["metric"]["metric"] for s in prometheus.wait_for_series(
                f'argus_job_train_metric{{submission_id="{sid}"}}', timeout=30, min_series=5)}
            assert {"pg_loss", "grad_norm", "entropy", "score", "step_time", "response_clip_ratio", "lr",
                    "timing_gen"} <= names
    finally:
        prometheus.set_targets("argus-training", [])
        jobs.stop(sid, reason="test done")
        store.close()
