"""What the job queue needs from Ray to admit gangs (control/admission.py): each alive node's GPUs in all and free,
its pool, and how many GPUs each submitted job already holds, by submission id.

As Ray 2.60 gives it (read through the dashboard, as collectors/ray_state.py does):
- Free GPUs per node: its total minus the GPUs of the placement groups placed on it and of the live actors outside
  any group, and no more than the autoscaler report (`/api/cluster_status`, [used, total] per node) says is free,
  which also counts GPU tasks. The report is rewritten every few seconds, so it lags: measured here, a group placed
  a moment ago was listed CREATED while the report still showed its GPUs free, and a third job was admitted into
  them. Where the report is missing (autoscaler v2) the groups and actors alone say.
- A job holds the GPUs of the placement groups it created that Ray placed (the bundles with a node: reserved
  whether or not its actors run yet; a group that lost a node is RESCHEDULING and still holds the others) and of
  its live actors outside any group. Groups and actors carry the Ray job id (hex), which the job's record maps to
  its submission id once its driver has connected.
- A node's pool is its `argus.io/pool` label (core.ray_labels), its name for people its `argus.io/node` label or
  else its IP.
"""

from __future__ import annotations

from typing import Any

from collectors.ray_api import RayStateApi
from collectors.ray_state import autoscaler_report, field_of, free_by_node, resources_of, text_of
from control.admission import ClusterGpus, NodeCapacity
from core.ray_labels import NODE_LABEL, POOL_LABEL

GPU = "GPU"


class RayCapacity:
    """Reads ClusterGpus from one Ray dashboard; SourceUnavailable when Ray's state cannot be read."""

    def __init__(self, dashboard_url: str, *, timeout_s: float = 10.0, state_api: Any = None) -> None:
        self._ray = RayStateApi(dashboard_url, timeout_s, state_api)

    def read(self) -> ClusterGpus:
        nodes = self._ray.call("list_nodes", detail=True)
        jobs = self._ray.call("list_jobs", detail=True)
        # CREATED groups, and the bundles a RESCHEDULING group (a node of it lost) still holds on the live nodes
        groups = self._ray.call("list_placement_groups", detail=True, filters=[("state", "!=", "REMOVED")])
        actors = self._ray.call("list_actors", detail=True, filters=[("state", "=", "ALIVE")])
        submission_of = {str(field_of(j, "job_id")): str(field_of(j, "submission_id")) for j in jobs
                         if field_of(j, "job_id") and field_of(j, "submission_id")}
        status_by_job = {str(field_of(j, "submission_id")): str(text_of(field_of(j, "status")))
                         for j in jobs if field_of(j, "submission_id")}
        held: dict[str, float] = {}
        used_on_node: dict[str, float] = {}
        for group in groups:
            job = submission_of.get(str(field_of(group, "creator_job_id") or ""))
            for bundle in field_of(group, "bundles") or []:
                if not field_of(bundle, "node_id"):
                    continue  # not placed (yet, or any more): it holds nothing
                gpus = resources_of(field_of(bundle, "unit_resources")).get(GPU, 0.0)
                if job:
                    held[job] = held.get(job, 0.0) + gpus
                node_id = field_of(bundle, "node_id")
                if node_id:
                    used_on_node[str(node_id)] = used_on_node.get(str(node_id), 0.0) + gpus
        for actor in actors:
            if field_of(actor, "placement_group_id"):
                continue  # counted with its group
            gpus = resources_of(field_of(actor, "required_resources")).get(GPU, 0.0)
            job = submission_of.get(str(field_of(actor, "job_id") or ""))
            if job and gpus:
                held[job] = held.get(job, 0.0) + gpus
            node_id = field_of(actor, "node_id")
            if node_id and gpus:
                used_on_node[str(node_id)] = used_on_node.get(str(node_id), 0.0) + gpus
        free = free_by_node(nodes, autoscaler_report(self._ray, "free GPUs counted from groups and actors"))
        capacity: list[NodeCapacity] = []
        names: dict[str, str] = {}
        for node in nodes:
            if text_of(field_of(node, "state")) != "ALIVE":
                continue
            node_id = str(field_of(node, "node_id"))
            labels = dict(field_of(node, "labels") or {})
            total = resources_of(field_of(node, "resources_total")).get(GPU, 0.0)
            if total <= 0:
                continue  # no GPU: no gang lands here (the CPU-only head)
            # The report lags Ray's placements by a few seconds; the groups and actors listed now do not: a GPU either
            # says is taken is taken.
            node_free = max(0.0, total - used_on_node.get(node_id, 0.0))
            reported = free.get(node_id, {}).get(GPU)
            if reported is not None:
                node_free = min(node_free, reported)
            if labels.get(NODE_LABEL):
                names[node_id] = labels[NODE_LABEL]
            capacity.append(NodeCapacity(node_id=node_id, name=labels.get(NODE_LABEL) or str(field_of(node, "node_ip")),
                                         pool=labels.get(POOL_LABEL), total_gpus=total, free_gpus=node_free))
        return ClusterGpus(nodes=tuple(capacity), held_by_job=held, status_by_job=status_by_job, node_names=names)
