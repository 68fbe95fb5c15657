"""Ray cluster state: nodes, jobs and which job has work on which node, as Signals.

Reads Ray's state API (the dashboard on the head). Which jobs ran on a node is remembered between
polls, because once a node is DEAD its actors are gone from the live view and we still want to name
the jobs that lost ranks there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from loguru import logger

from collectors.ray_api import RayStateApi
from core import signal_keys as keys
from core.errors import SourceUnavailable
from core.names import clean, job_identity
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow


def _ms_to_dt(ms: Any) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(float(ms) / 1000.0, tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


class RayStateCollector:
    """Collects NODE_STATE and JOB_STATE signals from one Ray cluster."""

    name = "ray_state"

    def __init__(
        self,
        dashboard_url: str,
        *,
        timeout_s: float = 10.0,
        state_api: Any = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._ray = RayStateApi(dashboard_url, timeout_s, state_api)
        self.dashboard_url = self._ray.dashboard_url
        self.timeout_s = timeout_s
        self._clock = clock
        # node_id -> {job_id: job summary}; survives the node's death so findings can name the jobs.
        self._placement: dict[str, dict[str, dict[str, Any]]] = {}
        self._dead_seen: set[str] = set()

    def collect(self) -> list[Signal]:
        now = self._clock()
        nodes = self._ray.call("list_nodes", detail=True)
        jobs = self._ray.call("list_jobs", detail=True)  # without detail Ray drops start/end times and driver_node_id
        actors = self._ray.call("list_actors", filters=[("state", "=", "ALIVE")])

        # A submitted job has no Ray job id until (unless) its entrypoint calls ray.init(): key by either.
        job_info = {
            str(_field(j, "job_id") or _field(j, "submission_id")): self._job_summary(j)
            for j in jobs
            if _field(j, "job_id") or _field(j, "submission_id")
        }
        live: dict[str, dict[str, dict[str, Any]]] = {}
        for actor in actors:
            node_id, job_id = _field(actor, "node_id"), _field(actor, "job_id")
            if node_id and job_id:
                live.setdefault(node_id, {})[job_id] = job_info.get(job_id) or {"job_id": job_id}
        for job in job_info.values():
            driver = job.get("driver_node_id")
            if driver and job.get("status") in {"RUNNING", "PENDING"}:
                live.setdefault(driver, {})[job["job_id"]] = job

        signals: list[Signal] = []
        for node in nodes:
            node_id = str(_field(node, "node_id"))
            state = str(_field(node, "state"))
            if state == "ALIVE":
                self._placement[node_id] = live.get(node_id, {})
                self._dead_seen.discard(node_id)
            elif state == "DEAD" and node_id not in self._dead_seen:
                self._dead_seen.add(node_id)
                self._placement.setdefault(node_id, {}).update(self._jobs_of_dead_node(node_id, job_info))
            signals.append(self._node_signal(node, node_id, state, now))
        for job in job_info.values():
            signals.append(
                Signal(
                    kind=SignalKind.JOB_STATE,
                    source="ray.jobs",
                    # named by its JobSpec name (metadata), never by its command: see core.names
                    subject=Subject(
                        kind=SubjectKind.JOB,
                        id=job.get("submission_id") or job["job_id"],
                        name=job.get(keys.JOB_NAME),
                    ),
                    observed_at=now,
                    text=job.get("message"),
                    attrs=job,
                )
            )
        return signals

    def _jobs_of_dead_node(self, node_id: str, job_info: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Jobs whose actors were on a node that just died: Ray still lists those actors, now DEAD."""
        try:
            actors = self._ray.call("list_actors", filters=[("node_id", "=", node_id)])
        except SourceUnavailable as exc:
            logger.warning("could not list actors of dead node {}: {}", node_id, exc)
            return {}
        found: dict[str, dict[str, Any]] = {}
        for actor in actors:
            job_id = _field(actor, "job_id")
            if job_id:
                found[job_id] = job_info.get(job_id) or {"job_id": job_id}
        return found

    def _node_signal(self, node: Any, node_id: str, state: str, now: datetime) -> Signal:
        ip = _field(node, "node_ip")
        jobs = sorted(self._placement.get(node_id, {}).values(), key=lambda j: j.get("job_id", ""))
        end = _ms_to_dt(_field(node, "end_time_ms"))
        start = _ms_to_dt(_field(node, "start_time_ms"))
        return Signal(
            kind=SignalKind.NODE_STATE,
            source="ray.state",
            subject=Subject(kind=SubjectKind.NODE, id=node_id, name=ip),
            observed_at=now,
            text=_field(node, "state_message"),
            attrs={
                keys.STATE: state,
                keys.NODE_IP: ip,
                keys.NODE_NAME: clean(_field(node, "node_name")),
                keys.IS_HEAD_NODE: bool(_field(node, "is_head_node")),
                keys.STATE_MESSAGE: _field(node, "state_message"),
                keys.START_TIME: start.isoformat() if start else None,
                keys.END_TIME: end.isoformat() if end else None,
                "resources_total": dict(_field(node, "resources_total") or {}),
                keys.LABELS: dict(_field(node, "labels") or {}),
                keys.JOBS: jobs,
            },
        )

    @staticmethod
    def _job_summary(job: Any) -> dict[str, Any]:
        driver = _field(job, "driver_info")
        driver_node = _field(job, "driver_node_id") or (_field(driver, "node_id") if driver else None)
        start = _ms_to_dt(_field(job, "start_time"))
        end = _ms_to_dt(_field(job, "end_time"))
        status = _field(job, "status")
        status = getattr(status, "value", status)  # an enum in the SDK, a string over REST
        metadata = _field(job, "metadata")
        metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
        identity = job_identity(metadata)
        return {
            keys.JOB_ID: str(_field(job, "job_id") or _field(job, "submission_id")),
            keys.SUBMISSION_ID: _field(job, "submission_id"),
            keys.STATUS: str(status) if status else None,
            keys.ENTRYPOINT: _field(job, "entrypoint"),
            keys.JOB_NAME: identity.name,
            keys.OWNER: identity.owner,
            keys.DRIVER_NODE_ID: driver_node,
            keys.MESSAGE: _field(job, "message"),
            keys.ERROR_TYPE: _field(job, "error_type"),
            keys.START_TIME: start.isoformat() if start else None,
            keys.END_TIME: end.isoformat() if end else None,
            keys.METADATA: metadata,
        }
