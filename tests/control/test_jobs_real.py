"""JobController on the real session Ray cluster: drivers land on workers and write into their job folder,
stopping frees what a job holds, code_path selects the code, timeouts stop and mark jobs, Ray's errors
come back as ours."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.jobs import JobController, JobRecord
from control.jobspec import JobSpec
from core.errors import InputError, NotFound, SourceUnavailable
from stage.localstack.ray_cluster import RayCluster
from tests.helpers import wait_until

PY = sys.executable


class Tracked(JobController):
    """A controller that remembers what it submitted, so the fixture can stop leftovers."""

    submitted: list[str]

    def submit(self, spec: JobSpec) -> JobRecord:
        record = super().submit(spec)
        self.submitted.append(record.submission_id)
        return record


@pytest.fixture
def jobs(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[Tracked]:
    controller = Tracked(ray_cluster.dashboard_url, tmp_path / "shared")
    controller.submitted = []
    yield controller
    # leave the session cluster as we found it: nothing of ours running
    for sid in controller.submitted:
        if not controller.get(sid).ended:
            controller.stop(sid, reason="test teardown")
    for sid in controller.submitted:
        wait_until(f"job {sid} to end", lambda sid=sid: controller.get(sid).ended, timeout=120)


def script(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(source)
    return f"{PY} {path}"


def wait_status(jobs: JobController, sid: str, *statuses: str, timeout: float = 120) -> JobRecord:
    return wait_until(
        f"job {sid} to reach {statuses}",
        lambda: (r := jobs.get(sid)).status in statuses and r,
        timeout=timeout,
    )


def wait_log(jobs: JobController, sid: str, text: str, timeout: float = 120) -> str:
    def check() -> str | None:
        record = jobs.get(sid)
        try:
            log = jobs.logs(sid)
        except NotFound:  # no driver yet
            return None
        if text in log:
            return log
        assert not record.ended, f"job {sid} ended {record.status} before printing {text!r}:\n{log}"
        return None

    return wait_until(f"job {sid} to print {text!r}", check, timeout=timeout)


def test_job_runs_on_a_worker_and_writes_its_folder(
    jobs: Tracked, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    entry = script(
        tmp_path,
        "step.py",
        (
            "import os, pathlib\n"
            "d = pathlib.Path(os.environ['ARGUS_JOB_DIR'])\n"
            "(d / 'checkpoints' / 'step1').write_text(os.environ['ARGUS_SUBMISSION_ID'])\n"
            "for i in range(3):\n    print('line', i, flush=True)\n"
            "print('shell chars are data: $(id) `x` ; |')\n"
        ),
    )
    spec = JobSpec(name="step", workload="sft", entrypoint=entry, owner="alice", env={"MY_FLAG": "on"})
    record = jobs.submit(spec)
    sid = record.submission_id
    assert sid.startswith("step-") and record.job_dir == jobs.jobs_root / sid

    done = wait_status(jobs, sid, "SUCCEEDED", "FAILED", "STOPPED")
    assert done.status == "SUCCEEDED", jobs.logs(sid)
    head_id = ray_cluster.head.node_id
    worker_ids = {w.node_id for w in ray_cluster.workers}
    assert done.driver_node_id != head_id and done.driver_node_id in worker_ids
    assert (done.owner, done.workload, done.name) == ("alice", "sft", "step")

    job_dir = record.job_dir
    assert (job_dir / "checkpoints" / "step1").read_text() == sid
    assert JobSpec.load(job_dir / "config" / "jobspec.yaml") == spec
    call = json.loads((job_dir / "config" / "submit.json").read_text())
    assert call["entrypoint"] == entry and call["submission_id"] == sid
    assert call["entrypoint_resources"] == {"worker": 0.001}
    assert call["runtime_env"]["env_vars"]["ARGUS_JOB_DIR"] == str(job_dir)
    assert call["runtime_env"]["env_vars"]["MY_FLAG"] == "on"
    assert call["metadata"] == {"argus": "1", "owner": "alice", "workload": "sft", "name": "step"}

    log = jobs.logs(sid)  # the whole driver log, not only Ray's first supervisor line
    assert "line 0" in log and "line 2" in log and "$(id) `x` ; |" in log
    assert jobs.tail(sid, lines=1).strip() == "shell chars are data: $(id) `x` ; |"
    assert (job_dir / "logs" / "driver.log").read_text() == log  # the scene is kept in the job folder
    assert sid in [r.submission_id for r in jobs.list()]


HOLDER = """
import ray, time
ray.init()
@ray.remote(num_cpus=0, resources={"worker1": 1})
class Holder:
    def ping(self):
        return "ok"
h = Holder.remote()
ray.get(h.ping.remote())
print("HOLDING", flush=True)
time.sleep(600)
"""

NEEDER = """
import os, pathlib, ray
ray.init()
@ray.remote(num_cpus=0, resources={"worker1": 1})
def needs_worker1():
    return "ran"
print("WAITING", flush=True)
result = ray.get(needs_worker1.remote())
(pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints" / "ran").write_text(result)
print("RAN", flush=True)
"""


def test_stopping_a_job_frees_what_it_holds(jobs: Tracked, tmp_path: Path) -> None:
    holder = jobs.submit(
        JobSpec(name="holder", entrypoint=script(tmp_path, "hold.py", HOLDER), owner="alice")
    )
    wait_log(jobs, holder.submission_id, "HOLDING")

    needer = jobs.submit(JobSpec(name="needer", entrypoint=script(tmp_path, "need.py", NEEDER), owner="bob"))
    wait_log(jobs, needer.submission_id, "WAITING")
    # the holder still holds worker1, so the needer's task cannot have run
    assert not (needer.job_dir / "checkpoints" / "ran").exists()

    stopped = jobs.stop(holder.submission_id)
    assert stopped.mark == "stopped" and stopped.message.startswith("stop requested")
    assert json.loads((holder.job_dir / "config" / "status.json").read_text())["mark"] == "stopped"

    assert wait_status(jobs, needer.submission_id, "SUCCEEDED", "FAILED", "STOPPED").status == "SUCCEEDED"
    assert (needer.job_dir / "checkpoints" / "ran").read_text() == "ran"
    assert wait_status(jobs, holder.submission_id, "STOPPED").mark == "stopped"
    again = jobs.stop(holder.submission_id)
    assert "already ended" in again.message


def test_two_code_paths_import_two_versions(jobs: Tracked, tmp_path: Path) -> None:
    records = {}
    for version in ("v1", "v2"):
        code = tmp_path / f"code-{version}"
        code.mkdir()
        (code / "trainer_version.py").write_text(f"VERSION = {version!r}\n")
        entry = f"{PY} -c 'import trainer_version; print(\"VERSION=\" + trainer_version.VERSION)'"
        spec = JobSpec(name=f"code-{version}", entrypoint=entry, owner="alice", code_path=str(code))
        records[version] = jobs.submit(spec)
    for version, record in records.items():
        done = wait_status(jobs, record.submission_id, "SUCCEEDED", "FAILED", "STOPPED")
        log = jobs.logs(record.submission_id)
        assert done.status == "SUCCEEDED", log
        assert f"VERSION={version}" in log


def test_timeout_stops_and_marks_an_overrunning_job(jobs: Tracked, tmp_path: Path) -> None:
    entry = script(tmp_path, "sleep.py", "import time\nprint('SLEEPING', flush=True)\ntime.sleep(600)\n")
    record = jobs.submit(JobSpec(name="overrun", entrypoint=entry, owner="alice", timeout_s=1))
    short = jobs.submit(JobSpec(name="patient", entrypoint=entry, owner="alice", timeout_s=3600))
    sid = record.submission_id
    wait_log(jobs, sid, "SLEEPING")
    wait_log(jobs, short.submission_id, "SLEEPING")

    stopped = wait_until("enforce_timeouts to stop the job", lambda: jobs.enforce_timeouts(), timeout=60)
    assert stopped == [sid]  # the job within its timeout is left running
    assert jobs.get(short.submission_id).status == "RUNNING"
    ended = wait_status(jobs, sid, "STOPPED")
    assert ended.mark == "timed_out"
    status = json.loads((record.job_dir / "config" / "status.json").read_text())
    assert (
        status["mark"] == "timed_out" and status["timeout_s"] == 1 and "over its timeout" in status["reason"]
    )
    assert jobs.enforce_timeouts() == []  # a stopped job is not stopped again


def test_ray_errors_come_back_as_ours(jobs: Tracked, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="Ray has no job 'no-such-job'"):
        jobs.get("no-such-job")
    with pytest.raises(NotFound):
        jobs.stop("no-such-job")
    with pytest.raises(InputError, match="not a valid submission id"):
        jobs.get("../../etc")
    with pytest.raises(NotFound, match="code_path .* is not a directory"):
        jobs.submit(JobSpec(name="x", entrypoint="true", owner="a", code_path=str(tmp_path / "missing")))

    first = jobs.submit(JobSpec(name="dup", entrypoint="true", owner="a", submission_id="dup-id-1"))
    with pytest.raises(InputError, match="already exists"):
        jobs.submit(JobSpec(name="dup", entrypoint="true", owner="a", submission_id=first.submission_id))
    # Ray knows the id, this controller's folder is elsewhere: Ray's refusal is ours and leaves no folder
    other = JobController(jobs.dashboard_url, tmp_path / "other-shared")
    with pytest.raises(InputError, match="Ray already has a job with submission id 'dup-id-1'"):
        other.submit(JobSpec(name="dup", entrypoint="true", owner="a", submission_id="dup-id-1"))
    assert not (other.jobs_root / "dup-id-1").exists()

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(SourceUnavailable, match=f"cannot reach the Ray Jobs API at {url}"):
        JobController(url, tmp_path / "s").list()
