"""How the demo causes each fault of stage/demo/faults.py, and how it knows Argus's incident for it.

Every job goes in through Argus's own API (`POST /v1/jobs`), as a user's would, so remediation can
resubmit it. Each injector returns an Injection: when the fault was caused, and the job or node it hit.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from control import commands
from control.local import LocalRunner
from core.errors import ArgusError
from core.refs import refs_of
from core.types import Incident
from remediation.actions import RAY_BIN
from stage.localstack.jobs import JOBS_DIR
from stage.localstack.trainer import RESUMABLE_TRAINER

HOST_OOM_HEADROOM = 512 << 20  # Ray's threshold sits this far above the host's use when the hog starts
HOST_OOM_MAX_BUDGET = 1536  # MiB: the most the hog may take (the machine may be shared)


@dataclass
class Injection:
    at: float  # time.time() the fault was caused
    submission_id: str | None = None
    node_ip: str | None = None
    gpu_uuid: str | None = None
    note: str = ""
    # The job fails on its own after it starts: `at` becomes Ray's end time of the job once it has one.
    at_job_end: bool = False
    undo: list[Callable[[], None]] = field(default_factory=list)  # run when the phase ends


@dataclass
class DemoContext:
    """What the injectors need: the cluster, the DCGM simulators (one per worker), Argus's API."""

    cluster: Any  # stage.localstack.ray_cluster.RayCluster
    sims: list[Any]  # stage.sim.dcgm_exporter.DcgmExporterSim, sims[i - 1] for worker i
    api: httpx.Client  # Argus's API with an operator token
    code_dir: Path  # where job scripts are copied: inside Argus's job_code_roots
    python: str = sys.executable

    def prepare_code(self) -> None:
        self.code_dir.mkdir(parents=True, exist_ok=True)
        for script in ("gloo_steps.py", "cuda_oom.py", "idle_gpus.py", "host_oom.py"):
            shutil.copy(JOBS_DIR / script, self.code_dir / script)
        (self.code_dir / "train.py").write_text(RESUMABLE_TRAINER)

    def submit(self, name: str, args: str, **fields: Any) -> str:
        """Submit `<python> <args>` from the code dir; `fields`: more of the JobSpec (e.g. resources, to pin it)."""
        spec = {"name": name, "workload": "custom", "entrypoint": f"{self.python} {args}", "owner": "demo",
                "code_path": str(self.code_dir), "working_dir": str(self.code_dir), **fields}
        response = self.api.post("/v1/jobs", json=spec)
        if response.status_code not in (201, 202):  # 202: queued, it starts as soon as Argus reads room for it
            raise ArgusError(f"Argus refused the demo job {name}: {response.status_code} {response.text[:300]}")
        return response.json()["job"]["submission_id"]

    def logs(self, sid: str) -> str:
        response = self.api.get(f"/v1/jobs/{sid}/logs", params={"tail": 200})
        return response.text if response.status_code == 200 else ""

    def wait_log(self, sid: str, needle: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logs(sid)
            if needle in text:
                return text
            status = self.api.get(f"/v1/jobs/{sid}").json()["job"].get("status")
            if status in {"FAILED", "STOPPED", "SUCCEEDED"}:
                raise ArgusError(f"the demo job {sid} ended ({status}) before printing {needle!r}",
                                 hint=f"its log: {text[-500:]}")
            time.sleep(0.5)
        raise ArgusError(f"the demo job {sid} did not print {needle!r} within {timeout:.0f} s")

    def ended_at(self, sid: str) -> float | None:
        """Ray's end time of a job, as time.time(); None while it runs."""
        response = self.api.get(f"/v1/jobs/{sid}")
        ended = response.json()["job"].get("ended_at") if response.status_code == 200 else None
        return datetime.fromisoformat(ended).timestamp() if ended else None

    def running_jobs(self) -> list[str]:
        items = self.api.get("/v1/jobs").json().get("items", [])
        return [j["submission_id"] for j in items if j.get("status") in {"PENDING", "RUNNING"}]


def hung_rank(ctx: DemoContext) -> Injection:
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    sid = ctx.submit("pretrain", "gloo_steps.py --steps 100000 --interval-start 0.5 --interval-end 0.5 "
                                 "--timeout 600")
    ctx.wait_log(sid, "step 10 ")  # enough steps for Argus to learn the job's rhythm
    job_id = JobSubmissionClient(ctx.cluster.dashboard_url).get_job_info(sid).job_id
    if job_id is None:  # Ray sets it when the driver starts, and the driver has logged steps by now
        raise RuntimeError(f"Ray has no job id for submission {sid} although it runs: check `ray job status {sid}`")
    worker2 = ctx.cluster.worker(2).node_id
    actors = list_actors(address=ctx.cluster.dashboard_url, raise_on_missing_output=False,
                         filters=[("class_name", "=", "Rank"), ("state", "=", "ALIVE"), ("job_id", "=", job_id)])
    [rank1] = [a for a in actors if a.node_id == worker2]
    process = psutil.Process(rank1.pid)
    process.send_signal(signal.SIGSTOP)
    at = time.time()

    def thaw() -> None:  # a stopped process ignores SIGTERM until it runs again
        try:
            process.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass

    return Injection(at, submission_id=sid, note=f"rank 1 (pid {rank1.pid}) stopped", undo=[thaw])


def cuda_oom(ctx: DemoContext) -> Injection:
    sim = ctx.sims[0]
    total = sim.state()["gpus"][0]["fb_total_mib"]
    sim.set_gpu(0, util=97, fb_used_mib=total - 18, power_w=610.0)
    sid = ctx.submit("sft", "cuda_oom.py --node worker1 --steps 8")
    at = time.time()
    return Injection(at, submission_id=sid, note="the job fails on its own a few seconds after it starts",
                     at_job_end=True, undo=[lambda: sim.set_gpu(0, util=0, fb_used_mib=0, power_w=70.0)])


def xid(ctx: DemoContext) -> Injection:
    sim = ctx.sims[0]
    sim.set_gpu(3, xid=79, util=0, power_w=40.0)
    uuid = sim.state()["gpus"][3]["uuid"]
    return Injection(time.time(), gpu_uuid=uuid, note=f"GPU 3 of worker 1 ({uuid})")


def idle_gpus(ctx: DemoContext) -> Injection:
    sid = ctx.submit("rollout", "idle_gpus.py --node worker2 --gpus 4")
    ctx.wait_log(sid, "waiting for rollout workers")
    return Injection(time.time(), submission_id=sid, note="4 GPUs held at 0% utilisation")


def host_oom(ctx: DemoContext) -> Injection:
    cluster = ctx.cluster
    mem = psutil.virtual_memory()
    budget_mib = min(HOST_OOM_MAX_BUDGET, (mem.available // 4) >> 20)
    if budget_mib < (HOST_OOM_HEADROOM >> 20) + 256:
        raise ArgusError(f"only {mem.available >> 20} MiB of host memory available: too little for the host OOM",
                         hint="free some memory and run the demo again")
    threshold = min(0.99, (mem.total - mem.available + HOST_OOM_HEADROOM) / mem.total)
    # Worker 2 alone gets the low threshold, through a planned restart (and back to Ray's default after).
    planned_restart(cluster, 2, "for the host OOM fault",
                    env={"RAY_memory_usage_threshold": f"{threshold:.4f}", "RAY_memory_monitor_refresh_ms": "100"})
    sid = ctx.submit("dataprep", f"host_oom.py --node worker2 --budget-mib {budget_mib}")
    return Injection(time.time(), submission_id=sid, at_job_end=True,
                     note=f"kill threshold {threshold:.1%} of host memory on worker 2",
                     undo=[lambda: planned_restart(cluster, 2, "back to the default memory threshold")])


# A drain without a deadline ends a node only once it is idle, and a task or detached actor left on it by an earlier
# job keeps it busy for as long as it runs. With a deadline Ray still ends an idle node at once; a busy one is killed
# here once its deadline has passed, and Ray then records the drain's reason as its death, as for a cloud's
# preemption (measured on Ray 2.60: a drained node running a job, its raylet killed after the deadline, is DEAD with
# death reason AUTOSCALER_DRAIN_PREEMPTED and the drain's message; killed before it, an unexpected termination).
PLANNED_RESTART_DRAIN_DEADLINE_S = 8


def planned_restart(cluster: Any, index: int, why: str, env: dict[str, str] | None = None) -> None:
    """Restart a worker the way Argus's control plane takes a node out on purpose: drain it with a deadline and the
    "argus:" reason the lost-node detector knows as planned (an idle node is ended at once, a busy one is killed past
    its deadline), then start it again."""
    node = cluster.worker(index)
    reason = commands.check_message(f"argus: planned restart of worker {index} {why}")
    result = LocalRunner().run(commands.drain(cluster.gcs_address, node.node_id, reason, ray_bin=RAY_BIN,
                                              deadline_s=PLANNED_RESTART_DRAIN_DEADLINE_S))
    if not result.ok:
        raise ArgusError(f"could not drain worker {index} before restarting it: {result.describe()}")
    try:  # the wait outlasts the deadline, which Ray counted from the drain above
        cluster.wait_node_state(node.node_id, "DEAD", timeout=PLANNED_RESTART_DRAIN_DEADLINE_S + 2)
    except TimeoutError:
        # Still busy past its deadline: end it as a cloud ends a preempted VM. Not with a SIGTERM: the raylet answers
        # one with a drain of its own ("Node received SIGTERM; draining before shutdown.", a later deadline) that
        # replaces ours, and a stop before that deadline is then an unexpected termination (seen in the GCS log).
        cluster.kill_worker(index)
        cluster.wait_node_state(node.node_id, "DEAD", timeout=60)
    cluster.restart_worker(index, timeout=120, env=env)


def node_lost(ctx: DemoContext) -> Injection:
    sid = ctx.submit("grpo", "train.py")
    text = ctx.wait_log(sid, "step:6 ")  # a checkpoint exists from step 5 on
    rank_node = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("RANK_NODE="))
    [worker] = [w for w in ctx.cluster.workers if w.node_id == rank_node]
    at = ctx.cluster.kill_worker(worker.index)
    return Injection(at, submission_id=sid, node_ip=worker.ip, note=f"worker {worker.index} ({worker.ip}) killed")


INJECTORS: dict[str, Callable[[DemoContext], Injection]] = {
    "hung_rank": hung_rank,
    "cuda_oom": cuda_oom,
    "xid": xid,
    "idle_gpus": idle_gpus,
    "host_oom": host_oom,
    "node_lost": node_lost,
}


def is_its_incident(incident: Incident, injection: Injection) -> bool:
    """Whether an incident is about this injection's job or node (category aside: the table shows it)."""
    if incident.detected_at.timestamp() < injection.at - 1.0:
        return False
    refs = refs_of(incident)
    if injection.submission_id and injection.submission_id in refs.submission_ids:
        return True
    if injection.gpu_uuid:
        uuid = injection.gpu_uuid
        return uuid in (incident.subject.id, incident.subject.name) or uuid in incident.summary
    if injection.node_ip:
        instance = incident.attrs.get("instance")  # an Alertmanager alert's scrape target, host:port
        names = {incident.subject.name, refs.node_ip, instance.split(":")[0] if isinstance(instance, str) else None}
        return injection.node_ip in names or injection.node_ip in incident.summary
    return False
