"""Ray cluster state: nodes, jobs and which job has work on which node, as Signals.

Reads Ray's state API (the dashboard on the head). Which jobs ran on a node is remembered between
polls, because once a node is DEAD its actors are gone from the live view and we still want to name
the jobs that lost ranks there.

What waits for a place (detectors/waiting.py judges it; the keys are core.signal_keys'), as Ray 2.60 gives it:
- A PENDING job's driver demand and label selector are not in the job record the state and Jobs APIs give
  (JobDetails drops Ray's entrypoint_num_cpus / _num_gpus / _memory / _resources and keeps no selector): they are
  on the job's supervisor actor (`_ray_internal_job_actor_<submission id>`, in PENDING_CREATION until a node takes
  it) as its required resources and label selector, read only while a job is PENDING.
- Placement groups Ray has not placed (PENDING, or RESCHEDULING after a node loss) are read every poll, with their
  bundles, bundle label selectors and when Ray received them (`stats.creation_request_received_ns`); of the placed
  (CREATED) ones only the ids, so a wait that ends can be told apart: its groups placed, or removed (a stopped job's
  groups are REMOVED a moment before Ray marks it STOPPED). Removed groups are not read: Ray keeps many. The state
  API drops a group's strategy; Ray's autoscaler report lists the pending groups' bundles with their strategy, so a
  group whose bundles match exactly one strategy there gets it.
- Free resources per node come from the same autoscaler report (`/api/cluster_status`: the v1 monitor that `ray
  start --head` runs writes it every few seconds; `usage_by_node` is [used, total] per resource, keyed by node IP).
  The dashboard camel-cases its keys (`no_such_thing` comes back `noSuchThing`), so names are matched back to the
  node's own resources. Read only while something waits; a cluster without the report (autoscaler v2) leaves
  free resources unknown, and a failure to read any of these leaves them unknown without failing the poll.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from loguru import logger

from collectors.ray_api import RayStateApi
from core import signal_keys as keys
from core.errors import SourceUnavailable
from core.names import clean, job_identity
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

SUPERVISOR_PREFIX = "_ray_internal_job_actor_"  # Ray's JOB_ACTOR_NAME_TEMPLATE: a submitted job's supervisor actor
WAITING_GROUP_STATES = frozenset({"PENDING", "RESCHEDULING"})
CLUSTER_STATUS_ROUTE = "/api/cluster_status"


def _ms_to_dt(ms: Any) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(float(ms) / 1000.0, tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def text_of(value: Any) -> str | None:
    value = getattr(value, "value", value)  # enums in the SDK, strings over REST
    return str(value) if value is not None else None


def _camel(name: str) -> str:
    """The dashboard's rewrite of a key (ray.dashboard.utils.to_camel_case)."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def resources_of(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    found = {}
    for key, amount in value.items():
        try:
            found[str(key)] = float(amount)
        except (TypeError, ValueError):
            continue
    return found


def _shape(bundles: Any) -> Counter[tuple[tuple[str, float], ...]]:
    """A multiset of bundles, to compare a group's with the autoscaler report's."""
    return Counter(tuple(sorted(resources_of(b).items())) for b in bundles or [])


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
            str(field_of(j, "job_id") or field_of(j, "submission_id")): self._job_summary(j)
            for j in jobs
            if field_of(j, "job_id") or field_of(j, "submission_id")
        }
        live: dict[str, dict[str, dict[str, Any]]] = {}
        for actor in actors:
            node_id, job_id = field_of(actor, "node_id"), field_of(actor, "job_id")
            if node_id and job_id:
                live.setdefault(node_id, {})[job_id] = job_info.get(job_id) or {"job_id": job_id}
        for job in job_info.values():
            driver = job.get("driver_node_id")
            if driver and job.get("status") in {"RUNNING", "PENDING"}:
                live.setdefault(driver, {})[job["job_id"]] = job

        waiting, placed = self._groups()
        pending = [j for j in job_info.values() if j.get(keys.STATUS) == "PENDING"]
        report: Mapping[str, Any] | None = None
        drivers: dict[str, tuple[dict[str, float], dict[str, Any]]] = {}
        if pending or (waiting and any(str(j[keys.JOB_ID]) in waiting for j in job_info.values())):
            report = self._autoscaler_report()
            if pending:
                drivers = self._waiting_drivers()
        for groups in (waiting or {}).values():
            _add_strategies(groups, report)
        free = free_by_node(nodes, report)

        signals: list[Signal] = []
        for node in nodes:
            node_id = str(field_of(node, "node_id"))
            state = str(field_of(node, "state"))
            if state == "ALIVE":
                self._placement[node_id] = live.get(node_id, {})
                self._dead_seen.discard(node_id)
            elif state == "DEAD" and node_id not in self._dead_seen:
                self._dead_seen.add(node_id)
                self._placement.setdefault(node_id, {}).update(self._jobs_of_dead_node(node_id, job_info))
            signals.append(self._node_signal(node, node_id, state, now, free.get(node_id)))
        for job in job_info.values():
            demand, selector = drivers.get(str(job.get(keys.SUBMISSION_ID)), (None, None))
            waits = {
                # what waits for a place: only on the job's own signal, never in the job lists of nodes
                keys.ENTRYPOINT_RESOURCES: demand,
                keys.LABEL_SELECTOR: selector,
                keys.WAITING_GROUPS: None if waiting is None else waiting.get(str(job[keys.JOB_ID]), []),
                keys.PLACED_GROUPS: None if placed is None else placed.get(str(job[keys.JOB_ID]), []),
            }
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
                    attrs={**job, **waits},
                )
            )
        return signals

    # -- what waits for a place (see the module docstring) ---------------------------------------------------

    def _groups(self) -> tuple[dict[str, list[dict[str, Any]]] | None, dict[str, list[str]] | None]:
        """Placement groups Ray has not placed, and the ids of those it placed, by the Ray job id that created them;
        (None, None) when not readable."""
        try:
            groups = self._ray.call("list_placement_groups", detail=True, filters=[("state", "!=", "REMOVED")])
        except SourceUnavailable as exc:
            logger.warning("could not list placement groups (waiting ones stay unknown this poll): {}", exc)
            return None, None
        by_job: dict[str, list[dict[str, Any]]] = {}
        placed: dict[str, list[str]] = {}
        for group in groups:
            state = text_of(field_of(group, "state"))
            job_id = field_of(group, "creator_job_id")
            if state == "CREATED" and job_id:
                placed.setdefault(str(job_id), []).append(str(field_of(group, "placement_group_id")))
            if state not in WAITING_GROUP_STATES or not job_id:
                continue
            bundles = list(field_of(group, "bundles") or [])
            stats = field_of(group, "stats") or {}
            since = None
            try:  # an int64 comes as text over the state API
                since = datetime.fromtimestamp(int(stats.get("creation_request_received_ns") or 0) / 1e9,
                                               tz=timezone.utc) if stats.get("creation_request_received_ns") else None
            except (TypeError, ValueError, OverflowError, OSError):
                pass
            by_job.setdefault(str(job_id), []).append({
                keys.GROUP_ID: str(field_of(group, "placement_group_id")),
                keys.GROUP_NAME: clean(field_of(group, "name")) or None,
                keys.STATE: state,
                keys.BUNDLES: [resources_of(field_of(b, "unit_resources")) for b in bundles],
                keys.BUNDLE_SELECTORS: [dict(field_of(b, "label_selector") or {}) for b in bundles],
                keys.STRATEGY: None,
                keys.SCHEDULING_STATE: text_of(stats.get("scheduling_state")),
                keys.SINCE: since.isoformat() if since else None,
            })
        return by_job, placed

    def _waiting_drivers(self) -> dict[str, tuple[dict[str, float], dict[str, Any]]]:
        """What each PENDING job's driver waits on, by submission id: (resources, label selector) of its supervisor
        actor (see the module docstring)."""
        try:
            actors = self._ray.call("list_actors", detail=True, filters=[("state", "=", "PENDING_CREATION")])
        except SourceUnavailable as exc:
            logger.warning("could not list pending actors (what PENDING jobs wait on stays unknown): {}", exc)
            return {}
        return {
            str(name)[len(SUPERVISOR_PREFIX):]: (resources_of(field_of(a, "required_resources")),
                                                 dict(field_of(a, "label_selector") or {}))
            for a in actors
            if str(name := field_of(a, "name") or "").startswith(SUPERVISOR_PREFIX)
        }

    def _autoscaler_report(self) -> Mapping[str, Any] | None:
        return autoscaler_report(self._ray, "free resources stay unknown")

    def _jobs_of_dead_node(self, node_id: str, job_info: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Jobs whose actors were on a node that just died: Ray still lists those actors, now DEAD."""
        try:
            actors = self._ray.call("list_actors", filters=[("node_id", "=", node_id)])
        except SourceUnavailable as exc:
            logger.warning("could not list actors of dead node {}: {}", node_id, exc)
            return {}
        found: dict[str, dict[str, Any]] = {}
        for actor in actors:
            job_id = field_of(actor, "job_id")
            if job_id:
                found[job_id] = job_info.get(job_id) or {"job_id": job_id}
        return found

    def _node_signal(self, node: Any, node_id: str, state: str, now: datetime,
                     free: dict[str, float] | None = None) -> Signal:
        ip = field_of(node, "node_ip")
        jobs = sorted(self._placement.get(node_id, {}).values(), key=lambda j: j.get("job_id", ""))
        end = _ms_to_dt(field_of(node, "end_time_ms"))
        start = _ms_to_dt(field_of(node, "start_time_ms"))
        return Signal(
            kind=SignalKind.NODE_STATE,
            source="ray.state",
            subject=Subject(kind=SubjectKind.NODE, id=node_id, name=ip),
            observed_at=now,
            text=field_of(node, "state_message"),
            attrs={
                keys.STATE: state,
                keys.NODE_IP: ip,
                keys.NODE_NAME: clean(field_of(node, "node_name")),
                keys.IS_HEAD_NODE: bool(field_of(node, "is_head_node")),
                keys.STATE_MESSAGE: field_of(node, "state_message"),
                keys.START_TIME: start.isoformat() if start else None,
                keys.END_TIME: end.isoformat() if end else None,
                keys.RESOURCES_TOTAL: dict(field_of(node, "resources_total") or {}),
                keys.RESOURCES_AVAILABLE: free,
                keys.LABELS: dict(field_of(node, "labels") or {}),
                keys.JOBS: jobs,
            },
        )

    @staticmethod
    def _job_summary(job: Any) -> dict[str, Any]:
        driver = field_of(job, "driver_info")
        driver_node = field_of(job, "driver_node_id") or (field_of(driver, "node_id") if driver else None)
        start = _ms_to_dt(field_of(job, "start_time"))
        end = _ms_to_dt(field_of(job, "end_time"))
        status = field_of(job, "status")
        status = getattr(status, "value", status)  # an enum in the SDK, a string over REST
        metadata = field_of(job, "metadata")
        metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
        identity = job_identity(metadata)
        return {
            keys.JOB_ID: str(field_of(job, "job_id") or field_of(job, "submission_id")),
            keys.SUBMISSION_ID: field_of(job, "submission_id"),
            keys.STATUS: str(status) if status else None,
            keys.ENTRYPOINT: field_of(job, "entrypoint"),
            keys.JOB_NAME: identity.name,
            keys.OWNER: identity.owner,
            keys.DRIVER_NODE_ID: driver_node,
            keys.MESSAGE: field_of(job, "message"),
            keys.ERROR_TYPE: field_of(job, "error_type"),
            keys.START_TIME: start.isoformat() if start else None,
            keys.END_TIME: end.isoformat() if end else None,
            keys.METADATA: metadata,
        }


def autoscaler_report(ray: RayStateApi, unknown: str) -> Mapping[str, Any] | None:
    """Ray's autoscaler load report (usage by node, pending placement groups); None when there is none, with a
    warning that says what stays `unknown` then."""
    try:
        body = ray.get_json(CLUSTER_STATUS_ROUTE)
    except SourceUnavailable as exc:
        logger.warning("could not read Ray's autoscaler report ({}): {}", unknown, exc)
        return None
    data = body.get("data") if isinstance(body, Mapping) else None
    status = _either(data, "cluster_status") if isinstance(data, Mapping) else None
    report = _either(status, "load_metrics_report") if isinstance(status, Mapping) else None
    return report if isinstance(report, Mapping) else None


def _either(mapping: Mapping[str, Any], snake: str) -> Any:
    """A key of a dashboard answer, as written or camel-cased by the dashboard."""
    return mapping.get(snake, mapping.get(_camel(snake)))


def _add_strategies(groups: list[dict[str, Any]], report: Mapping[str, Any] | None) -> None:
    """Each group's strategy, where the autoscaler report's pending groups with its exact bundles name one."""
    demand = _either(report, "pg_demand") if report is not None else None
    if not isinstance(demand, list):
        return
    known: list[tuple[Counter[tuple[tuple[str, float], ...]], str]] = []
    for entry in demand:
        spec = entry[0] if isinstance(entry, (list, tuple)) and entry else entry
        if not isinstance(spec, Mapping) or not spec.get("strategy"):
            continue
        shape: Counter[tuple[tuple[str, float], ...]] = Counter()
        for item in spec.get("bundles") or []:
            bundle, count = (item[0], item[1]) if isinstance(item, (list, tuple)) and len(item) == 2 else (item, 1)
            shape[tuple(sorted(resources_of(bundle).items()))] += int(count)
        known.append((shape, str(spec["strategy"])))
    for group in groups:
        strategies = {strategy for shape, strategy in known if shape == _shape(group[keys.BUNDLES])}
        if len(strategies) == 1:
            group[keys.STRATEGY] = strategies.pop()


def free_by_node(nodes: list[Any], report: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Free resources of each alive node, by node id, from the report's [used, total] per node (keyed by IP, or
    by node id where the autoscaler is told to); a node whose IP another alive node shares is left out."""
    usage = _either(report, "usage_by_node") if report is not None else None
    if not isinstance(usage, Mapping):
        return {}
    alive = [n for n in nodes if text_of(field_of(n, "state")) == "ALIVE"]
    ips = Counter(field_of(n, "node_ip") for n in alive)
    free: dict[str, dict[str, float]] = {}
    for node in alive:
        node_id, ip = str(field_of(node, "node_id")), field_of(node, "node_ip")
        row = usage.get(node_id) if node_id in usage else (usage.get(ip) if ips[ip] == 1 else None)
        if not isinstance(row, Mapping):
            continue
        names = {_camel(name): name for name in (field_of(node, "resources_total") or {})}
        names.update({name: name for name in (field_of(node, "resources_total") or {})})
        node_free = {}
        for key, pair in row.items():
            try:
                used, total = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            node_free[names.get(str(key), str(key))] = max(0.0, total - used)
        free[node_id] = node_free
    return free
