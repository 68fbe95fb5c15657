"""The job queue (control/queue.py) on the real store (SQLite): queued → started → finished, expired, cancelled,
failed; first that fits; nodes out of rotation; a restart and a second replica. Ray is the Jobs SDK stand-in of
test_job_timeouts.py and a capacity reading the test sets; the real cluster's run is tests/control/test_queue_real.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from ray.job_submission import JobStatus

from argus.store.store import Store
from control.admission import ClusterGpus, NodeCapacity
from control.jobs import JobController
from control.jobspec import JobSpec
from control.nodes import MemoryNodeRegistry, NodeSpec, NodeState
from control.queue import JobQueue, QueueState, TickOutcome
from core.errors import ArgusError, Conflict, SourceUnavailable
from core.lineage import Lineage
from tests.control.test_job_timeouts import Clock, Ray

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOvHd5Yq4s1nE0CkW2m3n5b8xk9Zr7bq3u9Yp2sT6fQx"


class Cluster:
    """What the queue reads from Ray: nodes with free GPUs, GPUs held by job, jobs' statuses (from the stand-in)."""

    def __init__(self, ray: Ray) -> None:
        self.ray = ray
        self.nodes = [NodeCapacity("id-a", "10.0.0.1", "h20", 8, 8), NodeCapacity("id-b", "10.0.0.2", "h20", 8, 8)]
        self.held: dict[str, float] = {}
        self.names: dict[str, str] = {"id-a": "gpu-a", "id-b": "gpu-b"}
        self.down: str | None = None

    def read(self) -> ClusterGpus:
        if self.down:
            raise SourceUnavailable("the Ray state API", "http://head:8265", self.down)
        status = {sid: str(d.status.value) for sid, d in self.ray.jobs.items()}
        return ClusterGpus(nodes=tuple(self.nodes), held_by_job=dict(self.held), status_by_job=status,
                           node_names=self.names)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ray(clock: Clock) -> Ray:
    return Ray(clock)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    yield s
    s.close()


@pytest.fixture
def jobs(ray: Ray, clock: Clock, tmp_path: Path) -> JobController:
    return JobController("http://127.0.0.1:1", tmp_path / "shared", client=ray, clock=clock)


@pytest.fixture
def cluster(ray: Ray) -> Cluster:
    return Cluster(ray)


def queue_of(store: Store, jobs: JobController, cluster: Cluster, clock: Clock, **kw: object) -> JobQueue:
    return JobQueue(store.job_queue, jobs, cluster.read, clock=clock, **kw)  # type: ignore[arg-type]


def spec(name: str, nnodes: int = 1, gpus: int = 8, owner: str = "alice", **kw: object) -> JobSpec:
    return JobSpec.from_dict({"name": name, "entrypoint": "python train.py", "owner": owner, "nnodes": nnodes,
                              "gpus_per_node": gpus, "pool": "h20", **kw})


def test_three_jobs_two_fit_the_third_waits_and_starts_when_the_first_ends(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock) -> None:
    seen: list[TickOutcome] = []
    queue = queue_of(store, jobs, cluster, clock, observe=seen.append)
    first = queue.submit(spec("first"))
    second = queue.submit(spec("second", owner="bob"))
    assert first.state is second.state is QueueState.STARTED and set(ray.jobs) == {first.submission_id,
                                                                                   second.submission_id}
    # Ray does not show their GPUs used yet: their claims hold both nodes
    third = queue.submit(spec("third"))
    assert third.state is QueueState.QUEUED and third.submission_id not in ray.jobs
    assert third.reason == "waiting for 1 node × 8 GPUs in pool h20: no node has 8 free (the most on one node: 0)"
    assert not jobs.folder(third.submission_id).exists()  # its folder is made when it starts
    clock.now += timedelta(seconds=40)
    ray.set(first.submission_id, JobStatus.SUCCEEDED)
    outcome = queue.tick()
    assert outcome.finished == [first.submission_id] and outcome.started == [third.submission_id]
    assert seen[-1] is outcome and outcome.waited_s == {third.submission_id: 40.0} and outcome.waiting_by_pool == {}
    assert seen[-2].waiting_by_pool == {"h20": 1}  # the tick before: the third waited
    started = queue.get(third.submission_id)
    assert started.state is QueueState.STARTED and started.waited_s == 40 and started.job_state() == "running"
    assert queue.get(first.submission_id).job_state() == "finished"
    assert (jobs.job_dir(third.submission_id) / "config" / "jobspec.yaml").is_file()
    assert (jobs.shared_root / "users" / "alice" / "code").is_dir() and (jobs.shared_root / "users" / "bob").is_dir()


def test_a_gang_that_can_never_fit_expires_with_its_reason(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock) -> None:
    queue = queue_of(store, jobs, cluster, clock, default_timeout_s=60)
    entry = queue.submit(spec("huge", nnodes=3))
    assert entry.state is QueueState.QUEUED and "pool h20 has only 2 nodes with 8 GPUs in all" in entry.reason
    clock.now += timedelta(seconds=61)
    assert queue.tick().expired == [entry.submission_id]
    expired = queue.get(entry.submission_id)
    assert expired.state is QueueState.EXPIRED and expired.ended_at == clock.now
    assert expired.reason.startswith("not started within its queue timeout of 60 s: waiting for 3 nodes × 8 GPUs")
    assert not ray.jobs


def test_cancel_takes_a_queued_job_out_and_leaves_a_started_one_to_ray(
        store: Store, jobs: JobController, cluster: Cluster, clock: Clock) -> None:
    queue = queue_of(store, jobs, cluster, clock)
    running = queue.submit(spec("run", nnodes=2))
    waiting = queue.submit(spec("wait"))
    assert queue.cancel(waiting.submission_id, reason="changed my mind") is not None
    assert queue.get(waiting.submission_id).state is QueueState.CANCELLED
    assert queue.cancel(running.submission_id, reason="x") is None  # started: stop it in Ray
    assert queue.tick().started == []  # a cancelled job never starts


def test_a_refused_submission_fails_its_entry_and_tells_the_caller(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock) -> None:
    def refuse(**call: object) -> str:
        raise RuntimeError("Request failed with status code 500: job already exists")

    ray.submit_job = refuse  # type: ignore[method-assign]
    queue = queue_of(store, jobs, cluster, clock)
    with pytest.raises(ArgusError):
        queue.submit(spec("refused", submission_id="refused-1"))
    failed = queue.get("refused-1")
    assert failed.state is QueueState.FAILED and failed.reason.startswith("Ray refused it:")
    with pytest.raises(Conflict):
        queue.submit(spec("refused", submission_id="refused-1"))  # its place is kept: the id is taken


def test_ray_unreadable_keeps_jobs_queued_with_the_reason(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock) -> None:
    cluster.down = "connection refused"
    queue = queue_of(store, jobs, cluster, clock)
    entry = queue.submit(spec("patient"))
    assert entry.state is QueueState.QUEUED and "connection refused" in entry.reason and not ray.jobs
    cluster.down = None
    assert queue.tick().started == [entry.submission_id]


def test_nodes_out_of_rotation_take_no_new_job(
        store: Store, jobs: JobController, cluster: Cluster, clock: Clock, tmp_path: Path) -> None:
    registry = MemoryNodeRegistry()
    for name in ("gpu-a", "gpu-b"):
        registry.add(NodeSpec.parse({"name": name, "host": "10.0.0.9", "ssh_key_path": str(tmp_path / "k"),
                                     "host_key": KEY, "pool": "h20", "gpus": 8}), actor="t", reason="t")
        registry.record_transition(name, NodeState.PENDING, NodeState.ONLINE, actor="t", reason="joined")
    registry.record_transition("gpu-a", NodeState.ONLINE, NodeState.DRAINING, actor="t", reason="xid 79")
    queue = queue_of(store, jobs, cluster, clock, registry=registry)
    assert queue.submit(spec("two", nnodes=2)).state is QueueState.QUEUED
    one = queue.submit(spec("one"))
    assert one.state is QueueState.STARTED
    assert queue.get(one.submission_id).reason.startswith("started after")


def test_the_queue_survives_a_restart_and_two_replicas_start_a_job_once(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock, tmp_path: Path) -> None:
    queue = queue_of(store, jobs, cluster, clock)
    blocker = queue.submit(spec("blocker", nnodes=2))
    later = queue.submit(spec("later"), lineage=Lineage(of="blocker-x", root="blocker-x", attempt=1),
                         resume_from=tmp_path / "ckpt" / "global_step_40")
    assert later.state is QueueState.QUEUED
    reopened = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)  # Argus restarted: the queue is in the store
    try:
        replicas = [queue_of(reopened, jobs, cluster, clock), queue_of(store, jobs, cluster, clock)]
        ray.set(blocker.submission_id, JobStatus.FAILED)
        started = [sid for replica in replicas for sid in replica.tick().started]
    finally:
        reopened.close()
    assert started == [later.submission_id]  # the second replica found it started already
    call = ray.jobs[later.submission_id]
    assert call.metadata is not None and Lineage.from_metadata(call.metadata) == Lineage("blocker-x", "blocker-x", 1)


def test_with_nothing_waiting_a_tick_reads_only_rays_job_list(
        store: Store, jobs: JobController, cluster: Cluster, ray: Ray, clock: Clock) -> None:
    queue = queue_of(store, jobs, cluster, clock)
    running = queue.submit(spec("alone"))
    cluster.down = "the state API is slow on a big cluster"  # not read: nothing waits for room
    ray.set(running.submission_id, JobStatus.STOPPED)
    outcome = queue.tick()
    assert outcome.finished == [running.submission_id] and outcome.error is None
    finished = queue.get(running.submission_id)
    assert finished.state is QueueState.FINISHED and finished.ray_status == "STOPPED"
    assert queue.tick().finished == []  # finished once
