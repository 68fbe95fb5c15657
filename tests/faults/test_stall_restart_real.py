"""A restart during a hang: Argus is torn down while a real job hangs and started again from the same SQLite file,
and the new Argus finds the hang within the usual threshold of the job's last step, as the same incident.

Real: the Ray cluster (session fixture), a 2-rank torch.distributed gloo job submitted through the Jobs API whose
rank 1 stops after step 12 (stage/localstack/jobs/gloo_steps.py: rank 0 then blocks in all_reduce), Ray's job
states through RayStateCollector, the driver log file on disk, and Argus's loop as `argus serve` builds it
(argus.wiring.build_pipeline from Settings: every detector, the store's detector state as their memory) over a
SQLite store. A restart is a new Store, desk, pipeline and detectors on the same database file.
Stood in for: the cluster-wide log collector. The driver log is tailed here (tests/faults/test_stall_real.py's
DriverLogTail); across the restart the tail carries on where it stopped, as the log collectors do from their
saved offsets (collectors/offsets.py). The stall floor is 8 s instead of 60 s so the test is short.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline, TickResult
from argus.store.store import Store
from argus.wiring import build_pipeline
from collectors.ray_state import RayStateCollector
from core.settings import Settings, load_settings
from core.types import Category, Finding, Signal, utcnow
from stage.localstack.ray_cluster import RayCluster
from tests.faults.test_stall_real import GLOO_TIMEOUT_S, DriverLogTail, stop, submit

pytest.importorskip("torch", reason="the stall test needs torch==2.13.0 (CPU build): pip install -e .[dev]")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

STALL_MIN_S = 8.0  # the job steps every ~0.5 s, so its threshold is this floor: max(8 s, 3 x 0.5 s)
POLL_S = 0.5


class DriverLogCollector:
    """The tailed driver log as a collector, named like the job-log collector the stall detector needs."""

    name = "job_logs"

    def __init__(self, tail: DriverLogTail) -> None:
        self.tail = tail

    def collect(self) -> list[Signal]:
        return self.tail.poll()


class Argus:
    """One run of Argus's loop on the store at `settings.data_dir`; close() is its end (a crash or a restart)."""

    def __init__(self, settings: Settings, cluster: RayCluster, tail: DriverLogTail, submission_id: str) -> None:
        self.store = Store(settings.effective_database_url)
        self.submission_id = submission_id
        self.pipeline: Pipeline = build_pipeline(
            settings, IncidentDesk(self.store),
            collectors=[RayStateCollector(cluster.dashboard_url, timeout_s=10), DriverLogCollector(tail)],
            memory=self.store.detector_state,
        )

    def tick(self) -> tuple[TickResult, list[Finding]]:
        result = self.pipeline.run_once()
        hangs = [f for f in result.findings
                 if f.category is Category.NCCL_HANG and f.subject.id == self.submission_id]
        return result, hangs

    def close(self) -> None:
        self.store.close()


def until_hang(argus: Argus, timeout: float) -> tuple[TickResult, Finding]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result, hangs = argus.tick()
        if hangs:
            return result, hangs[0]
        time.sleep(POLL_S)
    raise AssertionError(f"no stall finding for {argus.submission_id} within {timeout:.0f} s")


def test_a_restart_during_a_hang_reports_it_within_the_threshold_as_the_same_incident(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-shared-root",
                             ray_dashboard_url=ray_cluster.dashboard_url, stall_min_s=STALL_MIN_S, stall_factor=3)
    client, sid = submit(ray_cluster, "--steps", "100000", "--stall-after", "12", "--interval-start", "0.5",
                         "--interval-end", "0.5", "--timeout", str(GLOO_TIMEOUT_S))
    tail = DriverLogTail(ray_cluster, sid)
    argus = Argus(settings, ray_cluster, tail, sid)
    try:
        # Argus watches the job step; it goes down 4 s after the last step, before the 8 s threshold.
        deadline = time.monotonic() + 180
        last_step_seen: datetime | None = None
        while last_step_seen is None or utcnow() - last_step_seen < timedelta(seconds=4):
            assert time.monotonic() < deadline, "no step 12 line; driver log tail:\n" + "\n".join(tail.lines[-15:])
            _, hangs = argus.tick()
            assert hangs == []
            if last_step_seen is None and any(line.endswith("step 12 loss=0.0833") for line in tail.lines):
                last_step_seen = utcnow()
            time.sleep(POLL_S)
        assert sid in argus.store.detector_state.load_all("stall")
        argus.close()
        restarted_at = utcnow()

        argus = Argus(settings, ray_cluster, tail, sid)
        result, finding = until_hang(argus, 30)
        last_progress = datetime.fromisoformat(finding.attrs["last_progress_at"])
        assert finding.attrs["last_progress_line"].endswith("step 12 loss=0.0833")
        assert last_progress <= last_step_seen < restarted_at - timedelta(seconds=3.5)
        assert finding.attrs["threshold_s"] == STALL_MIN_S
        # within the threshold of the real last step (plus a poll and the tick's own time), where a detector
        # counting from the restart could not have fired before restarted_at + 8 s
        assert finding.detected_at - last_progress <= timedelta(seconds=STALL_MIN_S + 2.5)
        assert finding.detected_at < restarted_at + timedelta(seconds=STALL_MIN_S)
        # the session's cluster has other tests' history (dead nodes, failed jobs): only this job's incidents count
        [incident] = [i for i in result.opened if i.subject.id == sid]
        assert incident.fingerprint == finding.fingerprint and incident.category is Category.NCCL_HANG
        argus.close()

        # Restarted again while the stall is open: the first tick finds it and files it under the same incident.
        argus = Argus(settings, ray_cluster, tail, sid)
        result, again = argus.tick()
        assert [f.fingerprint for f in again] == [finding.fingerprint]
        assert [i for i in result.opened if i.subject.id == sid] == []
        [still] = argus.store.list_incidents(category=Category.NCCL_HANG, subject_id=sid)
        assert still.id == incident.id and still.occurrences >= 2 and still.state.value == "open"
        print(f"stall found {(finding.detected_at - last_progress).total_seconds():.1f} s after the last step, "
              f"{(finding.detected_at - restarted_at).total_seconds():.1f} s after the restart")
    finally:
        stop(client, sid)
        try:
            argus.tick()  # the job left RUNNING: the stall detector forgets it, in the store too
            assert sid not in argus.store.detector_state.load_all("stall")
        finally:
            argus.close()
