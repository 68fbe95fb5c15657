"""Time to recover: a worker running a job's rank is killed; Argus (loop every 1 s, remediation in auto
mode) detects the lost node, keeps the scene, drains the node and resubmits the job from its checkpoint.
Prints, per run and as median/max: kill -> incident, kill -> resubmitted, kill -> new job RUNNING, kill ->
the resumed job's first training step, and the step the new run resumed at beside the job's last whole
checkpoint; and how long the resubmission waited in the job queue for capacity. A figure, not a test: the machine
is shared.

Jobs submitted through Argus go through its job queue (control/queue.py), as `argus serve` sends them. With
`--no-spare` the job's gang is both workers (2 nodes × 4 GPUs): after the kill its resubmission cannot fit, waits in
the queue, and the bench then restarts the killed worker as a replacement node joining; "queued" is that wait.

The job is the stage's trainer with verl's command line and checkpoint layout (stage/localstack/jobs/
hydra_trainer.py), submitted through Argus (a JobSpec, checkpoints in its job folder) or, with `--submit ray`,
with plain `ray job submit` and its output piped into `tee`, as verl's example scripts run it (Argus adopts it).

    .venv/bin/python bench/mttr.py [-n 3] [--submit argus|ray] [--ray-defaults] [--no-spare]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from stage.localstack.jobs import JOBS_DIR  # noqa: E402
from stage.localstack.process import poll_until  # noqa: E402

TRACKER = "latest_checkpointed_iteration.txt"


def ray_job_submit(cluster, sid: str, script: str) -> None:  # type: ignore[no-untyped-def]
    """`ray job submit -- bash -c '<script>'`: the CLI quotes every word it is given, `|` too, so a pipeline
    is written as a shell's script."""
    ray = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray, "job", "submit", "--address", cluster.dashboard_url, "--submission-id", sid, "--no-wait",
                    "--", "bash", "-c", script], check=True, capture_output=True, timeout=120)


def one_run(cluster, work: Path, run: int, submit: str,  # type: ignore[no-untyped-def]
            no_spare: bool = False) -> dict[str, float]:
    from argus.incidents.desk import IncidentDesk
    from argus.pipeline import Pipeline
    from argus.store.store import Store
    from collectors.ray_capacity import RayCapacity
    from collectors.ray_state import RayStateCollector
    from control.jobs import JobController
    from control.jobspec import JobSpec
    from control.local import LocalRunner
    from control.queue import JobQueue, QueueState
    from core.types import ActionState, Category
    from detectors.lost_node import LostNodeDetector
    from remediation.actions import Context
    from remediation.policy import Mode, load_policy
    from remediation.runner import Remediator

    base = work / f"run{run}"
    shared = base / "shared"
    (shared / "code").mkdir(parents=True)
    shutil.copy(JOBS_DIR / "hydra_trainer.py", shared / "code" / "train.py")
    store = Store(f"sqlite:///{base / 'argus.db'}")
    jobs = JobController(cluster.dashboard_url, shared)
    policy = load_policy(mode=Mode.AUTO)
    policy = policy.model_copy(update={"guards": policy.guards.model_copy(
        update={"min_drain_interval_s": 0, "max_drained_share": 1.0})})
    queue = JobQueue(store.job_queue, jobs, RayCapacity(cluster.dashboard_url).read, registry=store.nodes())
    remediator = Remediator(store, policy, Context(jobs=jobs, registry=store.nodes(), nodes=None,
                                                   dashboard_url=cluster.dashboard_url,
                                                   gcs_address=cluster.gcs_address, local=LocalRunner(), store=store,
                                                   queue=queue))
    pipeline = Pipeline(collectors=[RayStateCollector(cluster.dashboard_url, timeout_s=10)],
                        detectors=[LostNodeDetector(lookback_s=30)], incidents=IncidentDesk(store))
    args = (f"{sys.executable} train.py data.train_files={shared}/train.parquet actor_rollout_ref.model.path="
            f"{shared}/model trainer.project_name=bench trainer.experiment_name=run{run} trainer.save_freq=5")
    if submit == "ray":
        sid, ckpt = f"mttr-plain-{run}", shared / "ckpt"
        ray_job_submit(cluster, sid, f"cd {shared / 'code'} && {args} trainer.default_local_dir={ckpt} "
                                     f"2>&1 | tee {shared / 'train.log'}")
    else:
        entry = f"{args} trainer.default_local_dir=$ARGUS_JOB_DIR/checkpoints"
        sid = queue.submit(JobSpec(name="mttr", entrypoint=entry, owner="bench", code_path=str(shared / "code"),
                                   working_dir=str(shared / "code"), nnodes=2 if no_spare else 1,
                                   gpus_per_node=4)).submission_id
        ckpt = jobs.folder(sid).checkpoints

    def printed(s: str, key: str):  # type: ignore[no-untyped-def]
        try:
            log = jobs.logs(s)
        except Exception:  # noqa: BLE001 - no driver yet
            return None
        return next((x.split("=", 1)[1] for x in log.splitlines() if x.startswith(key + "=")), None)

    node = poll_until("the rank", lambda: printed(sid, "RANK_NODE"), timeout=180)
    poll_until("a whole checkpoint", lambda: (ckpt / TRACKER).exists(), timeout=180)
    pipeline.run_once()
    index = next(w.index for w in cluster.workers if w.node_id == node)
    killed = time.time()
    cluster.kill_worker(index)
    times: dict[str, float] = {}
    incident = None
    new_sid = f"{sid}-r1"
    replaced = False
    while time.time() - killed < 240:
        queue.tick()  # the daemon's chore
        for opened in pipeline.run_once().opened:
            if opened.category is Category.NODE_LOST and incident is None:
                incident = opened
                times["incident"] = time.time() - killed
                remediator.plan(incident)
        if incident is not None:
            remediator.run_pending()
            actions = store.list_actions(incident.id)
            if "resubmitted" not in times and any(a.kind == "resubmit_job" and a.state is ActionState.SUCCEEDED
                                                  for a in actions):
                times["resubmitted"] = time.time() - killed
        waiting = queue.find(new_sid)
        if waiting is not None and waiting.state is QueueState.QUEUED and no_spare and not replaced:
            cluster.restart_worker(index)  # a replacement node joins the cluster
            replaced = True
            times["node joined"] = time.time() - killed
        if waiting is not None and waiting.waited_s is not None:
            times["queued"] = waiting.waited_s
        if "resubmitted" in times and "running" not in times:
            try:
                if jobs.get(new_sid).status == "RUNNING":
                    times["running"] = time.time() - killed
            except Exception:  # noqa: BLE001 - not there yet
                pass
        if "running" in times:
            try:
                if "step:" in jobs.logs(new_sid):
                    times["first step"] = time.time() - killed
                    times["resumed at"] = float(printed(new_sid, "RESUMED_AT_STEP") or "nan")
                    times["last checkpoint"] = float((ckpt / TRACKER).read_text())
                    break
            except Exception:  # noqa: BLE001 - no driver log yet
                pass
        time.sleep(0.2)
    for record in jobs.list(all_jobs=True):
        if not record.ended:
            jobs.stop(record.submission_id, reason="bench done")
    if not replaced:
        cluster.restart_worker(index)
    store.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="runs")
    parser.add_argument("--ray-defaults", action="store_true", help="Ray's default health check (3 s x 5)")
    parser.add_argument("--submit", choices=("argus", "ray"), default="argus",
                        help="submit the job through Argus (a JobSpec) or with plain `ray job submit`")
    parser.add_argument("--no-spare", action="store_true",
                        help="the job's gang is both workers: its resubmission waits in the queue for a new node")
    args = parser.parse_args()
    from stage.localstack.process import REGISTRY, install_exit_handlers
    from stage.localstack.ray_cluster import RayCluster

    install_exit_handlers()
    console = Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="ag-mttr-"))
    cluster = RayCluster(work / "ray", fast_health_check=not args.ray_defaults, worker_gpus=4)
    REGISTRY.add(cluster)
    rows = []
    try:
        with console.status("starting a Ray head and two workers"):
            cluster.start(timeout=180)
        for run in range(args.n):
            with console.status(f"run {run + 1}/{args.n}: kill, detect, remediate, resume"):
                rows.append(one_run(cluster, work, run, args.submit, args.no_spare))
    finally:
        REGISTRY.stop_all()
    keys = ["incident", "resubmitted", "node joined", "queued", "running", "first step"]
    steps = ["last checkpoint", "resumed at"]
    how = "ray job submit" if args.submit == "ray" else "Argus JobSpec"
    table = Table(title=f"seconds after the kill ({'Ray defaults' if args.ray_defaults else 'fast health check'}; "
                        f"job submitted with {how}{'; no spare node' if args.no_spare else ''}; queued: the "
                        "resubmission's wait in the job queue)")
    table.add_column("run")
    for key in keys:
        table.add_column(key, justify="right")
    for key in steps:
        table.add_column(key + " (step)", justify="right")
    for i, row in enumerate(rows, 1):
        table.add_row(str(i), *(f"{row[k]:.1f}" if k in row else "-" for k in keys),
                      *(f"{row[k]:.0f}" if k in row else "-" for k in steps))
    for name, fn in (("median", statistics.median), ("max", max)):
        table.add_row(name, *(f"{fn([r[k] for r in rows if k in r]):.1f}" if any(k in r for r in rows) else "-"
                              for k in keys), *("" for _ in steps))
    console.print(table)
    return 0


if __name__ == "__main__":
    from stage.localstack.process import StackTimeout

    try:
        sys.exit(main())
    except StackTimeout as exc:  # a step that never came: say which, as before, without a traceback
        sys.exit(exc.message)
