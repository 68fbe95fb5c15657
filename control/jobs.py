"""JobController: submit, list, get, stop, read logs of, and time out Ray jobs through the Jobs SDK.

Each job gets `<shared_root>/jobs/<submission_id>/{config,logs,checkpoints}`. `config/jobspec.yaml` is the
spec, `config/submit.json` the exact submit call, `config/status.json` what the controller did to the job
(stopped on request, timed out). The job sees its folder as $ARGUS_JOB_DIR.

How Ray 2.60 behaves here (measured on the local 3-node cluster, see tests/control/test_jobs_real.py):
- The driver runs on the head unless the submission asks for a resource only workers have. We ask for a
  sliver of a custom resource (`{"worker": 0.001}` by default) so drivers do not use up a worker's CPUs.
- `JobSubmissionClient.get_job_logs` returned only the supervisor's first line ("Runtime env is setting
  up.") for a driver on a worker node. The driver's log file `job-driver-<submission_id>.log` on the
  driver's node is complete: we read it through the dashboard's log API (`/api/v0/logs/file?node_id=&
  filename=&lines=`), with the node from the job's `driver_node_id`. Wrapping the entrypoint in a `tee`
  would lose its exit status under /bin/sh (no pipefail), so we do not. Once a job has ended, its driver
  log is copied to `logs/driver.log`, which is read when the node (and its log) is gone.
- Ray expands `$VAR` / `${VAR}` in every runtime_env env value on the node (os.path.expandvars):
  PYTHONPATH is sent as `<code_path>:${PYTHONPATH}`, so the node's own PYTHONPATH stays after the job's
  code. An empty node PYTHONPATH leaves a trailing ':' (Python reads it as the current directory).
- Errors: an unknown job is a RuntimeError "status code 404"; an unreachable dashboard a ConnectionError
  at client construction, or a requests error later; a duplicate submission id a 500 carrying "already
  exists". All are wrapped into core.errors here.
- `stop_job` returns False for a job already ended; a stopped job is STOPPED a second or two later.
- `start_time` is when Ray accepted the submission; timeouts count from it, for RUNNING and PENDING jobs
  alike: a job whose driver no node can take (a pool nobody joined a node into, resources nobody has) would
  otherwise wait, holding its place, until Ray's own start timeout (RAY_JOB_START_TIMEOUT_SECONDS, 15 min by
  default, which fails it) or forever where that is raised.
- Stopping a PENDING job (read in Ray 2.60's job_manager.py and job_supervisor.py): `stop_job` returns True
  once Ray has registered the job's supervisor actor, and queues the stop on it; the job stays PENDING
  until the actor gets a node, then its driver is started and stopped at once (STOPPED), or Ray's start
  timeout fails it. A job already marked timed_out is therefore not asked again.
- A job's pool reaches Ray as `entrypoint_label_selector={core.ray_labels.POOL_LABEL: <pool>}`, the label
  join gives the pool's nodes; Ray 2.60 ANDs it with the entrypoint resources. It places the driver only:
  the tasks and actors the driver starts are placed by their own options.

One module past 400 lines on purpose: every call here wraps the same Ray client and its errors, and the
measured behaviours above apply to all of them.

One module past 400 lines on purpose: every call of the controller depends on what Ray does, as written above;
split, each part would need that account again.
"""

from __future__ import annotations

import builtins
import json
import secrets
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from loguru import logger

from control.artifacts import CleanupPlan, apply_cleanup, plan_cleanup
from control.jobspec import OWNER_RE, JobSpec
from core.errors import ArgusError, ConfigError, Conflict, InputError, NotAllowed, NotFound, SourceUnavailable
from core.jobfolder import JobFolder, JobFolders, is_submission_id
from core.lineage import CHECKPOINT_DIR_KEY, RESUME_FLAG_KEY, Lineage
from core.ray_labels import WORKER_RESOURCE
from core.types import utcnow
from core.waits import driver_advice, driver_wants, entrypoint_demand

DEFAULT_ENTRYPOINT_RESOURCES: dict[str, float] = {WORKER_RESOURCE: 0.001}
ARGUS_KEY, ARGUS_MARK = "argus", "1"  # the metadata Argus gives every job it submits
TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
TIMED = frozenset({"PENDING", "RUNNING"})  # the statuses a timeout applies to: every one not yet ended
DASHBOARD_HINT = "check that the Ray head is up and ray_dashboard_url points at its dashboard (port 8265)"
MAX_LOG_BYTES = 8 * 1024 * 1024
NO_AGENT_YET = "No available agent to submit job"  # Ray's answer while no node's agent can take a submission
SUBMIT_RETRY_PAUSES_S = (1.0, 2.0, 4.0, 8.0)  # then Ray's answer stands
USER_SUBFOLDERS = ("datasets", "models", "code")
WANDB_PROJECT_KEY = "argus_wandb_project"  # Ray job metadata of a job with `wandb:`
WANDB_URL_KEY = "argus_wandb_url"


@dataclass(frozen=True)
class JobRecord:
    """What Argus knows of one job: Ray's view plus its folder and the controller's own mark."""

    submission_id: str
    status: str  # Ray's JobStatus: PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    job_dir: Path | None  # None for jobs not submitted through Argus
    message: str = ""
    name: str | None = None
    owner: str | None = None
    workload: str | None = None
    driver_node_id: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    mark: str | None = None  # the controller's last act on it: "stopped", "timed_out"
    wandb_project: str | None = None  # a job with `wandb:`: its W&B project (the run's id is the submission id)
    wandb_url: str | None = None  # where the run is seen (online runs with an entity)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


def _by_argus(info: Any) -> bool:
    """Whether Ray's job record is of a job Argus submitted (its metadata says so)."""
    return (info.metadata or {}).get(ARGUS_KEY) == ARGUS_MARK


def _ms(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=timezone.utc) if value else None


def _status(value: Any) -> str:
    return str(getattr(value, "value", value))


class JobController:
    """Ray Jobs through the Jobs SDK, with a folder per job on shared storage. See the module docstring."""

    def __init__(
        self,
        dashboard_url: str,
        shared_root: Path,
        *,
        client: Any = None,
        clock: Callable[[], datetime] = utcnow,
        entrypoint_resources: dict[str, float] | None = None,
        entrypoint_num_cpus: float | None = None,
        request_timeout_s: float = 10.0,
        code_roots: Sequence[Path] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dashboard_url = dashboard_url.rstrip("/")
        self.sleep = sleep
        self.shared_root = Path(shared_root)
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        if entrypoint_resources is None and entrypoint_num_cpus is None:
            entrypoint_resources = dict(DEFAULT_ENTRYPOINT_RESOURCES)
        if not entrypoint_resources and not entrypoint_num_cpus:
            raise ConfigError(
                "the job controller needs entrypoint_resources or entrypoint_num_cpus",
                hint="without either, Ray runs job drivers on the head; "
                "e.g. entrypoint_resources={'worker': 0.001}",
            )
        self.entrypoint_resources = dict(entrypoint_resources or {})
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self._client = client
        # None: any directory (library use); the service passes its allow-list (Settings.job_code_roots).
        self.code_roots = None if code_roots is None else tuple(Path(r).resolve() for r in code_roots)

    # -- folders -----------------------------------------------------------------------------------

    @property
    def jobs_root(self) -> Path:
        return JobFolders(self.shared_root).jobs_dir

    def folder(self, submission_id: str) -> JobFolder:
        """The job's folder; InputError when the id is not a valid submission id."""
        return JobFolder(self.shared_root, submission_id)

    def job_dir(self, submission_id: str) -> Path:
        return self.folder(submission_id).root

    def user_dir(self, user: str) -> Path:
        """`<shared root>/users/<user>/`, with its datasets/, models/ and code/ (made when missing): where a user's
        own data, models and code live. `user` is a user name (control/jobspec.py OWNER_RE), never a path."""
        if not OWNER_RE.match(user):
            raise InputError(f"{user[:40]!r} is not a user name", hint="1-32 of a-z 0-9 _ . -, starting with a-z or _")
        home = self.shared_root / "users" / user
        try:
            for sub in USER_SUBFOLDERS:
                (home / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArgusError(f"cannot create user folder {home}: {exc.strerror}",
                             hint=f"check that {self.shared_root} is mounted and writable") from None
        return home

    def check_code_dir(self, path: Path, what: str, sid: str) -> None:
        """`path` is a directory inside one of the code roots, links resolved (no escape through a link)."""
        try:
            found = path.is_dir()
        except OSError as exc:  # a name past the file system's limit, say: no such directory either
            raise NotFound(f"{what} {str(path)[:200]} of job {sid!r} cannot be looked up: {exc.strerror}",
                           hint="give a directory that exists on shared storage") from None
        if not found:
            raise NotFound(
                f"{what} {path} of job {sid!r} is not a directory",
                hint="it must exist on shared storage, visible to every node",
            )
        if self.code_roots is None:
            return
        real = path.resolve()
        if not any(real == root or real.is_relative_to(root) for root in self.code_roots):
            roots = ", ".join(str(r) for r in self.code_roots) or "(none)"
            raise NotAllowed(
                f"{what} {path} of job {sid!r} is outside the allowed code roots ({roots})",
                hint="put the code under one of them, or ask an admin to add its root to job_code_roots",
            )

    def new_submission_id(self, name: str) -> str:
        return f"{name}-{self.clock().astimezone(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"

    # -- the Ray boundary ---------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.dashboard_url)
            except Exception as exc:
                raise SourceUnavailable(
                    "the Ray Jobs API", self.dashboard_url, _cause(exc), hint=DASHBOARD_HINT
                ) from None
        return self._client

    def _submit(self, submission_id: str, call: dict[str, Any]) -> str:
        """submit_job, again after a pause while Ray answers that it has no agent to take the submission: its
        dashboard picks a node's agent for each job and says so while none is ready (a node that just joined, a
        head under load), asking to try again later. Seen on the local cluster right after a node joined."""
        for pause in (*SUBMIT_RETRY_PAUSES_S, None):
            try:
                return str(self._call("submit a job", submission_id, lambda: self.client.submit_job(**call)))
            except ArgusError as exc:
                if pause is None or NO_AGENT_YET not in exc.message:
                    raise
                logger.warning("Ray has no agent to take job {} yet; trying again in {:.0f} s", submission_id, pause)
                self.sleep(pause)
        raise AssertionError("unreachable")  # the loop returns or raises on its last pass

    def _call(self, what: str, submission_id: str | None, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ArgusError:
            raise
        except RuntimeError as exc:
            text = str(exc)
            if "status code 404" in text and submission_id is not None:
                raise NotFound(
                    f"Ray has no job {submission_id!r}",
                    hint="list jobs with JobController.list() (or `ray job list`) for the ids it knows",
                ) from None
            if "already exists" in text and submission_id is not None:
                raise Conflict(
                    f"Ray already has a job with submission id {submission_id!r}",
                    hint="choose another submission_id, or leave it out to get a generated one",
                ) from None
            raise ArgusError(
                f"Ray refused to {what}{f' for job {submission_id!r}' if submission_id else ''}: "
                f"{_last_line(text)}",
                hint=f"see the Ray dashboard at {self.dashboard_url} and its logs on the head",
            ) from None
        except Exception as exc:  # requests/urllib3 connection errors, timeouts
            raise SourceUnavailable(
                "the Ray Jobs API", self.dashboard_url, f"{what}: {_cause(exc)}", hint=DASHBOARD_HINT
            ) from None

    # -- submit ------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, resume_from: Path | None = None, lineage: Lineage | None = None) -> JobRecord:
        """Create the job's folder, snapshot the spec and the submit call, and submit it to Ray.

        `resume_from`: the checkpoint a resubmitted job resumes from, given to it as ARGUS_RESUME_FROM.
        `lineage`: for a resubmission, the job it resubmits, written into the job's Ray metadata (core.lineage)."""
        sid = spec.submission_id or self.new_submission_id(spec.name)
        folder = self.folder(sid)
        job_dir = folder.root
        for path, what in ((spec.code_path, "code_path"), (spec.working_dir, "working_dir")):
            if path is not None:
                self.check_code_dir(Path(path), what, sid)
        try:
            job_dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise Conflict(
                f"job folder {job_dir} already exists",
                hint="choose another submission_id, or leave it out to get a generated one",
            ) from None
        except OSError as exc:
            raise ArgusError(
                f"cannot create job folder {job_dir}: {exc.strerror}",
                hint=f"check that {self.shared_root} is mounted and writable",
            ) from None
        for sub in JobFolder.SUBMIT_SUBFOLDERS:
            (job_dir / sub).mkdir()

        call = self.submit_call(spec, sid, job_dir, resume_from=resume_from, lineage=lineage)
        folder.spec_file.write_text(spec.to_yaml(), encoding="utf-8")
        folder.submit_file.write_text(json.dumps(call, indent=2) + "\n", encoding="utf-8")
        try:
            returned = self._submit(sid, call)
        except ArgusError:
            # The folder is ours, made just now: a retry with the same id must find it free.
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        logger.info("submitted job {} ({}, owner {}) into {}", returned, spec.workload, spec.owner, job_dir)
        return JobRecord(
            submission_id=returned,
            status="PENDING",
            job_dir=job_dir,
            message="submitted",
            name=spec.name,
            owner=spec.owner,
            workload=spec.workload,
        )

    def submit_again(self, call: dict[str, Any], *, source: dict[str, Any]) -> JobRecord:
        """Submit a job Argus did not write the spec of (an adopted `ray job submit` job run again): `call` is
        submit_job's keyword arguments, `source` what it was built from (control/adopt.py), both kept in the new
        job's folder (config/submit.json, config/adopted.json). The job sees its folder as $ARGUS_JOB_DIR."""
        sid = str(call["submission_id"])
        folder = self.folder(sid)
        try:
            folder.root.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise Conflict(f"job folder {folder.root} already exists",
                           hint="choose another submission_id") from None
        except OSError as exc:
            raise ArgusError(f"cannot create job folder {folder.root}: {exc.strerror}",
                             hint=f"check that {self.shared_root} is mounted and writable") from None
        for sub in JobFolder.SUBMIT_SUBFOLDERS:
            (folder.root / sub).mkdir()
        env = call.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env.update({"ARGUS_JOB_DIR": str(folder.root), "ARGUS_SUBMISSION_ID": sid})
        folder.submit_file.write_text(json.dumps(call, indent=2) + "\n", encoding="utf-8")
        folder.adopted_file.write_text(json.dumps(source, indent=2, default=str) + "\n", encoding="utf-8")
        try:
            returned = self._submit(sid, call)
        except ArgusError:
            shutil.rmtree(folder.root, ignore_errors=True)  # ours, made just now: a retry must find it free
            raise
        logger.info("submitted job {} again from Ray's record of {}", returned, source.get("submission_id"))
        metadata = call.get("metadata") or {}
        return JobRecord(submission_id=returned, status="PENDING", job_dir=folder.root, message="submitted",
                         name=metadata.get("name"), owner=metadata.get("owner"), workload=metadata.get("workload"))

    def submit_call(self, spec: JobSpec, submission_id: str, job_dir: Path, *,
                    resume_from: Path | None = None, lineage: Lineage | None = None) -> dict[str, Any]:
        """The keyword arguments of JobSubmissionClient.submit_job for `spec`: what submit.json records."""
        env = dict(spec.env)
        if spec.code_path is not None:
            env["PYTHONPATH"] = f"{spec.code_path}:${{PYTHONPATH}}"
        env.update(
            {
                "ARGUS_JOB_DIR": str(job_dir),
                "ARGUS_SUBMISSION_ID": submission_id,
                "ARGUS_NNODES": str(spec.nnodes),
                "ARGUS_GPUS_PER_NODE": str(spec.gpus_per_node),
                "ARGUS_RESUME": "1" if spec.resume else "0",
            }
        )
        if resume_from is not None:
            env["ARGUS_RESUME_FROM"] = str(resume_from)
        if spec.wandb is not None:
            env.update(wandb_env(spec, submission_id, job_dir, lineage))
        entrypoint = spec.entrypoint
        if spec.working_dir is not None:
            # Ray's runtime_env working_dir would upload a copy; on shared storage we run in place.
            entrypoint = f"cd {shlex.quote(spec.working_dir)} && {entrypoint}"
        metadata = {ARGUS_KEY: ARGUS_MARK, "owner": spec.owner, "workload": spec.workload, "name": spec.name}
        if spec.timeout_s is not None:
            metadata["timeout_s"] = repr(spec.timeout_s)
        if spec.checkpoint_dir is not None:
            metadata[CHECKPOINT_DIR_KEY] = spec.checkpoint_dir
        if spec.resume_flag is not None:
            metadata[RESUME_FLAG_KEY] = spec.resume_flag
        if lineage is not None:
            metadata.update(lineage.metadata())
        if spec.wandb is not None:
            metadata[WANDB_PROJECT_KEY] = spec.wandb.project
            url = spec.wandb.url(submission_id)
            if url is not None:
                metadata[WANDB_URL_KEY] = url
        call: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": {"env_vars": env},
            "metadata": metadata,
        }
        resources = {**self.entrypoint_resources, **spec.resources}  # the job's own pin beside the controller's
        if resources:
            call["entrypoint_resources"] = resources
        if self.entrypoint_num_cpus:
            call["entrypoint_num_cpus"] = self.entrypoint_num_cpus
        if spec.label_selector:
            call["entrypoint_label_selector"] = spec.label_selector
        return call

    # -- read --------------------------------------------------------------------------------------

    def get(self, submission_id: str) -> JobRecord:
        self.job_dir(submission_id)  # validates the id before it goes into a URL
        info = self._call("get a job", submission_id, lambda: self.client.get_job_info(submission_id))
        return self._record(info)

    def list(self, *, all_jobs: bool = False) -> list[JobRecord]:
        """Jobs submitted through Argus (metadata argus=1), newest first; `all_jobs` adds every Ray job."""
        infos = self._ray_jobs()
        records = [
            self._record(i)
            for i in infos
            if i.submission_id and (all_jobs or _by_argus(i))
        ]
        return sorted(
            records, key=lambda r: r.started_at or datetime.min.replace(tzinfo=timezone.utc), reverse=True
        )

    def _ray_jobs(self) -> Any:
        """Ray's job list (every job, Argus's or not); Ray unreachable is SourceUnavailable."""
        return self._call("list jobs", None, lambda: self.client.list_jobs())

    def _record(self, info: Any) -> JobRecord:
        sid = info.submission_id
        metadata = info.metadata or {}
        folder = self.folder(sid) if is_submission_id(sid) else None
        if folder is not None and not folder.exists():
            folder = None
        job_dir = folder.root if folder is not None else None
        mark = self._read_mark(folder)
        return JobRecord(
            submission_id=sid,
            status=_status(info.status),
            job_dir=job_dir,
            message=info.message or "",
            name=metadata.get("name"),
            owner=metadata.get("owner"),
            workload=metadata.get("workload"),
            driver_node_id=info.driver_node_id,
            started_at=_ms(info.start_time),
            ended_at=_ms(info.end_time),
            mark=mark.get("mark") if mark else None,
            wandb_project=metadata.get(WANDB_PROJECT_KEY), wandb_url=metadata.get(WANDB_URL_KEY),
        )

    # -- stop and timeouts -------------------------------------------------------------------------

    def stop(self, submission_id: str, *, reason: str = "stop requested") -> JobRecord:
        """Ask Ray to stop the job and mark it in config/status.json.

        The record's message says whether it was still running."""
        folder = self.folder(submission_id)
        stopping = self._call("stop a job", submission_id, lambda: self.client.stop_job(submission_id))
        record = self.get(submission_id)
        if stopping:
            self._write_mark(folder, "stopped", reason)
            logger.info("stopping job {}: {}", submission_id, reason)
            message = f"stop requested: {reason}"
        else:
            message = f"job had already ended ({record.status}); nothing to stop"
        return replace(record, message=message, mark="stopped" if stopping else record.mark)

    def sweep(self, observe_live: Callable[[builtins.list[JobRecord]], None]) -> builtins.list[str]:
        """The periodic pass over Ray's job list, read once: stop the jobs past their timeout (enforce_timeouts),
        then hand the Argus jobs not yet ended to `observe_live` (the exporter's job info). Ray down is one error
        a pass, not one per use of the list."""
        infos = self._ray_jobs()
        stopped = self.enforce_timeouts(infos)
        observe_live([self._record(i) for i in infos
                      if i.submission_id and _by_argus(i) and _status(i.status) not in TERMINAL])
        return stopped

    def enforce_timeouts(self, infos: Iterable[Any] | None = None) -> builtins.list[str]:
        """Stop each Argus job, RUNNING or still PENDING, whose time since submission is over its timeout_s,
        mark it timed_out with the reason, and return their ids (see the module docstring for PENDING). `infos`:
        Ray's job list when the caller has read it already."""
        now = self.clock()
        stopped: builtins.list[str] = []
        for info in self._ray_jobs() if infos is None else infos:
            metadata = info.metadata or {}
            sid = info.submission_id
            status = _status(info.status)
            if not _by_argus(info) or status not in TIMED or not is_submission_id(sid):
                continue
            timeout = self._timeout_of(sid, metadata)
            submitted = _ms(info.start_time)
            if timeout is None or submitted is None or (now - submitted).total_seconds() <= timeout:
                continue
            folder = self.folder(sid)
            if (self._read_mark(folder) or {}).get("mark") == "timed_out":
                continue  # asked already; a PENDING job ends only when Ray places or fails it
            try:
                asked = self._call("stop a job", sid, partial(self.client.stop_job, sid))
            except NotFound:
                continue
            if not asked:  # ended meanwhile, or Ray has not registered its supervisor yet: the next pass looks again
                continue
            reason = _timeout_reason(status, (now - submitted).total_seconds(), timeout, self._read_call(folder))
            self._write_mark(folder, "timed_out", reason, timeout_s=timeout, job_status=status)
            logger.warning("job {} timed out: {}", sid, reason)
            stopped.append(sid)
        return stopped

    def _read_call(self, folder: JobFolder) -> dict[str, Any] | None:
        """The submit call recorded in the job's folder (config/submit.json); None when unreadable."""
        try:
            call = json.loads(folder.submit_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return call if isinstance(call, dict) else None

    def _timeout_of(self, sid: str, metadata: dict[str, str]) -> float | None:
        try:
            return float(metadata["timeout_s"]) if "timeout_s" in metadata else None
        except ValueError:
            logger.warning(
                "job {} has an unreadable timeout_s {!r} in its metadata", sid, metadata["timeout_s"]
            )
            return None

    def _write_mark(self, folder: JobFolder, mark: str, reason: str, **extra: Any) -> None:
        status = {"mark": mark, "reason": reason, "at": self.clock().isoformat(), **extra}
        path = folder.status_file
        # A job Argus did not submit gets its folder here: the mark is what tells a stop Argus made (and why)
        # from one a person made, when the job is looked at again (remediation's _ended_apart).
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    def _read_mark(self, folder: JobFolder | None) -> dict[str, Any] | None:
        if folder is None:
            return None
        try:
            return json.loads(folder.status_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    # -- artifacts ---------------------------------------------------------------------------------

    def cleanup_artifacts(self, submission_id: str, *, keep_last: int, dry_run: bool = False) -> CleanupPlan:
        """Delete all but the job's last `keep_last` checkpoints (see control/artifacts.py); refused with
        Conflict while the job may still write them. A job Ray no longer knows (the cluster restarted
        since) cannot be running, so its folder may be cleaned."""
        job_dir = self.job_dir(submission_id)
        try:
            record = self.get(submission_id)
        except NotFound:
            if not job_dir.is_dir():
                raise NotFound(f"no job {submission_id!r}: Ray does not know it and {job_dir} does not exist",
                               hint="list jobs with GET /v1/jobs") from None
        else:
            if not record.ended:
                raise Conflict(
                    f"job {submission_id!r} is {record.status}: its checkpoints may still be written or read",
                    hint="stop the job first, or wait until it ends",
                )
            if record.job_dir is None:
                raise NotFound(f"job {submission_id!r} has no folder under {self.jobs_root}",
                               hint="only jobs submitted through Argus have artifacts Argus manages")
        plan = plan_cleanup(job_dir, keep_last)
        if dry_run:
            return plan
        done = apply_cleanup(plan)
        logger.info("job {}: removed {} checkpoint(s), kept {} ({} bytes freed)", submission_id,
                    len(done.removed), len(done.kept), done.freed_bytes)
        return done

    # -- logs --------------------------------------------------------------------------------------

    def logs(self, submission_id: str) -> str:
        """The driver's whole log (see the module docstring for where it comes from)."""
        return self._driver_log(submission_id, lines=-1)

    def tail(self, submission_id: str, lines: int = 100) -> str:
        """The last `lines` lines of the driver's log."""
        if not 1 <= lines <= 100_000:
            raise InputError(
                f"cannot tail {lines} lines of job {submission_id!r}", hint="ask for 1-100000 lines"
            )
        return self._driver_log(submission_id, lines=lines)

    def _driver_log(self, submission_id: str, lines: int) -> str:
        record = self.get(submission_id)
        saved = self.folder(record.submission_id).driver_log if record.job_dir else None
        if saved is not None and saved.is_file():
            return _last_lines(saved.read_text(encoding="utf-8", errors="replace"), lines)
        if record.driver_node_id is None:
            if record.ended:
                return ""  # ended before a driver started (e.g. stopped while PENDING)
            raise NotFound(
                f"job {submission_id!r} has no driver log yet ({record.status})",
                hint="its driver has not started; wait until it is RUNNING",
            )
        text = self._read_node_log(record, lines=-1 if record.ended else lines)
        if record.ended and saved is not None:
            # Keep the scene: the node's Ray log folder goes away with the node. A job Argus did not submit has
            # a folder only once its scene was kept there, without logs/ yet.
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(text, encoding="utf-8")
        return _last_lines(text, lines)

    def _read_node_log(self, record: JobRecord, lines: int) -> str:
        filename = f"job-driver-{record.submission_id}.log"
        params = {"node_id": record.driver_node_id, "filename": filename, "lines": lines}
        url = f"{self.dashboard_url}/api/v0/logs/file"
        try:
            with httpx.stream("GET", url, params=params, timeout=self.request_timeout_s) as resp:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_LOG_BYTES:
                        break
                body = b"".join(chunks)[:MAX_LOG_BYTES].decode("utf-8", errors="replace")
        except httpx.HTTPError as exc:
            raise SourceUnavailable("the Ray log API", url, _cause(exc), hint=DASHBOARD_HINT) from None
        if resp.status_code != 200:
            raise SourceUnavailable(
                f"the driver log of job {record.submission_id!r}",
                f"node {record.driver_node_id}",
                f"HTTP {resp.status_code}: {_last_line(body)}",
                hint="the driver's node may be gone; read the job folder's logs/ instead",
            )
        return body


def wandb_env(spec: JobSpec, submission_id: str, job_dir: Path, lineage: Lineage | None) -> dict[str, str]:
    """The W&B environment of a job with `wandb:`: the run's id is the job's submission id and its group the chain's
    first job, so a resubmission's run sits beside the one it continues; WANDB_DIR is the job's folder."""
    assert spec.wandb is not None
    w = spec.wandb
    env = {"WANDB_PROJECT": w.project, "WANDB_NAME": w.run_name or spec.name, "WANDB_MODE": w.mode,
           "WANDB_DIR": str(job_dir), "WANDB_RUN_ID": submission_id,
           "WANDB_RUN_GROUP": lineage.root if lineage is not None else submission_id}
    if w.entity is not None:
        env["WANDB_ENTITY"] = w.entity
    if w.base_url is not None:
        env["WANDB_BASE_URL"] = w.base_url
    return env


def _timeout_reason(status: str, age_s: float, timeout_s: float, call: dict[str, Any] | None) -> str:
    """Why a job was timed out, in words a user acts on; for a job that never started, what it waited for
    (from its submit call, `call`, None when unreadable)."""
    over = f"{age_s:.0f} s after submission, over its timeout of {timeout_s:g} s"
    if status != "PENDING":
        return f"ran {over}"
    selector = _mapping(call, "entrypoint_label_selector")
    resources = entrypoint_demand(resources=_mapping(call, "entrypoint_resources"),
                                  num_cpus=(call or {}).get("entrypoint_num_cpus"))
    return (f"still PENDING {over}: its driver never started, as no node offered "
            f"{driver_wants(resources, selector)}; {driver_advice(selector)}")


def _mapping(call: dict[str, Any] | None, key: str) -> dict[str, Any]:
    value = (call or {}).get(key)
    return dict(value) if isinstance(value, dict) else {}


def _last_lines(text: str, lines: int) -> str:
    if lines < 0:
        return text
    kept = text.splitlines(keepends=True)[-lines:]
    return "".join(kept)


def _last_line(text: str) -> str:
    stripped = [line for line in text.strip().splitlines() if line.strip() and line.strip() != "."]
    line = stripped[-1] if stripped else text.strip()
    return line[:300]


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_last_line(str(exc)) or 'no detail'}"
