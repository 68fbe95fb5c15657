"""Adopting a Ray job Argus did not submit (`ray job submit`, the Jobs SDK): what it was submitted with, read
back from Ray, so Argus can keep its scene and submit it again with the same guards as its own jobs.

What Ray keeps and where (read in Ray 2.60's job_manager.py and measured on the local cluster):
- the job record (`GET /api/jobs/<id>`, kept by the GCS after the job ends): entrypoint, metadata and the
  runtime_env as the driver got it, with local directories already uploaded as `gcs://_ray_pkg_<hash>.zip`;
- the entrypoint's resources are not in that record: the job's supervisor actor
  (`_ray_internal_job_actor_<id>`) was created with them (num_cpus, num_gpus, memory, resources and the label
  selector), and Ray's state API lists it, DEAD too, with `required_resources` and `label_selector`. A job that
  asked for nothing got the head node's id as its label selector (`ray.io/node-id`): that is Ray's default,
  not the job's request, so it is not asked for again.
- an uploaded package lives in the GCS while a job refers to it, and a while after (Ray's temporary reference);
  `GET /api/packages/gcs/<name>` says whether it is still there. A job whose package is gone cannot run again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from control.jobs import DASHBOARD_HINT
from core.errors import NotFound, SourceUnavailable
from core.jobfolder import check_submission_id
from core.lineage import RESUBMIT_ATTEMPT, RESUBMIT_OF, RESUBMIT_ROOT

SUPERVISOR_NAME = "_ray_internal_job_actor_{}"
HEAD_NODE_LABEL = "ray.io/node-id"  # Ray's own pin of a driver that asked for nothing to the head node
PACKAGE_KEYS = ("working_dir", "py_modules")


@dataclass(frozen=True)
class RaySubmission:
    """What a Ray job was submitted with, as Ray kept it."""

    submission_id: str
    status: str
    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    label_selector: dict[str, str] = field(default_factory=dict)
    resources_known: bool = True  # False: the supervisor actor was not found, so the request is not known

    @property
    def env(self) -> dict[str, str]:
        env_vars = self.runtime_env.get("env_vars") if isinstance(self.runtime_env, dict) else None
        return {str(k): str(v) for k, v in env_vars.items()} if isinstance(env_vars, dict) else {}

    def packages(self) -> list[str]:
        """The gcs:// packages its runtime_env needs (working_dir, py_modules)."""
        found: list[str] = []
        for key in PACKAGE_KEYS:
            value = self.runtime_env.get(key)
            for uri in value if isinstance(value, list) else [value]:
                if isinstance(uri, str) and uri.startswith("gcs://"):
                    found.append(uri)
        return found

    def call(self, submission_id: str, *, entrypoint: str, env: dict[str, str],
             metadata: dict[str, str]) -> dict[str, Any]:
        """JobSubmissionClient.submit_job's keyword arguments for running it again as `submission_id`."""
        runtime_env = {k: v for k, v in self.runtime_env.items() if k != "env_vars"}
        runtime_env["env_vars"] = {**self.env, **env}
        kept = {k: v for k, v in self.metadata.items() if k not in (RESUBMIT_OF, RESUBMIT_ROOT, RESUBMIT_ATTEMPT)}
        call: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": submission_id,
                                "runtime_env": runtime_env, "metadata": {**kept, **metadata}}
        for key, value in (("entrypoint_num_cpus", self.num_cpus), ("entrypoint_num_gpus", self.num_gpus),
                           ("entrypoint_memory", self.memory)):
            if value:
                call[key] = value
        if self.resources:
            call["entrypoint_resources"] = dict(self.resources)
        if self.label_selector:
            call["entrypoint_label_selector"] = dict(self.label_selector)
        return call

    def as_json(self) -> dict[str, Any]:
        return {"submission_id": self.submission_id, "status": self.status, "entrypoint": self.entrypoint,
                "runtime_env": self.runtime_env, "metadata": self.metadata, "entrypoint_num_cpus": self.num_cpus,
                "entrypoint_num_gpus": self.num_gpus, "entrypoint_memory": self.memory,
                "entrypoint_resources": self.resources, "entrypoint_label_selector": self.label_selector,
                "resources_known": self.resources_known}


def read_submission(dashboard_url: str, submission_id: str, *,
                    list_actors: Callable[..., list[dict[str, Any]]], timeout_s: float = 10.0,
                    get: Callable[..., httpx.Response] = httpx.get) -> RaySubmission:
    """Ray's record of job `submission_id`; NotFound when Ray does not know it, SourceUnavailable when Ray does
    not answer or answers something else. `list_actors`: ray.util.state.list_actors as plain dicts (the
    caller's Ray client); `get`: httpx.get."""
    check_submission_id(submission_id)
    url = f"{dashboard_url.rstrip('/')}/api/jobs/{submission_id}"
    try:
        response = get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise SourceUnavailable("the Ray Jobs API", url, f"{type(exc).__name__}: {exc}", hint=DASHBOARD_HINT) from None
    if response.status_code == 404:
        raise NotFound(f"Ray has no job {submission_id!r}", hint="`ray job list` shows the ids it knows")
    if response.status_code != 200:
        raise SourceUnavailable("the Ray Jobs API", url, f"HTTP {response.status_code}", hint=DASHBOARD_HINT)
    try:
        record = response.json()
    except ValueError:
        raise SourceUnavailable("the Ray Jobs API", url, "the answer is not JSON", hint=DASHBOARD_HINT) from None
    if not isinstance(record, dict) or not isinstance(record.get("entrypoint"), str):
        raise SourceUnavailable("the Ray Jobs API", url, "the answer is not a job record", hint=DASHBOARD_HINT)
    supervisors = list_actors(filters=[("name", "=", SUPERVISOR_NAME.format(submission_id))], detail=True)
    asked = _request(supervisors[0]) if supervisors else None
    metadata = record.get("metadata") or {}
    runtime_env = record.get("runtime_env") or {}
    return RaySubmission(
        submission_id=submission_id, status=str(record.get("status")), entrypoint=record["entrypoint"],
        runtime_env=runtime_env if isinstance(runtime_env, dict) else {},
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {},
        **(asked or {}), resources_known=asked is not None,
    )


def _request(actor: dict[str, Any]) -> dict[str, Any]:
    """The entrypoint resources a job asked for, from its supervisor actor (see the module docstring)."""
    required = dict(actor.get("required_resources") or {})
    selector = {str(k): str(v) for k, v in (actor.get("label_selector") or {}).items() if k != HEAD_NODE_LABEL}
    pinned_to_head = HEAD_NODE_LABEL in (actor.get("label_selector") or {})
    if pinned_to_head and not selector:
        return {}  # it asked for nothing: Ray put the driver on the head, and will again
    return {
        "num_cpus": required.pop("CPU", None),
        "num_gpus": required.pop("GPU", None),
        "memory": int(m) if (m := required.pop("memory", None)) else None,
        "resources": {str(k): float(v) for k, v in required.items()},
        "label_selector": selector,
    }


def package_exists(dashboard_url: str, uri: str, *, timeout_s: float = 10.0) -> bool | None:
    """Whether the GCS still holds package `uri` (gcs://...); None when the dashboard does not say."""
    name = uri.removeprefix("gcs://")
    if not name or "/" in name:
        return False
    try:
        response = httpx.get(f"{dashboard_url.rstrip('/')}/api/packages/gcs/{name}", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return {200: True, 404: False}.get(response.status_code)
