"""What RayStateCollector reads of jobs waiting for a place, with Ray 2.60's answers given as it gives them (dicts
standing in for the state API; the autoscaler report as the dashboard's /api/cluster_status returns it, keys
camel-cased). The real cluster: tests/detectors/test_waiting_real.py."""

from __future__ import annotations

from typing import Any

from collectors.ray_state import RayStateCollector
from core import signal_keys as keys
from core.types import Signal, SignalKind

W1, W2 = "1" * 56, "2" * 56


class Ray:
    """The state API calls and the dashboard route RayStateCollector makes; `fail` names calls that fail."""

    def __init__(self, jobs: list[dict[str, Any]], groups: list[dict[str, Any]] = (), *,
                 report: dict[str, Any] | None = None, pending_actors: list[dict[str, Any]] = (),
                 fail: set[str] = frozenset()) -> None:
        self.jobs, self.groups, self.report = jobs, list(groups), report
        self.pending_actors, self.fail = list(pending_actors), set(fail)
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise ConnectionError(f"{name} failed")

    def list_nodes(self, **_: Any) -> list[dict[str, Any]]:
        self._call("list_nodes")
        return [{"node_id": node_id, "node_ip": ip, "state": "ALIVE", "is_head_node": False, "state_message": None,
                 "resources_total": {"CPU": 1.0, "GPU": 4.0, "worker": 1.0, "no_such": 2.0}, "labels": {},
                 "start_time_ms": 1, "end_time_ms": 0}
                for node_id, ip in ((W1, "127.0.0.3"), (W2, "127.0.0.4"))]

    def list_jobs(self, **_: Any) -> list[dict[str, Any]]:
        self._call("list_jobs")
        return self.jobs

    def list_actors(self, filters=None, detail=False, **_: Any) -> list[dict[str, Any]]:
        self._call("list_actors")
        if filters == [("state", "=", "PENDING_CREATION")]:
            assert detail, "label selectors come only with detail"
            return self.pending_actors
        return []

    def list_placement_groups(self, filters=None, **_: Any) -> list[dict[str, Any]]:
        self._call("list_placement_groups")
        assert filters == [("state", "!=", "REMOVED")]
        return self.groups

    def get_json(self, path: str) -> dict[str, Any]:
        self._call(path)
        return {"result": True, "msg": "Got cluster status.",
                "data": {"autoscalingStatus": None, "autoscalingError": None, "clusterStatus": self.report}}


def pending_job(sid: str = "res-1") -> dict[str, Any]:
    # JobDetails as list_jobs gives it: Ray's entrypoint_num_cpus / _resources are not in it
    return {"job_id": None, "submission_id": sid, "status": "PENDING", "entrypoint": "echo never",
            "start_time": 1_795_316_840_376, "driver_node_id": None}


RUNNING = {"job_id": "05000000", "submission_id": "pg-1", "status": "RUNNING", "entrypoint": "python pg.py",
           "start_time": 1_795_316_840_376, "entrypoint_resources": {"worker": 0.001}}
GROUP = {"placement_group_id": "ab" * 14, "name": "too-big", "creator_job_id": "05000000", "state": "PENDING",
         "bundles": [{"bundle_id": {}, "unit_resources": {"CPU": 1000.0}, "label_selector": {}},
                     {"bundle_id": {}, "unit_resources": {"CPU": 1000.0}, "label_selector": {"zone": "a"}}],
         "is_detached": False,
         "stats": {"creation_request_received_ns": "1795316841000000000", "scheduling_state": "INFEASIBLE"}}
PLACED = {**GROUP, "placement_group_id": "cd" * 14, "name": "", "state": "CREATED"}
REPORT = {"loadMetricsReport": {
    # the dashboard camel-cases dict keys (no_such -> noSuch), not what sits inside lists
    "usageByNode": {"127.0.0.3": {"CPU": [1.0, 1.0], "GPU": [0.0, 4.0], "worker": [0.001, 1.0],
                                  "noSuch": [0.0, 2.0]},
                    "127.0.0.4": {"CPU": [0.0, 1.0], "GPU": [4.0, 4.0], "worker": [0.0, 1.0]}},
    "pgDemand": [[{"bundles": [[{"CPU": 1000.0}, 2]], "strategy": "SPREAD"}, 1],
                 [{"bundles": [[{"GPU": 8.0}, 1]], "strategy": "PACK"}, 1]]}}


def signals_of(ray: Ray, kind: SignalKind) -> list[Signal]:
    return [s for s in RayStateCollector("http://head:8265", state_api=ray).collect() if s.kind is kind]


def test_a_pending_jobs_demand_selector_and_the_free_resources_per_node() -> None:
    supervisor = {"name": "_ray_internal_job_actor_res-1", "state": "PENDING_CREATION",
                  "label_selector": {"argus.io/pool": "h100"}, "required_resources": {"no_such_thing": 1.0, "GPU": 2.0}}
    ray = Ray([pending_job()], report=REPORT, pending_actors=[supervisor, {"name": "other", "label_selector": {}}])
    collector = RayStateCollector("http://head:8265", state_api=ray)
    signals = collector.collect()
    [job] = [s for s in signals if s.kind is SignalKind.JOB_STATE]
    assert job.attrs[keys.ENTRYPOINT_RESOURCES] == {"no_such_thing": 1.0, "GPU": 2.0}
    assert job.attrs[keys.LABEL_SELECTOR] == {"argus.io/pool": "h100"}
    assert job.attrs[keys.WAITING_GROUPS] == []
    free = {s.attrs[keys.NODE_IP]: s.attrs[keys.RESOURCES_AVAILABLE] for s in signals
            if s.kind is SignalKind.NODE_STATE}
    assert free == {"127.0.0.3": {"CPU": 0.0, "GPU": 4.0, "worker": 0.999, "no_such": 2.0},
                    "127.0.0.4": {"CPU": 1.0, "GPU": 0.0, "worker": 1.0}}
    assert "/api/cluster_status" in ray.calls


def test_a_running_jobs_unplaced_groups_with_their_strategy_from_the_autoscaler_report() -> None:
    signals = RayStateCollector("http://head:8265", state_api=Ray([{**RUNNING, "driver_node_id": W1}], [GROUP, PLACED],
                                                                   report=REPORT)).collect()
    [job] = [s for s in signals if s.kind is SignalKind.JOB_STATE]
    # what waits is on the job's own signal only, never in the job lists of nodes
    [listed] = next(s for s in signals if s.subject.id == W1).attrs[keys.JOBS]
    assert listed[keys.SUBMISSION_ID] == "pg-1" and keys.WAITING_GROUPS not in listed
    [group] = job.attrs[keys.WAITING_GROUPS]
    assert group[keys.BUNDLES] == [{"CPU": 1000.0}, {"CPU": 1000.0}]
    assert group[keys.BUNDLE_SELECTORS] == [{}, {"zone": "a"}]
    assert (group[keys.STRATEGY], group[keys.STATE], group[keys.SCHEDULING_STATE]) == ("SPREAD", "PENDING",
                                                                                       "INFEASIBLE")
    assert group[keys.GROUP_NAME] == "too-big" and group[keys.SINCE].startswith("2026-11-22T")
    assert job.attrs[keys.PLACED_GROUPS] == ["cd" * 14]  # the placed one: only its id


def test_nothing_waits_so_nothing_more_is_asked() -> None:
    ray = Ray([dict(RUNNING)])
    [job] = signals_of(ray, SignalKind.JOB_STATE)
    assert job.attrs[keys.WAITING_GROUPS] == [] and job.attrs[keys.LABEL_SELECTOR] is None
    assert job.attrs[keys.ENTRYPOINT_RESOURCES] is None
    assert "/api/cluster_status" not in ray.calls and ray.calls.count("list_actors") == 1
    assert all(s.attrs[keys.RESOURCES_AVAILABLE] is None for s in signals_of(ray, SignalKind.NODE_STATE))


def test_what_waits_unreadable_is_unknown_and_the_poll_goes_on() -> None:
    ray = Ray([pending_job(), RUNNING], [GROUP], fail={"list_placement_groups", "/api/cluster_status"})
    jobs = {s.subject.id: s for s in signals_of(ray, SignalKind.JOB_STATE)}
    assert jobs["pg-1"].attrs[keys.WAITING_GROUPS] is None and jobs["pg-1"].attrs[keys.PLACED_GROUPS] is None
    # its supervisor actor not listed: what the driver asks for is unknown, not nothing
    assert jobs["res-1"].attrs[keys.ENTRYPOINT_RESOURCES] is None and jobs["res-1"].attrs[keys.LABEL_SELECTOR] is None


def test_a_cluster_without_the_autoscaler_report_leaves_free_resources_unknown() -> None:
    ray = Ray([RUNNING], [GROUP], report=None)
    [job] = signals_of(ray, SignalKind.JOB_STATE)
    assert job.attrs[keys.WAITING_GROUPS][0][keys.STRATEGY] is None
    assert all(s.attrs[keys.RESOURCES_AVAILABLE] is None for s in signals_of(ray, SignalKind.NODE_STATE))
