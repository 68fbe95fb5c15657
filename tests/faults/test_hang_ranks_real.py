"""Real hangs, one rank at fault: in a 4-rank and a 2-rank gloo job one rank is SIGSTOPped, spins in Python
outside the collective, or blocks on a lock; the kept scene must name that rank (its pid and node) from every
rank's py-spy stack, and list the others as waiting in the collective.

Real: the Ray cluster (session fixture: head + 2 workers on loopback), the jobs submitted through the Jobs API
(stage/localstack/jobs/gloo_steps.py --world N --fault F --fault-rank R, ranks spread over both workers), torch
2.13 (CPU) with gloo process groups, each rank's pid and node as the job itself reports them (--ranks-file), the
stacks taken by py-spy through Ray's dashboard (/worker/traceback), and keep_scene writing the scene. Each job
turns PyTorch's flight recorder on (TORCH_FR_BUFFER_SIZE in its runtime_env) and its ranks dump it 2 s into the hang
(--fr-dump-after: what NCCL's watchdog does on a timeout, which gloo lacks); the scene keeps those dumps and says
which rank is behind.
Simulated: the incident handed to keep_scene (no detector runs here: tests/faults/test_stall_real.py covers
finding the stall). All six jobs run at once (module fixture), to keep the tests short.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.types import Category, Subject, SubjectKind
from remediation.actions import keep_scene
from stage.localstack.jobs import JOBS_DIR
from stage.localstack.ray_cluster import RayCluster
from tests.faults.test_stall_real import DriverLogTail, scene_context, stop_all
from tests.support import make_incident

pytest.importorskip("torch", reason="the hang tests need torch==2.13.0 (CPU build): pip install -e .[dev]")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

SCRIPT = JOBS_DIR / "gloo_steps.py"
STALL_AFTER = 3  # the fault comes after this step
INTERVAL_S = 0.2
GLOO_TIMEOUT_S = 600  # far beyond the test: every hang here is still a hang when the scene is kept
FR_DUMP_AFTER_S = 2
# world -> fault -> the rank at fault (rank r runs on worker r % 2 + 1)
FAULT_RANKS = {4: {"stop": 3, "spin": 2, "lock": 1}, 2: {"stop": 1, "spin": 0, "lock": 1}}
# fault -> how the culprit's place reads in localization.json
EXPECTED = {
    "spin": ("elsewhere", "runs outside the collective, in spin_forever (gloo_steps.py:"),
    "lock": ("elsewhere", "is blocked outside the collective, in wait_on_lock (gloo_steps.py:"),
}


@dataclass
class Job:
    fault: str
    rank: int
    client: Any
    sid: str
    ranks_file: Path
    tail: DriverLogTail
    ranks: list[dict[str, Any]] | None = None
    fr_folder: Path | None = None  # where its ranks dump their flight recorder
    submitted: float = 0.0  # time.monotonic() of the submission, of its ranks being known, of its fault
    ranks_at: float = 0.0
    faulted_at: float = 0.0

    def status(self) -> str:
        return str(self.client.get_job_status(self.sid).value)

    def pid(self, rank: int) -> int:
        assert self.ranks is not None
        return int(self.ranks[rank]["pid"])


def submit(cluster: RayCluster, folder: Path, world: int, fault: str, rank: int) -> Job:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    sid = f"argus-hang-{fault}-{uuid.uuid4().hex[:8]}"
    ranks_file = folder / f"{sid}-ranks.json"
    (folder / f"{sid}-fr").mkdir()
    env = {"TORCH_FR_BUFFER_SIZE": "200", "TORCH_FR_DUMP_TEMP_FILE": str(folder / f"{sid}-fr" / "trace_rank_")}
    args = ["--world", str(world), "--fault", fault, "--fault-rank", str(rank), "--stall-after", str(STALL_AFTER),
            "--steps", "100000", "--interval-start", str(INTERVAL_S), "--interval-end", str(INTERVAL_S),
            "--timeout", str(GLOO_TIMEOUT_S), "--ranks-file", str(ranks_file), "--fr-dump-after", str(FR_DUMP_AFTER_S)]
    client.submit_job(entrypoint=" ".join([sys.executable, str(SCRIPT), *args]), submission_id=sid,
                      metadata={"test": "hang-ranks"}, runtime_env={"env_vars": env})
    return Job(fault, rank, client, sid, ranks_file, DriverLogTail(cluster, sid), submitted=time.monotonic(),
               fr_folder=folder / f"{sid}-fr")


def wait_until_faulted(jobs: list[Job], timeout: float) -> None:
    """Every job has its ranks' pids, has logged step STALL_AFTER, and its fault rank has gone wrong."""
    deadline = time.monotonic() + timeout
    pending = list(jobs)
    while pending:
        for job in list(pending):
            job.tail.poll()
            if job.ranks is None and job.ranks_file.is_file():
                job.ranks = json.loads(job.ranks_file.read_text())["ranks"]
                job.ranks_at = time.monotonic()
            if job.ranks is None or not any(f"step {STALL_AFTER} loss=" in line for line in job.tail.lines):
                continue
            if job.fault == "stop" and psutil.Process(job.pid(job.rank)).status() != psutil.STATUS_STOPPED:
                continue
            job.faulted_at = time.monotonic()
            pending.remove(job)
        if pending and time.monotonic() > deadline:
            said = "; ".join(f"{j.sid} ({j.status()}): ranks {'known' if j.ranks else 'unknown'}, log tail "
                             f"{j.tail.lines[-5:]}" for j in pending)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for the faults: {said}")
        time.sleep(0.3)
    # The other ranks reach the next all_reduce one step interval after the step line; give them that and more, and
    # every rank that can (not a stopped one) the time to dump its flight recorder.
    # On a 2-core machine running 18 ranks (two of them spinning) a dump can take a while: wait for each, up to a
    # minute, and say which are missing rather than let a later assertion guess.
    time.sleep(INTERVAL_S + 1.5)
    deadline = time.monotonic() + FR_DUMP_AFTER_S + 60
    for job in jobs:
        world = len(job.ranks or ())
        expected = {str(r) for r in range(world) if not (job.fault == "stop" and r == job.rank)}
        assert job.fr_folder is not None
        while (missing := expected - {p.name.removeprefix("trace_rank_") for p in job.fr_folder.iterdir()}) and \
                time.monotonic() < deadline:
            time.sleep(0.3)
        assert not missing, (f"{job.sid}: ranks {sorted(missing)} wrote no flight recorder dump into {job.fr_folder} "
                             f"within {FR_DUMP_AFTER_S + 60} s of the hang; log tail {job.tail.lines[-8:]}")


@pytest.fixture(scope="module")
def hung_jobs(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, list[Job]]]:
    """Every job of FAULT_RANKS, submitted at once and each with its fault in place; all stopped at the end."""
    folder = tmp_path_factory.mktemp("hang-ranks")
    started = time.monotonic()
    jobs: dict[int, list[Job]] = {}
    try:
        for world, faults in FAULT_RANKS.items():
            jobs[world] = [submit(ray_cluster, folder, world, fault, rank) for fault, rank in faults.items()]
        wait_until_faulted([j for js in jobs.values() for j in js], 300)
        every = [j for js in jobs.values() for j in js]
        print(f"{len(every)} jobs with their faults in place after {time.monotonic() - started:.1f} s")
        for job in every:
            print(f"  {job.sid} (world {len(job.ranks or ())}): ranks up after {job.ranks_at - job.submitted:.1f} s, "
                  f"fault after {job.faulted_at - job.submitted:.1f} s")
        yield jobs
    finally:
        every = [j for js in jobs.values() for j in js]
        for job in every:
            if job.fault == "stop" and job.ranks is not None:  # a stopped rank ignores SIGTERM until it runs again
                try:
                    psutil.Process(job.pid(job.rank)).send_signal(signal.SIGCONT)
                except psutil.Error:
                    pass
        stop_all([(job.client, job.sid) for job in every])


@pytest.mark.parametrize("world", sorted(FAULT_RANKS, reverse=True))
def test_the_scene_names_the_rank_at_fault(ray_cluster: RayCluster, hung_jobs: dict[int, list[Job]], tmp_path: Path,
                                           world: int) -> None:
    for n, job in enumerate(hung_jobs[world]):
        assert job.ranks is not None
        assert [r["rank"] for r in job.ranks] == list(range(world))
        for r in job.ranks:  # rank r on worker r % 2 + 1, and the job says so
            assert r["node"] == ray_cluster.worker(r["rank"] % 2 + 1).ip, job.ranks
        shared = tmp_path / job.fault
        incident = f"inc-{n:012x}"
        kept = keep_scene(scene_context(ray_cluster, shared), make_incident(
            id=incident, category=Category.NCCL_HANG, subject=Subject(kind=SubjectKind.JOB, id=job.sid),
            summary="stalled", reason="stalled"), {}, dry_run=False)
        scene = shared / "jobs" / job.sid / "scene" / incident
        local = json.loads((scene / "stacks" / "localization.json").read_text())
        said = f"{job.fault} on rank {job.rank} of {world}: {json.dumps(local, indent=1)}\n{kept.message}"
        print(f"{job.fault} (world {world}, rank {job.rank}): {local['sentence']}")

        assert len(local["ranks"]) == world, said
        [culprit] = local["culprits"]
        assert culprit["pid"] == job.pid(job.rank), said
        assert culprit["node"] == ray_cluster.worker(job.rank % 2 + 1).ip, said
        if job.fault == "stop":
            # py-spy cannot take a stopped process' stack ("Failed to suspend process"); the process state (T),
            # which Argus reads from /proc for a process on its own host (every rank here), says it outright.
            assert (culprit["where"], culprit["words"], culprit["state"]) == ("stopped", "stopped (state T)", "T"), said
        else:
            where, words = EXPECTED[job.fault]
            assert (culprit["where"], culprit["words"][:len(words)]) == (where, words), said
        others = sorted(job.pid(r) for r in range(world) if r != job.rank)
        assert sorted(w["pid"] for w in local["waiting"]) == others, said
        assert {w["words"] for w in local["waiting"]} == {"waits in all_reduce"}, said
        assert {w["node"] for w in local["waiting"]} == {ray_cluster.worker(r % 2 + 1).ip
                                                        for r in range(world) if r != job.rank}, said
        others_said = "1 other rank waits" if world == 2 else f"{world - 1} other ranks wait"
        assert f"{others_said} in all_reduce" in local["sentence"], said

        # The flight recorder: every rank that could dumped it, the scene keeps each dump as torch wrote it, and a
        # rank that left the collective loop (spin, lock) is the one behind.
        recorded = json.loads((scene / "flight_recorder" / "index.json").read_text())
        dumps = {d["rank"]: d for d in recorded["dumps"]}
        expected = set(range(world)) - ({job.rank} if job.fault == "stop" else set())
        assert set(dumps) == expected, recorded
        for r, d in dumps.items():
            copy = scene / "flight_recorder" / d["node"] / f"trace_rank_{r}"
            assert copy.read_bytes() == (job.fr_folder / f"trace_rank_{r}").read_bytes()
            assert d["entries"] >= STALL_AFTER and d["last_op"] == "gloo:all_reduce", recorded
        if job.fault == "stop":
            assert len({d["last_seq"] for d in dumps.values()}) == 1, recorded
        else:
            ahead = max(d["last_seq"] for d in dumps.values())
            assert [r for r, d in dumps.items() if d["last_seq"] < ahead] == [job.rank], recorded
            assert f"rank {job.rank} last entered collective #{ahead - 1}" in recorded["sentence"], recorded
            assert recorded["sentence"] in kept.message
