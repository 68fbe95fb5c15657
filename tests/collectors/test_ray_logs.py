"""Ray's logs on every node, read through the real log API and node agents of the session Ray cluster.

Real: the 3-node Ray cluster on loopback, the job, its driver on worker 2 and its task on worker 1, Ray's
own log files and the agents serving them. Simulated: the CUDA OOM is a line the job prints (there is no
GPU here), and one test writes a file of its own into worker 1's Ray log folder to rotate and truncate
it, since Ray would not do that on cue.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectors.offsets import OffsetStore
from collectors.ray_logs import RayLogsCollector
from core.types import Category, Subject, SubjectKind
from detectors.engine import RuleSet
from detectors.log_rules import LogRuleDetector
from tests.support import read_as_the_loop_does

pytestmark = [pytest.mark.ray]

OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"

JOB = f"""
import ray, sys
ray.init()

@ray.remote(num_cpus=0, resources={{"worker1": 0.1}})
def rank():
    print("rank on worker1 says hello", flush=True)
    return 1

print(ray.get(rank.remote()), flush=True)
for i in range(5):
    print(f"step {{i}} loss=0.{{i}}", flush=True)
print('Traceback (most recent call last):', flush=True)
print('  File "train.py", line 42, in forward', flush=True)
print({OOM_LINE!r}, flush=True)
sys.exit(1)
"""

RULES = """\
source: [job-logs, worker]
rules:
  - reason: CudaOutOfMemory
    category: gpu_oom
    type: permanent
    pattern: 'torch\\.(?:cuda\\.)?OutOfMemoryError: CUDA out of memory|RuntimeError: CUDA out of memory'
"""


def poll_until(what, collector, check, timeout=90.0):
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += collector.collect()
        if check(seen):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; {len(seen)} signals seen")


def test_cuda_oom_in_a_driver_on_a_worker_is_a_gpu_oom_finding(ray_cluster, tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    (tmp_path / "rules.yaml").write_text(textwrap.dedent(RULES))
    detector = LogRuleDetector(RuleSet.load([tmp_path / "rules.yaml"]))
    script = tmp_path / "job.py"
    script.write_text(JOB)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    sid = client.submit_job(entrypoint=f"{sys.executable} {script}", entrypoint_resources={"worker2": 0.1})
    offsets_path = tmp_path / "offsets.json"
    collector = RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(offsets_path), list_interval_s=0)
    findings = []

    def found(signals):
        findings.extend(detector.detect(signals[found.done:]))
        found.done = len(signals)
        return any(f.subject.id == sid for f in findings)

    found.done = 0
    try:
        signals = poll_until("a gpu_oom finding for the job", collector, found)
        (finding,) = [f for f in findings if f.subject.id == sid]
        assert finding.category is Category.GPU_OOM
        assert finding.subject == Subject(kind=SubjectKind.JOB, id=sid)
        driver_file = f"job-driver-{sid}.log"
        worker2 = ray_cluster.worker(2)
        assert finding.evidence[-1].source == f"ray://{worker2.ip}/{driver_file}"
        real = (worker2.log_dir() / driver_file).read_text().splitlines()
        assert real[finding.evidence[-1].line - 1] == OOM_LINE
        assert finding.attrs["node_id"] == worker2.node_id and finding.attrs["stream"] == "job-logs"

        # the task's print lands in a worker-*.out on worker 1, named by job id; it maps to the submission
        def said_hello(seen):
            return any(x.text == "rank on worker1 says hello" for x in seen)

        if not said_hello(signals):
            signals += poll_until("the task's line from worker 1", collector, said_hello, timeout=60)
        line = next(x for x in signals if x.text == "rank on worker1 says hello")
        assert line.attrs["stream"] == "worker" and line.subject.id == sid
        assert line.attrs["node_id"] == ray_cluster.worker(1).node_id
        collector.commit()  # as the loop does once the tick's findings are filed
    finally:
        collector.close()

    # a restart with the saved offsets reads none of the driver's lines again
    again = RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(offsets_path), list_interval_s=0)
    try:
        repeat = again.collect()
        assert not [x for x in repeat if x.attrs["file"] == driver_file and x.attrs["node_id"] == worker2.node_id]
    finally:
        again.close()


QUIET_START = """
import time
print("loading the model", flush=True)
time.sleep(20)  # quiet long enough for an idle file to back off to 16 s
for step in range(1, 9):
    print(f"step {step} loss=0.5", flush=True)
    time.sleep(0.5)
time.sleep(60)
"""


def test_a_running_jobs_driver_log_is_read_every_poll_after_a_quiet_start(ray_cluster, tmp_path: Path) -> None:
    # The stall detector learns a job's rhythm from when its step lines are read: eight steps half a second apart
    # must not arrive in one batch because the driver log had backed off while the ranks were loading.
    from ray.job_submission import JobSubmissionClient

    script = tmp_path / "quiet.py"
    script.write_text(QUIET_START)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    sid = client.submit_job(entrypoint=f"{sys.executable} {script}", entrypoint_resources={"worker2": 0.1})
    collector = RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(tmp_path / "offsets.json"),
                                 list_interval_s=1, idle_backoff_max_s=30)
    polls: list[set[int]] = []  # per poll, the steps it brought
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and sum(map(len, polls)) < 8:
            steps = {int(x.text.split()[1]) for x in collector.collect()
                     if x.subject.id == sid and (x.text or "").startswith("step ")}
            if steps:
                polls.append(steps)
            time.sleep(0.5)
    finally:
        collector.close()
        client.stop_job(sid)
    assert sum(map(len, polls)) == 8, polls
    assert len(polls) >= 3, f"the steps came in {len(polls)} batches: {polls}"


def test_offsets_survive_restart_truncation_and_rotation_of_a_remote_file(ray_cluster, tmp_path: Path) -> None:
    worker1 = ray_cluster.worker(1)
    name = f"worker-{'ab' * 28}-ffffffff-{os.getpid()}.out"  # a worker log name; the test writes it
    path = worker1.log_dir() / name
    offsets_path = tmp_path / "offsets.json"

    def lines_of(collector):
        return [(x.line, x.text) for x in read_as_the_loop_does(collector) if x.attrs["file"] == name]

    def fresh():
        return RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(offsets_path), list_interval_s=0,
                                idle_backoff_max_s=0)

    try:
        path.write_bytes(b"a\nb\npart")
        first = fresh()
        got = lines_of(first)
        assert got == [(1, "a"), (2, "b")]
        first.close()

        with open(path, "ab") as f:
            f.write(b"ial\nc\n")
        second = fresh()  # a new process: nothing twice, nothing missed
        assert lines_of(second) == [(3, "partial"), (4, "c")]
        assert lines_of(second) == []

        path.write_bytes(b"z\n")  # truncated in place
        assert lines_of(second) == [(1, "z")]

        os.rename(path, path.with_name(name + ".1"))  # rotated: a new file, longer than the offset
        path.write_bytes(b"rotated file, first line\nsecond\n")
        mine = [x for x in second.collect() if x.attrs["file"] == name]
        assert [(x.line, x.text) for x in mine] == [(1, "rotated file, first line"), (2, "second")]
        # no job claimed this worker (job id ffffffff): its lines are about the node
        assert {x.subject for x in mine} == {Subject(kind=SubjectKind.NODE, id=worker1.node_id, name=worker1.ip)}
        second.close()
    finally:
        for p in (path, path.with_name(name + ".1")):
            p.unlink(missing_ok=True)


def test_a_dead_node_is_reported_not_raised(ray_cluster, ray_faults, tmp_path: Path) -> None:
    collector = RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(tmp_path / "offsets.json"),
                                 list_interval_s=0)
    try:
        dead_id = ray_cluster.worker(1).node_id
        poll_until("worker 1's raylet.out", collector,
                   lambda s: any(x.attrs["node_id"] == dead_id and x.attrs["file"] == "raylet.out" for x in s))
        ray_faults.kill_worker(1)
        ray_cluster.wait_node_state(dead_id, "DEAD", timeout=60)
        # The dashboard's node summary (what the collector lists) can lag the state API by a poll or two on a
        # loaded machine: poll until it drops the node; every poll must not raise.
        def dropped():
            signals = collector.collect()
            return not [key for key in collector._files if key[0] == dead_id] and signals is not None

        poll_deadline = time.monotonic() + 60
        while not dropped():
            assert time.monotonic() < poll_deadline, "the collector kept the dead node's files for 60 s"
            time.sleep(0.5)
        signals = collector.collect()
        assert not [x for x in signals if x.attrs["node_id"] == dead_id]
        assert not [key for key in collector._files if key[0] == dead_id]
        assert not [key for key in collector.offsets.keys() if dead_id in key]
    finally:
        collector.close()


def test_a_node_restarted_in_place_goes_on_where_its_files_were_read(ray_cluster, ray_faults, tmp_path: Path) -> None:
    """A raylet restarted on the same host (no reboot) is a new Ray node writing into the same log folder, beside
    its predecessor's worker files: those are read on from where they were, not again from their first line."""
    worker1 = ray_cluster.worker(1)
    name = f"worker-{'cd' * 28}-ffffffff-{os.getpid()}.out"
    path = worker1.log_dir() / name
    collector = RayLogsCollector(ray_cluster.dashboard_url, OffsetStore(tmp_path / "offsets.json"),
                                 list_interval_s=0, idle_backoff_max_s=0)

    def mine(signals):
        return [(x.line, x.text) for x in signals if x.attrs["file"] == name]

    try:
        path.write_text("CUDA out of memory, read before the restart\nsecond\n")
        seen = poll_until("the test's worker file", collector, lambda s: len(mine(s)) == 2)
        assert mine(seen) == [(1, "CUDA out of memory, read before the restart"), (2, "second")]
        dead_id = worker1.node_id
        ray_faults.kill_worker(1)
        ray_cluster.wait_node_state(dead_id, "DEAD", timeout=60)
        deadline = time.monotonic() + 60
        while [key for key in collector._files if key[0] == dead_id]:
            assert time.monotonic() < deadline, "the collector kept the dead node's files for 60 s"
            collector.collect()
            time.sleep(0.5)

        again = ray_faults.restart_worker(1, in_place=True)
        assert again.node_id != dead_id and again.log_dir() == path.parent
        with open(path, "a") as f:
            f.write("third, after the restart\n")
        fresh = again.log_dir() / f"worker-{'ef' * 28}-ffffffff-{os.getpid()}.out"
        fresh.write_text("a new worker's first line\n")
        seen = poll_until("both files on the restarted node", collector,
                          lambda s: any(x.attrs["file"] == fresh.name for x in s) and mine(s))
        assert mine(seen) == [(3, "third, after the restart")]
        assert [(x.line, x.text) for x in seen if x.attrs["file"] == fresh.name] == [(1, "a new worker's first line")]
        assert {x.attrs["node_id"] for x in seen if x.attrs["file"] == name} == {again.node_id}
        assert not [key for key in collector.offsets.keys() if key.startswith("ray-left:") and key.endswith(name)]
    finally:
        collector.close()
        for p in (path, path.parent / f"worker-{'ef' * 28}-ffffffff-{os.getpid()}.out"):
            p.unlink(missing_ok=True)
