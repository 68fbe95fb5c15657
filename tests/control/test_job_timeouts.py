"""The job-timeout chore (JobController.enforce_timeouts): a job over its timeout_s is stopped and marked whether it
runs or still waits in PENDING, its time counted from submission, with a reason that says what it waited for.

Ray is a stand-in client answering as the Jobs SDK does (its own JobDetails); on the real cluster the same chore
is run in test_jobs_real.py (RUNNING) and test_pools_real.py (PENDING, then placed once its pool has a node)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from ray.job_submission import JobDetails, JobStatus, JobType

from control.jobs import JobController
from control.jobspec import JobSpec
from core.errors import NotFound

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Ray:
    """What enforce_timeouts asks of the Jobs SDK: submit_job, list_jobs, stop_job, get_job_info."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, JobDetails] = {}
        self.stops: list[str] = []
        self.stop_answer = True  # False: Ray has not registered the job's supervisor actor yet

    def submit_job(self, **call: Any) -> str:
        sid = call["submission_id"]
        self.jobs[sid] = JobDetails(type=JobType.SUBMISSION, submission_id=sid, entrypoint=call["entrypoint"],
                                    status=JobStatus.PENDING, metadata=call["metadata"],
                                    start_time=int(self.clock.now.timestamp() * 1000))
        return sid

    def set(self, sid: str, status: JobStatus) -> None:
        self.jobs[sid] = self.jobs[sid].model_copy(update={"status": status})

    def list_jobs(self) -> list[JobDetails]:
        return list(self.jobs.values())

    def get_job_info(self, sid: str) -> JobDetails:
        self._known(sid)
        return self.jobs[sid]

    def stop_job(self, sid: str) -> bool:
        self._known(sid)
        self.stops.append(sid)
        return self.stop_answer and self.jobs[sid].status in (JobStatus.PENDING, JobStatus.RUNNING)

    def _known(self, sid: str) -> None:
        if sid not in self.jobs:  # the SDK's error for an unknown job
            raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ray(clock: Clock) -> Ray:
    return Ray(clock)


@pytest.fixture
def jobs(ray: Ray, clock: Clock, tmp_path: Path) -> JobController:
    return JobController("http://127.0.0.1:1", tmp_path / "shared", client=ray, clock=clock)


def submit(jobs: JobController, name: str, **fields: Any) -> str:
    spec = JobSpec.from_dict({"name": name, "entrypoint": "python -m verl.trainer.main_ppo", "owner": "alice",
                              **fields})
    return jobs.submit(spec).submission_id


def status_of(jobs: JobController, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(jobs.folder(sid).status_file.read_text())
    return result


def test_a_job_still_pending_past_its_timeout_is_stopped_with_what_it_waited_for(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    sid = submit(jobs, "grpo", pool="h100", timeout_s=600)
    clock.now = T0 + timedelta(seconds=600)
    assert jobs.enforce_timeouts() == []  # not over yet: its time counts from submission
    clock.now = T0 + timedelta(seconds=601)

    assert jobs.enforce_timeouts() == [sid]
    assert ray.stops == [sid]
    status = status_of(jobs, sid)
    assert (status["mark"], status["timeout_s"], status["job_status"]) == ("timed_out", 600, "PENDING")
    assert status["reason"] == (
        "still PENDING 601 s after submission, over its timeout of 600 s: its driver never started, as no node "
        "offered labels argus.io/pool=h100 and resources worker=0.001; join a node into pool h100 or free one "
        "there, or resubmit in a pool that has free nodes"
    )
    assert jobs.get(sid).mark == "timed_out"


def test_a_pending_job_is_asked_to_stop_once(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    # Ray keeps a stopped PENDING job PENDING until its driver gets a node (then stops it at once): asking
    # again on every pass would change nothing and rewrite the mark
    sid = submit(jobs, "grpo", pool="h100", timeout_s=60)
    clock.now = T0 + timedelta(seconds=61)
    assert jobs.enforce_timeouts() == [sid]
    first = status_of(jobs, sid)
    clock.now = T0 + timedelta(seconds=120)
    assert jobs.enforce_timeouts() == []
    assert ray.stops == [sid] and status_of(jobs, sid) == first


def test_a_stop_ray_could_not_deliver_yet_is_tried_again(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    sid = submit(jobs, "grpo", timeout_s=60)
    clock.now = T0 + timedelta(seconds=61)
    ray.stop_answer = False
    assert jobs.enforce_timeouts() == []
    assert not jobs.folder(sid).status_file.exists()
    ray.stop_answer = True
    assert jobs.enforce_timeouts() == [sid]
    assert "no node offered resources worker=0.001; see `ray status`" in status_of(jobs, sid)["reason"]


def test_a_running_job_is_timed_out_from_its_submission(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    sid = submit(jobs, "sft", timeout_s=3600)
    ray.set(sid, JobStatus.RUNNING)
    clock.now = T0 + timedelta(hours=2)
    assert jobs.enforce_timeouts() == [sid]
    status = status_of(jobs, sid)
    assert status["reason"] == "ran 7200 s after submission, over its timeout of 3600 s"
    assert status["job_status"] == "RUNNING"


def test_jobs_that_ended_have_no_timeout_or_are_not_argus_jobs_are_left_alone(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    ended = {status: submit(jobs, f"ended-{status.value.lower()}", timeout_s=1)
             for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)}
    for status, sid in ended.items():
        ray.set(sid, status)
    submit(jobs, "forever")  # no timeout_s
    foreign = submit(jobs, "foreign", timeout_s=1)
    ray.jobs[foreign] = ray.jobs[foreign].model_copy(update={"metadata": {"timeout_s": "1"}})  # not submitted by Argus
    clock.now = T0 + timedelta(days=1)
    assert jobs.enforce_timeouts() == []
    assert ray.stops == []


def test_a_job_gone_from_ray_meanwhile_is_skipped(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    gone = submit(jobs, "gone", timeout_s=1)
    kept = submit(jobs, "kept", timeout_s=1)
    clock.now = T0 + timedelta(seconds=5)
    listed = ray.list_jobs()
    ray.list_jobs = lambda: listed  # type: ignore[method-assign]  # Ray listed it, then forgot it
    del ray.jobs[gone]
    with pytest.raises(NotFound):
        jobs.get(gone)
    assert jobs.enforce_timeouts() == [kept]


def test_the_sweep_reads_rays_job_list_once_for_timeouts_and_the_live_jobs_info(
    jobs: JobController, ray: Ray, clock: Clock
) -> None:
    late = submit(jobs, "late", timeout_s=60)
    live = submit(jobs, "live")
    done = submit(jobs, "done")
    ray.set(late, JobStatus.RUNNING)
    ray.set(live, JobStatus.RUNNING)
    ray.set(done, JobStatus.SUCCEEDED)
    ray.jobs["raysubmit_plain"] = JobDetails(type=JobType.SUBMISSION, submission_id="raysubmit_plain",
                                             entrypoint="python train.py", status=JobStatus.RUNNING)
    reads: list[int] = []
    list_jobs = ray.list_jobs
    ray.list_jobs = lambda: reads.append(1) or list_jobs()  # type: ignore[method-assign]
    seen: list[list[str]] = []
    clock.now = T0 + timedelta(seconds=61)

    assert jobs.sweep(lambda records: seen.append(sorted(r.name or "" for r in records))) == [late]
    # one read of Ray's list; the info names the Argus jobs not ended when it was read (the late one was RUNNING),
    # never a finished job or one Argus did not submit
    assert reads == [1] and seen == [["late", "live"]]
    assert ray.stops == [late] and status_of(jobs, late)["mark"] == "timed_out"
