"""A real host OOM: a task on a Ray worker allocates memory past the worker's lowered memory threshold,
Ray's OOM killer kills it, the job fails, and Argus classifies the failure as host_oom.

Real: a Ray cluster of its own (head + 1 worker on loopback addresses of its own), Ray's memory monitor
and OOM killer, the host memory the task allocates (at most 1.5 GiB and at most a quarter of what is
available: the machine is shared), the job through the Jobs API, RayStateCollector reading the failed
job's message, the log rule engine and JobFailureDetector.
Simulated: only the threshold. It is set just above this host's current memory use (read with psutil,
as Ray reads /proc/meminfo) instead of Ray's 0.95, so a small allocation crosses it. It is set on the
worker only: every node sees the whole host's memory, and a low threshold on the head would kill the
job's supervisor instead. The rule is a small file written here so the test does not depend on how the
shipped host_oom rules are worded.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from collectors.ray_state import RayStateCollector
from core.types import Category, SignalKind
from detectors.engine import RuleSet
from detectors.job_failure import JobFailureDetector
from stage.localstack.jobs import JOBS_DIR
from stage.localstack.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

SCRIPT = JOBS_DIR / "host_oom.py"
GIB = 1 << 30
MAX_BUDGET = int(1.5 * GIB)
HEADROOM = 512 << 20  # the threshold sits this far above current use; the task needs to add about this much

RULES = r"""
source: [job-logs, driver]
rules:
  - reason: FixtureRayOomKilled
    category: host_oom
    type: permanent
    priority: 90
    description: Ray's memory monitor killed a task because the node was running low on memory.
    pattern: 'ray\.exceptions\.OutOfMemoryError|killed due to the node running low on memory'
    action: Reduce host memory use per node and resume from the last checkpoint.
  # Ray 2.60's OOM error lists every process on the host between its header and its advice; JobInfo keeps
  # only the last 20,000 characters, so on a busy host the header is cut away and only the advice remains.
  - reason: FixtureRayOomAdvice
    category: host_oom
    type: permanent
    priority: 89
    description: Ray's advice after an OOM kill (the error's header was cut from the job message).
    pattern: 'how to address the out of memory issue|To adjust the kill threshold, set the environment variable'
    action: Reduce host memory use per node and resume from the last checkpoint.
"""


def test_ray_oom_killer_is_a_host_oom_finding(tmp_workdir: Path) -> None:
    rules_file = tmp_workdir / "rules.yaml"
    rules_file.write_text(RULES)
    rules = RuleSet.load([rules_file])

    # Addresses of its own, so it never meets the session cluster's nodes on 127.0.0.2-4.
    net = random.randint(100, 250)
    cluster = RayCluster(
        tmp_workdir / "ray",
        head_ip=f"127.0.{net}.2",
        worker_ips=(f"127.0.{net}.3",),
        worker_env={"RAY_memory_monitor_refresh_ms": "100"},
    )
    try:
        cluster.start(timeout=180)
        # Measured with the cluster up, then the worker restarted with the threshold: the cluster's own
        # memory is already in the figure.
        mem = psutil.virtual_memory()
        budget = min(MAX_BUDGET, mem.available // 4)
        if budget < HEADROOM + (256 << 20):
            pytest.skip(f"only {mem.available / GIB:.1f} GiB available: too little to fault safely")
        threshold = min(0.99, (mem.total - mem.available + HEADROOM) / mem.total)
        cluster.worker_env["RAY_memory_usage_threshold"] = f"{threshold:.4f}"
        cluster.restart_worker(1, timeout=120)

        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(cluster.dashboard_url)
        sid = f"argus-oom-{uuid.uuid4().hex[:8]}"
        client.submit_job(
            entrypoint=f"{sys.executable} {SCRIPT} --budget-mib {budget >> 20}",
            submission_id=sid,
        )
        deadline = time.monotonic() + 180
        while str(client.get_job_status(sid).value) not in {"SUCCEEDED", "FAILED", "STOPPED"}:
            assert time.monotonic() < deadline, f"job {sid} did not end: {client.get_job_logs(sid)[-2000:]}"
            time.sleep(0.5)

        signals = RayStateCollector(cluster.dashboard_url, timeout_s=10).collect()
        [state] = [s for s in signals if s.kind is SignalKind.JOB_STATE and s.subject.id == sid]
        assert state.attrs["status"] == "FAILED", client.get_job_logs(sid)[-2000:]
        assert "out of memory" in (state.text or "").lower(), state.text

        detector = JobFailureDetector(rules)
        [finding] = [f for f in detector.detect(signals) if f.subject.id == sid]
        assert finding.category is Category.HOST_OOM
        assert finding.reason in {"FixtureRayOomKilled", "FixtureRayOomAdvice"}
        first = finding.evidence[0]
        assert first.source.endswith(f"{sid}/message") and first.line is not None
        assert any(p in first.text for p in ("OutOfMemoryError", "running low on memory", "out of memory issue"))
        assert finding.attrs["submission_id"] == sid
        # Once per job.
        assert detector.detect(signals) == []
    finally:
        cluster.stop()
