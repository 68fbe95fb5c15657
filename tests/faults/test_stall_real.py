"""A real hang: a 2-rank torch.distributed gloo job on the real Ray cluster, one rank stops, the other
blocks in all_reduce. Argus must see the stall long before gloo's own collective timeout.

Real: the Ray cluster (session fixture: head + 2 workers on loopback), the job submitted through the Jobs
API, torch 2.13 (CPU) with a gloo process group across the two workers, Ray forwarding rank 0's prints
into the job driver log, the driver log file on disk, and RayStateCollector reading job states.
Simulated: nothing on the fault path. The log is tailed here, line by line, into LOG_LINE signals (the
cluster-wide log collector is not used, so this test does not depend on it), and the detector runs with
min_stall_s=5 instead of 60 so the test is short.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collectors.logs import decode_line
from collectors.ray_state import RayStateCollector
from control.jobs import JobController
from control.local import LocalRunner
from control.nodes import MemoryNodeRegistry
from core.types import Category, Finding, Signal, SignalKind, Subject, SubjectKind, utcnow
from detectors.stall import StallDetector
from remediation.actions import Context, keep_scene
from stage.localstack.jobs import JOBS_DIR
from stage.localstack.ray_cluster import RayCluster
from tests.support import make_incident

pytest.importorskip("torch", reason="the stall test needs torch==2.13.0 (CPU build): pip install -e .[dev]")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

SCRIPT = JOBS_DIR / "gloo_steps.py"
GLOO_TIMEOUT_S = 120  # the job's c10d timeout: the baseline Argus must beat
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


class DriverLogTail:
    """Reads a job's driver log file (job-driver-<id>.log on whichever node runs the driver) as LOG_LINE
    signals, complete lines only, numbered like the file."""

    def __init__(self, cluster: RayCluster, submission_id: str) -> None:
        self.cluster = cluster
        self.submission_id = submission_id
        self.path: Path | None = None
        self.offset = 0
        self.line_no = 0
        self.lines: list[str] = []

    def _find(self) -> Path | None:
        for node in self.cluster.nodes:
            logs = node.log_dir()
            if logs is not None and (logs / f"job-driver-{self.submission_id}.log").exists():
                return logs / f"job-driver-{self.submission_id}.log"
        return None

    def poll(self) -> list[Signal]:
        if self.path is None:
            self.path = self._find()
            if self.path is None:
                return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        now = utcnow()
        signals = []
        for raw in data[: end + 1].splitlines():
            self.line_no += 1
            text = decode_line(raw)  # as the log collector reads it: colour codes gone
            self.lines.append(text)
            signals.append(
                Signal(
                    kind=SignalKind.LOG_LINE,
                    source=str(self.path),
                    subject=Subject(kind=SubjectKind.JOB, id=self.submission_id),
                    observed_at=now,
                    text=text,
                    line=self.line_no,
                    attrs={"stream": "job-logs"},
                )
            )
        return signals


class Watch:
    """One Argus detection loop over one job: job states from Ray, lines from the driver log."""

    def __init__(self, cluster: RayCluster, submission_id: str, detector: StallDetector) -> None:
        self.collector = RayStateCollector(cluster.dashboard_url, timeout_s=10)
        self.tail = DriverLogTail(cluster, submission_id)
        self.detector = detector
        self.submission_id = submission_id
        self.status: str | None = None

    def tick(self) -> list[Finding]:
        signals = self.collector.collect()
        for s in signals:
            if s.kind is SignalKind.JOB_STATE and s.subject.id == self.submission_id:
                self.status = s.attrs.get("status")
        signals += self.tail.poll()
        return [f for f in self.detector.detect(signals) if f.subject.id == self.submission_id]

    def until(self, what: str, done: Callable[[list[Finding]], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            findings = self.tick()
            result = done(findings)
            if result:
                return result
            if time.monotonic() > deadline:
                tail = "\n".join(self.tail.lines[-15:])
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; job status "
                                     f"{self.status}; driver log tail:\n{tail}")
            time.sleep(0.5)


def submit(cluster: RayCluster, *args: str) -> tuple[Any, str]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    submission_id = f"argus-stall-{uuid.uuid4().hex[:8]}"
    client.submit_job(
        entrypoint=" ".join([sys.executable, str(SCRIPT), *args]),
        submission_id=submission_id,
        metadata={"test": "stall"},
    )
    return client, submission_id


def stop(client: Any, submission_id: str) -> None:
    """Leave the session cluster clean: the job and its ranks gone."""
    stop_all([(client, submission_id)])


def stop_all(jobs: list[tuple[Any, str]]) -> None:
    """Stop every job at once, then wait for each to end (one at a time, each stop waited seconds)."""
    for client, submission_id in jobs:
        try:
            client.stop_job(submission_id)
        except Exception:  # already finished
            pass
    deadline = time.monotonic() + 60
    for client, submission_id in jobs:
        while time.monotonic() < deadline:
            if str(client.get_job_status(submission_id).value) in TERMINAL:
                break
            time.sleep(0.5)


def scene_context(cluster: RayCluster, shared: Path) -> Context:
    return Context(jobs=JobController(cluster.dashboard_url, shared), registry=MemoryNodeRegistry(), nodes=None,
                   dashboard_url=cluster.dashboard_url, gcs_address=cluster.gcs_address, local=LocalRunner())


def test_stalled_rank_is_found_long_before_the_collective_timeout(ray_cluster: RayCluster, tmp_path: Path) -> None:
    client, sid = submit(ray_cluster, "--steps", "100000", "--stall-after", "12", "--interval-start", "0.5",
                         "--interval-end", "0.5", "--timeout", str(GLOO_TIMEOUT_S))
    watch = Watch(ray_cluster, sid, StallDetector(min_stall_s=5, factor=3))
    try:
        watch.until("the first step line", lambda _: any("step 1 " in line for line in watch.tail.lines), 180)
        [finding] = watch.until("a nccl_hang finding", lambda found: found, GLOO_TIMEOUT_S)
        # Found while the job still hangs: Ray says RUNNING and gloo has not timed out yet.
        assert watch.status == "RUNNING"
        assert not any("Timed out" in line or "timed out" in line for line in watch.tail.lines)

        assert finding.category is Category.NCCL_HANG
        assert finding.subject.id == sid
        last = finding.evidence[0]
        assert last.source == str(watch.tail.path)
        assert "step 12 loss=" in last.text and "step 13" not in "\n".join(watch.tail.lines)
        assert watch.tail.lines[last.line - 1].endswith("step 12 loss=0.0833")
        assert finding.attrs["step_interval_s"] is not None
        assert finding.attrs["stalled_s"] >= finding.attrs["threshold_s"] >= 5  # both rounded to 0.1 s

        # The scene names the stuck rank from every rank's py-spy stack: rank 1 (on worker 2) sleeps outside the
        # collective rank 0 waits in.
        kept = keep_scene(scene_context(ray_cluster, tmp_path), make_incident(
            id="inc-5ca1ab1e0000", category=Category.NCCL_HANG, subject=Subject(kind=SubjectKind.JOB, id=sid),
            summary="stalled", reason="stalled"), {}, dry_run=False)
        local = json.loads((tmp_path / "jobs" / sid / "scene" / "inc-5ca1ab1e0000" / "stacks" /
                            "localization.json").read_text())
        [culprit] = local["culprits"]
        assert culprit["node"] == ray_cluster.worker(2).ip and culprit["frame"].startswith("Rank.train (gloo_steps.py:")
        assert [w["words"] for w in local["waiting"]] == ["waits in all_reduce"]
        assert "is blocked outside the collective, in Rank.train (gloo_steps.py:" in kept.message
        assert "1 other rank waits in all_reduce" in kept.message

        # It keeps firing, as the same incident, while the hang lasts.
        again = watch.until("the finding again", lambda found: found, 30)
        assert [f.fingerprint for f in again] == [finding.fingerprint]
        print(f"stall found {finding.attrs['stalled_s']:.1f} s after the last step "
              f"(gloo would time out after {GLOO_TIMEOUT_S} s)")
    finally:
        stop(client, sid)
    # The job left RUNNING: the episode ends, but a hang that ended with its job is no recovery.
    watch.tick()
    assert watch.detector.recoveries() == [] and watch.detector.progress() == {}


def test_slow_but_progressing_job_is_not_a_stall(ray_cluster: RayCluster) -> None:
    client, sid = submit(ray_cluster, "--steps", "16", "--interval-start", "0.5", "--interval-end", "2.0",
                         "--timeout", str(GLOO_TIMEOUT_S))
    watch = Watch(ray_cluster, sid, StallDetector(min_stall_s=5, factor=3))
    try:
        seen: list[Finding] = []

        def finished(found: list[Finding]) -> bool:
            seen.extend(found)
            return watch.status in TERMINAL

        watch.until("the job to finish", finished, 240)
        assert watch.status == "SUCCEEDED", "\n".join(watch.tail.lines[-20:])
        assert any("step 16 " in line for line in watch.tail.lines)
        assert seen == []
    finally:
        stop(client, sid)
