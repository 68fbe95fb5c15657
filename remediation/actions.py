"""The four remediation steps. Each takes the incident and returns an Outcome (succeeded, failed or skipped,
with what it did); none raises for a failure of the cluster, and each is safe to run again:

- keep_scene: what a person needs to debug, into `<shared>/jobs/<sid>/scene/<incident>/` with a manifest:
  the incident and findings, Ray's view of the job (job, actors, tasks, placement groups), stack dumps of
  the job's processes through the dashboard (py-spy; needs RAY_DASHBOARD_ENABLE_PROFILING=1 on the head),
  each process's state letter, the driver log tail, the ranks' PyTorch flight recorder dumps where the job
  turned the recorder on (collectors/flight_recorder.py), the spec and submit call, the node's Ray state, and
  its kernel log over SSH when Argus manages the node.
- drain_node: through the node manager when Argus manages the node; otherwise `ray drain-node` from this
  host (a GCS request); a node Ray has already removed needs nothing.
- resubmit_job: the job again under the deterministic id `<root>-r<n>`: from its JobSpec when Argus submitted
  it, else from Ray's own record of it (control/adopt.py: a `ray job submit` job is adopted, or said to be
  unsafe to run again, and why). It resumes from the chain's newest checkpoint the way its trainer takes one
  (remediation/resume.py: verl's Hydra overrides, a resume flag, ARGUS_RESUME_FROM); one that would start from
  scratch is resubmitted only when the step's params say `from_scratch: true`, and the result says which. Ray
  refuses a second job with one id, so a retried resubmit can never start the job twice. A job still
  running (a hang) is stopped first. Drained nodes take no new work, so the new job lands elsewhere. The new
  job's Ray metadata names the job it resubmits (core.lineage): detectors close the fault's incident once it runs.
- stop_job: stop the job (idle GPUs held past the grace period).

One module past 400 lines on purpose: the four steps share the scene writer, the job and node lookups and the
rule for which jobs a step may touch; apart, each would need the others' private helpers.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from collectors.flight_recorder import FlightRecorderReader, NodeCommand
from collectors.rank_stacks import (
    ProcessStates,
    gpus_or_none,
    job_processes,
    parse_ps_states,
    take_job_stacks,
)
from collectors.ray_api import RayStateApi
from control import commands
from control.adopt import RaySubmission, package_exists, read_submission
from control.jobs import JobController
from control.jobspec import JobSpec
from control.node_manager import NodeManager, plain_dict
from control.nodes import NodeRecord, NodeRegistry, NodeState
from control.queue import JobQueue, QueueState
from control.ssh import CommandRunner
from core.errors import ArgusError, Conflict, NotFound
from core.jobfolder import JobFolder, JobFolders
from core.lineage import Lineage, resubmission_id
from core.refs import refs_of
from core.types import ActionState, Incident, utcnow
from detectors.hang_stacks import localize, ranks_of
from detectors.timestamps import parse_iso
from remediation.resume import ResumePlan, exit_status_is_the_trainers, plan_resume

ACTOR = "argus-remediation"
KERNEL_LOG = ["sh", "-c", "dmesg -T 2>/dev/null | tail -n 300 || journalctl -k -n 300 --no-pager"]
RAY_BIN = str(Path(sys.executable).parent / "ray")
ENDED_BEFORE_SLACK = timedelta(seconds=30)  # see _ended_apart


@dataclass(frozen=True)
class Outcome:
    state: ActionState
    message: str
    data: dict[str, Any] = field(default_factory=dict)


def done(message: str, **data: Any) -> Outcome:
    return Outcome(ActionState.SUCCEEDED, message, data)


def failed(message: str, **data: Any) -> Outcome:
    return Outcome(ActionState.FAILED, message, data)


def skipped(message: str, **data: Any) -> Outcome:
    return Outcome(ActionState.SKIPPED, message, data)


@dataclass
class Context:
    """The outside world the steps act on."""

    jobs: JobController
    registry: NodeRegistry
    nodes: NodeManager | None
    dashboard_url: str
    gcs_address: str | None
    local: CommandRunner
    store: Any = None
    clock: Callable[[], datetime] = utcnow
    request_timeout_s: float = 10.0
    stop_wait_s: float = 60.0
    # Resubmissions of jobs Argus submitted wait in it for capacity (a replacement node) instead of failing in Ray;
    # None: submitted straight to Ray.
    queue: JobQueue | None = None

    @property
    def shared_root(self) -> Path:
        return self.jobs.shared_root

    @property
    def folders(self) -> JobFolders:
        return JobFolders(self.shared_root)


# -- targets ---------------------------------------------------------------------------------------------


def jobs_of(incident: Incident) -> list[str]:
    """Submission ids the incident is about: its job, or the jobs that had work on its node (core.refs)."""
    return refs_of(incident).actionable_submission_ids


def node_of(incident: Incident) -> tuple[str | None, str | None]:
    """(Ray node id, node IP) the incident is about, when it names one (core.refs)."""
    refs = refs_of(incident)
    return refs.node_id, refs.node_ip


def registered_node(registry: NodeRegistry, node_id: str | None, ip: str | None) -> NodeRecord | None:
    for record in registry.list():
        spec = record.spec
        if (node_id and record.ray_node_id == node_id) or (ip and ip in {spec.node_ip, spec.host}):
            return record
    return None


# -- keep_scene --------------------------------------------------------------------------------------------


def keep_scene(ctx: Context, incident: Incident, params: dict[str, Any], dry_run: bool) -> Outcome:
    # Every job the incident names gets its scene in its own folder, a job Argus did not submit too.
    sids = jobs_of(incident)
    folders = [ctx.folders.of(s).scene_of(incident.id) for s in sids] or [ctx.folders.scene_of(incident.id)]
    if dry_run:
        return skipped(f"would keep the scene in {', '.join(map(str, folders))}", dry_run=True,
                       folders=[str(f) for f in folders])
    problems: list[str] = []
    written: dict[str, list[str]] = {}
    stuck: list[str] = []
    jobs: list[str | None] = [*sids] or [None]  # no job: one scene folder for the incident
    for folder, sid in zip(folders, jobs, strict=False):
        scene = _Scene(folder)
        scene.json("incident.json", {"incident": incident.model_dump(mode="json"),
                                     "findings": [f.model_dump(mode="json") for f in _findings(ctx, incident)]})
        if sid is not None:
            if said := _job_scene(ctx, scene, sid):
                stuck.append(f"{sid}: {said}")
        _node_scene(ctx, scene, incident)
        scene.json("manifest.json", {"incident": incident.id, "job": sid, "kept_at": ctx.clock().isoformat(),
                                     "files": scene.files, "problems": scene.problems})
        written[str(folder)] = scene.files
        problems += scene.problems
    message = f"scene kept in {', '.join(written)} ({sum(len(v) for v in written.values())} files)"
    if stuck:
        message += f"; the ranks' stacks: {'; '.join(stuck)[:600]}"
    if problems:
        message += f"; could not get: {'; '.join(problems)[:600]}"
    return done(message, folders=list(written), problems=problems, stacks=stuck)


class _Scene:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.files: list[str] = []
        self.problems: list[str] = []

    def text(self, name: str, text: str) -> None:
        self.binary(name, text.encode("utf-8"))

    def json(self, name: str, data: Any) -> None:
        self.text(name, json.dumps(data, indent=2, default=str) + "\n")

    def binary(self, name: str, data: bytes) -> None:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.files.append(name)

    def attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a part of the scene that cannot be had is noted, not fatal
            self.problems.append(f"{what}: {getattr(exc, 'message', None) or exc}"[:300])
            return None


def _findings(ctx: Context, incident: Incident) -> list[Any]:
    try:
        return ctx.store.findings_for(incident.id) if ctx.store is not None else []
    except ArgusError:
        return []


def ray_list(ctx: Context, fn: str, **kwargs: Any) -> list[dict[str, Any]]:
    """`ray.util.state.<fn>` as plain dicts; SourceUnavailable when Ray does not answer."""
    from collectors.ray_api import RayStateApi

    api = RayStateApi(ctx.dashboard_url, ctx.request_timeout_s)
    return [plain_dict(x) for x in api.call(fn, **kwargs)]


def _job_scene(ctx: Context, scene: _Scene, sid: str) -> str | None:
    """The job's part of the scene; returns what its ranks' stacks say of a hang (None without stacks)."""
    folder = ctx.folders.of(sid)
    info = scene.attempt("the job from Ray", lambda: ctx.jobs.client.get_job_info(sid))
    job_id = getattr(info, "job_id", None)
    if info is not None:
        scene.json("ray/job.json", plain_dict(info) if not isinstance(info, dict) else info)
    for source in (folder.spec_file, folder.submit_file, folder.status_file, folder.adopted_file):
        if source.is_file():
            scene.text(f"config/{source.name}", source.read_text(encoding="utf-8", errors="replace"))
    if not folder.spec_file.is_file():  # not submitted through Argus: what it was submitted with, from Ray
        submission = scene.attempt("Ray's record of the submission", lambda: read_submission(
            ctx.dashboard_url, sid, timeout_s=ctx.request_timeout_s, list_actors=partial(ray_list, ctx, "list_actors")))
        if submission is not None:
            scene.json("config/ray_submission.json", submission.as_json())
    tail = scene.attempt("the driver log", lambda: ctx.jobs.tail(sid, 2000))
    if tail:
        scene.text("logs/driver-tail.log", tail)
    if not job_id:
        scene.problems.append("Ray's job id (the job is unknown to Ray): no actors, tasks or stacks")
        return None
    actors = scene.attempt("actors", lambda: ray_list(ctx, "list_actors", filters=[("job_id", "=", job_id)],
                                                    detail=True)) or []
    scene.json("ray/actors.json", actors)
    tasks = scene.attempt("tasks", lambda: ray_list(ctx, "list_tasks", filters=[("job_id", "=", job_id)])) or []
    scene.json("ray/tasks.json", tasks[:2000])
    groups = scene.attempt("placement groups", lambda: ray_list(ctx, "list_placement_groups", detail=True)) or []
    scene.json("ray/placement_groups.json", [g for g in groups if g.get("creator_job_id") == job_id])
    api = RayStateApi(ctx.dashboard_url, ctx.request_timeout_s)
    found = scene.attempt("the job's processes", lambda: job_processes(api, sid))
    if found is None or not found.processes:
        return None
    stacks = take_job_stacks(ctx.dashboard_url, found.processes, states=_process_states(ctx),
                             gpus=gpus_or_none(api, found.actors))
    for stack in stacks:
        if stack.dump is not None:
            scene.text(f"stacks/{_safe(stack.label)}-{stack.pid}.txt", stack.dump)
        else:
            scene.problems.append(f"stack of {stack.label} pid {stack.pid}: {stack.error}"[:300])
    scene.json("stacks/processes.json", [{k: v for k, v in s.as_attrs().items() if k != "dump"} for s in stacks])
    recorded = _flight_records(ctx, scene, found.processes, info)
    ranks = ranks_of([s.as_attrs() for s in stacks])
    if not ranks or all(r.label.startswith("driver ") for r in ranks):
        return recorded
    located = localize(ranks)
    scene.json("stacks/localization.json", located.as_json())
    return located.sentence + (f"; {recorded}" if recorded else "")


def _on_node(ctx: Context) -> NodeCommand | None:
    """A command on a node Argus manages, over SSH: its stdout, or None when the node is not Argus's or it failed."""
    manager = ctx.nodes
    if manager is None:
        return None

    def run(ip: str, argv: Sequence[str]) -> str | None:
        record = registered_node(ctx.registry, None, ip)
        if record is None:
            return None
        outcome = manager.runner_factory(record.spec).run(list(argv), timeout_s=30)
        return outcome.stdout if outcome.ok or outcome.stdout else None  # ps says 1 when one pid is gone

    return run


def _process_states(ctx: Context) -> ProcessStates:
    """Process states from /proc on this host, and over SSH on the nodes Argus manages."""
    on_node = _on_node(ctx)
    if on_node is None:
        return ProcessStates()

    def over_ssh(ip: str, pids: Sequence[int]) -> dict[int, str]:
        out = on_node(ip, ["ps", "-o", "pid=,stat=", "-p", ",".join(str(p) for p in pids)])
        return parse_ps_states(out) if out else {}

    return ProcessStates(remote=over_ssh)


def _flight_records(ctx: Context, scene: _Scene, processes: Sequence[tuple[str, int, str | None, str | None]],
                    info: Any) -> str | None:
    """The ranks' flight recorder dumps, where the job turned the recorder on; what they say, in one sentence."""
    runtime_env = getattr(info, "runtime_env", None) or {}
    env = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
    started = getattr(info, "start_time", None)  # ms since the epoch
    since = datetime.fromtimestamp(started / 1000, timezone.utc) if isinstance(started, int | float) else None
    records = scene.attempt("flight recorder dumps", lambda: FlightRecorderReader(_on_node(ctx)).read(
        [(pid, ip) for _, pid, _, ip in processes],  # the driver too: under torchrun it is where the ranks start
        job_env=env if isinstance(env, dict) else None, since=since))
    if records is None or not records.enabled:
        return None
    for dump in records.dumps:
        if dump.data is not None:
            scene.binary(f"flight_recorder/{_safe(dump.node_ip)}/{_safe(Path(dump.path).name)}", dump.data)
    scene.json("flight_recorder/index.json", records.as_json())
    scene.problems.extend(records.problems)
    return records.sentence() or None


def _node_scene(ctx: Context, scene: _Scene, incident: Incident) -> None:
    node_id, ip = node_of(incident)
    if not node_id and not ip:
        return
    nodes = scene.attempt("Ray's node list", lambda: ray_list(ctx, "list_nodes", detail=True)) or []
    mine = [n for n in nodes if n.get("node_id") == node_id or (ip and n.get("node_ip") == ip)]
    scene.json("node/ray_node.json", mine)
    record = registered_node(ctx.registry, node_id, ip)
    if record is None or ctx.nodes is None:
        scene.problems.append("kernel log: the node is not managed by Argus (no SSH access)")
        return
    manager = ctx.nodes
    outcome = scene.attempt("kernel log over SSH",
                            lambda: manager.runner_factory(record.spec).run(KERNEL_LOG, timeout_s=30))
    if outcome is not None:
        scene.text("node/kernel.log", outcome.stdout if outcome.ok else outcome.describe())


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:60]


# -- drain_node ----------------------------------------------------------------------------------------------


def drain_node(ctx: Context, incident: Incident, params: dict[str, Any], dry_run: bool) -> Outcome:
    node_id, ip = node_of(incident)
    if not node_id and not ip:
        return skipped("the incident names no node to drain")
    record = registered_node(ctx.registry, node_id, ip)
    reason = f"incident {incident.id} {incident.category.value}"
    who = record.name if record else (ip or node_id)
    if dry_run:
        return skipped(f"would drain node {who}", dry_run=True)
    if record is not None and ctx.nodes is not None:
        if record.state in (NodeState.DRAINING, NodeState.OFFLINE):
            return done(f"node {record.name} is already {record.state.value}")
        if record.state is not NodeState.ONLINE:
            return skipped(f"node {record.name} is {record.state.value}: nothing runs there to drain")
        outcome = ctx.nodes.drain(record.name, actor=ACTOR, reason=reason)
        return (done if outcome.ok else failed)(outcome.message, node=record.name, state=outcome.state.value)
    alive = [n for n in ray_list(ctx, "list_nodes", detail=True)
             if n.get("state") == "ALIVE" and (n.get("node_id") == node_id or (ip and n.get("node_ip") == ip))]
    if not alive:
        return done(f"Ray no longer lists node {who} alive: no work can be scheduled there", node=who)
    if not ctx.gcs_address:
        return failed(f"node {who} is alive in Ray but Argus has no GCS address to drain it",
                      hint="set ray_gcs_address")
    argv = commands.drain(ctx.gcs_address, alive[0]["node_id"], commands.check_message(f"argus: {reason}"[:200]),
                          ray_bin=RAY_BIN)
    result = ctx.local.run(argv)
    if not result.ok:
        return failed(f"ray drain-node for {who} failed: {result.describe()}")
    return done(f"Ray accepted the drain of node {who} ({alive[0]['node_id'][:12]})", node=who)


# -- resubmit_job --------------------------------------------------------------------------------------------


def chain_of(folder: JobFolder) -> tuple[str, int]:
    """(the first job of the chain of resubmissions the folder's job belongs to, the attempt number of it)."""
    try:
        info = json.loads(folder.resubmit_file.read_text(encoding="utf-8"))
        return str(info["root"]), int(info["attempt"])
    except (OSError, ValueError, KeyError, TypeError):
        return folder.submission_id, 0


def resubmit_job(ctx: Context, incident: Incident, params: dict[str, Any], dry_run: bool) -> Outcome:
    results: list[dict[str, Any]] = []
    for sid in jobs_of(incident):
        results.append(_resubmit_one(ctx, incident, sid, dry_run, params))
    if not results:
        return skipped("the incident names no job to resubmit")
    submitted = [r for r in results if r["state"] in ("submitted", "queued")]
    problems = [r for r in results if r["state"] == "failed"]
    summary = "; ".join(r["message"] for r in results)
    if dry_run:
        return skipped(summary, dry_run=True, jobs=results)
    if problems:
        return failed(summary, jobs=results)
    return (done if submitted or all(r["state"] == "exists" for r in results) else skipped)(summary, jobs=results)


def next_submission_id(root: str, attempt: int) -> str:
    return resubmission_id(root, attempt)


def _resubmit_one(ctx: Context, incident: Incident, sid: str, dry_run: bool,
                  params: dict[str, Any]) -> dict[str, Any]:
    folder = ctx.folders.of(sid)
    root, attempt = chain_of(folder)
    new_sid = next_submission_id(root, attempt + 1)
    try:
        record = ctx.jobs.get(sid)
    except NotFound:
        record = None
    source = _source_of(ctx, sid, folder)
    entrypoint = source.entrypoint if isinstance(source, _Source) else None
    if record is not None and (why := _ended_apart(record, incident, folder, entrypoint)):
        return {"job": sid, "state": "skipped", "message": f"job {sid} {why}: not resubmitted"}
    if isinstance(source, str):
        return {"job": sid, "state": "skipped", "message": f"job {sid} cannot be resubmitted safely: {source}"}
    plan = plan_resume(source.entrypoint, env=source.env, metadata=source.metadata,
                       chain_folders=chain_folders(ctx.folders, sid), cwd=source.cwd, adopted=source.adopted)
    resume = {"resumes": plan.resumes, "how": plan.how, "resume": plan.describe(),
              "step": plan.checkpoint.step if plan.checkpoint else None,
              "checkpoint": str(plan.checkpoint.path) if plan.checkpoint else None, "adopted": source.adopted}
    if not plan.resumes and not params.get("from_scratch", False):
        return {"job": sid, "state": "skipped", **resume,
                "message": f"job {sid} not resubmitted: it would start from scratch ({plan.problem}); the policy "
                           f"resubmits from scratch only where its resubmit_job step says from_scratch: true"}
    entry = plan.entrypoint if plan.resumes else source.entrypoint
    if dry_run:
        return {"job": sid, "state": "would", "new": new_sid, **resume,
                "message": f"would resubmit {sid} as {new_sid} {plan.describe()}"}
    if record is not None and not record.ended:
        ctx.jobs.stop(sid, reason=f"resubmitting as {new_sid} (incident {incident.id})")
        deadline = time.monotonic() + ctx.stop_wait_s
        while not ctx.jobs.get(sid).ended and time.monotonic() < deadline:
            time.sleep(0.5)
    lineage = Lineage(of=sid, root=root, attempt=attempt + 1)
    marker = {"of": sid, "root": root, "attempt": attempt + 1, "incident": incident.id, **resume,
              "at": ctx.clock().isoformat()}
    if source.spec is not None and ctx.queue is not None:
        return _enqueue(ctx, incident, source.spec.model_copy(update={
            "submission_id": new_sid, "resume": plan.resumes, "entrypoint": entry}), sid, plan, lineage, marker, resume)
    for _ in range(2):
        try:
            if source.spec is not None:
                new = source.spec.model_copy(update={"submission_id": new_sid, "resume": plan.resumes,
                                                     "entrypoint": entry})
                ctx.jobs.submit(new, resume_from=plan.checkpoint.path if plan.resumes and plan.checkpoint else None,
                                lineage=lineage)
            else:
                assert source.submission is not None
                call = source.submission.call(new_sid, entrypoint=entry, env=plan.env if plan.resumes else {},
                                              metadata=lineage.metadata())
                ctx.jobs.submit_again(call, source=source.submission.as_json())
            break
        except Conflict:
            # A retry after a crash. If Ray has the job, this attempt happened: never a second one. If only
            # the folder exists, the crash came between making it and Ray's answer: it is ours, and empty.
            try:
                ctx.jobs.get(new_sid)
            except NotFound:
                shutil.rmtree(ctx.folders.of(new_sid).root, ignore_errors=True)
                continue
            return {"job": sid, "state": "exists", "new": new_sid, **resume,
                    "message": f"{new_sid} was already submitted"}
        except ArgusError as exc:
            return {"job": sid, "state": "failed", "new": new_sid, **resume,
                    "message": f"resubmitting {sid} failed: {exc.message}"}
    ctx.folders.of(new_sid).resubmit_file.write_text(json.dumps(marker, indent=2) + "\n")
    logger.bind(incident=incident.id).info("resubmitted {} as {} (attempt {}) {}", sid, new_sid, attempt + 1,
                                           plan.describe())
    return {"job": sid, "state": "submitted", "new": new_sid, "attempt": attempt + 1, **resume,
            "message": f"resubmitted {sid} as {new_sid} {plan.describe()}"}


def _enqueue(ctx: Context, incident: Incident, spec: JobSpec, sid: str, plan: ResumePlan, lineage: Lineage,
             marker: dict[str, Any], resume: dict[str, Any]) -> dict[str, Any]:
    """The resubmission through the job queue: it starts now when its gang fits, else waits for capacity (a node
    that replaces the lost one) with the reason. Its id is the chain's next: queued twice, it is there once."""
    assert ctx.queue is not None and spec.submission_id is not None
    new_sid = spec.submission_id
    try:
        entry = ctx.queue.submit(spec, resume_from=plan.checkpoint.path if plan.resumes and plan.checkpoint else None,
                                 lineage=lineage, resubmit_marker=marker)
    except Conflict:
        return {"job": sid, "state": "exists", "new": new_sid, **resume,
                "message": f"{new_sid} was already submitted or queued"}
    except ArgusError as exc:
        return {"job": sid, "state": "failed", "new": new_sid, **resume,
                "message": f"resubmitting {sid} failed: {exc.message}"}
    queued = entry.state is QueueState.QUEUED
    logger.bind(incident=incident.id).info("resubmitted {} as {} (attempt {}) {}{}", sid, new_sid, lineage.attempt,
                                           plan.describe(), f"; queued: {entry.reason}" if queued else "")
    return {"job": sid, "state": "queued" if queued else "submitted", "new": new_sid, "attempt": lineage.attempt,
            **resume, "queue": {"state": entry.state.value, "reason": entry.reason},
            "message": f"resubmitted {sid} as {new_sid} {plan.describe()}"
                       + (f"; it waits in the queue: {entry.reason}" if queued else "")}


@dataclass(frozen=True)
class _Source:
    """What a job was submitted with: its JobSpec (submitted through Argus) or Ray's record (adopted)."""

    entrypoint: str
    env: dict[str, str]
    metadata: dict[str, str]
    cwd: str | None
    spec: JobSpec | None = None
    submission: RaySubmission | None = None

    @property
    def adopted(self) -> bool:
        return self.spec is None


def _source_of(ctx: Context, sid: str, folder: JobFolder) -> _Source | str:
    """The job's source, or why it cannot be submitted again safely."""
    if folder.spec_file.is_file():
        spec = JobSpec.load(folder.spec_file)
        call = _json_file(folder.submit_file)
        env = (call.get("runtime_env") or {}).get("env_vars") or {}
        return _Source(spec.entrypoint, {str(k): str(v) for k, v in env.items()},
                       {str(k): str(v) for k, v in (call.get("metadata") or {}).items()}, spec.working_dir, spec=spec)
    try:
        submission = read_submission(ctx.dashboard_url, sid, timeout_s=ctx.request_timeout_s,
                                     list_actors=partial(ray_list, ctx, "list_actors"))
    except NotFound:
        return "Ray no longer keeps its record (entrypoint, runtime_env), and Argus did not submit it"
    except ArgusError as exc:
        return f"Ray's record of it could not be read ({exc.message})"
    if not submission.resources_known:
        return ("Ray no longer lists its supervisor actor, so the resources its driver asked for are not known; "
                "submit it again by hand")
    for uri in submission.packages():
        exists = package_exists(ctx.dashboard_url, uri, timeout_s=ctx.request_timeout_s)
        if not exists:
            state = "is gone from" if exists is False else "may be gone from (the dashboard did not say)"
            return (f"its runtime_env package {uri} {state} the GCS (Ray drops a package once no job uses it); "
                    "submit it again with `ray job submit --working-dir`")
    working_dir = submission.runtime_env.get("working_dir")
    cwd = working_dir if isinstance(working_dir, str) and working_dir.startswith("/") else None
    return _Source(submission.entrypoint, submission.env, submission.metadata, cwd, submission=submission)


def chain_folders(folders: JobFolders, sid: str, limit: int = 50) -> list[Path]:
    """The folders of `sid`'s chain of resubmissions that exist, itself first, then each job it resubmits."""
    out: list[Path] = []
    current: str | None = sid
    while current and len(out) < limit:
        try:
            folder = folders.of(current)
        except ArgusError:
            break
        if folder.exists() and folder.root not in out:
            out.append(folder.root)
        previous = _json_file(folder.resubmit_file).get("of")
        current = previous if isinstance(previous, str) and previous != current else None
    return out


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ended_apart(record: Any, incident: Incident, folder: JobFolder, entrypoint: str | None = None) -> str | None:
    """Why a job that already ended is none of this incident's business, or None when it is.

    A lost node names every job that ever had work there; one that finished, was stopped (by a person, by a
    timeout, or by an earlier resubmission), or failed well before this fault must not come back because of
    it (the fault's time: the node's death where known, else the incident's first evidence). A job this
    incident's own step stopped (a run repeated after a crash) is still this incident's. The
    slack covers failures whose evidence was read a poll or two after the job ended."""
    if not record.ended:
        return None
    if record.status == "SUCCEEDED" and (entrypoint is None or exit_status_is_the_trainers(entrypoint)):
        return "had already succeeded"
    # SUCCEEDED from a trainer piped into `tee` says only that tee succeeded: the time rule below decides.
    if record.status == "STOPPED" or record.mark in ("stopped", "timed_out"):
        try:
            reason = json.loads(folder.status_file.read_text(encoding="utf-8")).get("reason", "")
        except (OSError, ValueError, AttributeError):
            reason = ""
        if f"(incident {incident.id})" in str(reason):
            return None
        return "had been stopped on purpose" + (f" ({reason})" if reason else "")
    # A node's death time is exact; first_seen may be pulled earlier by echoes filed into the incident.
    fault_at = parse_iso(incident.attrs.get("died_at")) or incident.first_seen
    if record.ended_at is not None and record.ended_at < fault_at - ENDED_BEFORE_SLACK:
        return f"had already ended ({record.status}) at {record.ended_at:%H:%M:%S}, before this fault"
    return None


# -- stop_job ------------------------------------------------------------------------------------------------


def stop_job(ctx: Context, incident: Incident, params: dict[str, Any], dry_run: bool) -> Outcome:
    sids = jobs_of(incident)
    if not sids:
        return skipped("the incident names no job to stop")
    if dry_run:
        return skipped(f"would stop {', '.join(sids)}", dry_run=True)
    messages = []
    for sid in sids:
        try:
            record = ctx.jobs.stop(sid, reason=f"incident {incident.id}: {incident.category.value}")
        except NotFound:
            messages.append(f"{sid}: unknown to Ray")
            continue
        messages.append(f"{sid}: {record.message}")
    return done("; ".join(messages))


STEPS: dict[str, Callable[[Context, Incident, dict[str, Any], bool], Outcome]] = {
    "keep_scene": keep_scene,
    "drain_node": drain_node,
    "resubmit_job": resubmit_job,
    "stop_job": stop_job,
}
