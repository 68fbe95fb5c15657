"""What the API's job, node and ops routes act through, built once by argus.wiring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors.ray_capacity import RayCapacity
from control.jobs import JobController
from control.node_manager import NodeManager
from control.nodes import NodeRegistry, NodeSpec
from control.queue import JobQueue, TickOutcome
from control.queue import QueueStore as JobQueueStore
from core.errors import NotAllowed, NotConfigured, NotFound


@dataclass(frozen=True)
class ControlPlane:
    jobs: JobController
    registry: NodeRegistry
    manager: NodeManager | None  # None when no GCS address is configured: nodes are listed, not acted on
    queue: JobQueue  # every job Argus starts goes through it (gang admission, FIFO, per-user limits)
    ssh_key_dirs: tuple[Path, ...]

    def nodes(self) -> NodeManager:
        if self.manager is None:
            raise NotConfigured(
                "node steps (join, drain, undrain, offline, probe) are off: this Argus has no GCS address",
                hint="set ray_gcs_address (ARGUS_RAY_GCS_ADDRESS=<head>:<gcs port>) and restart Argus",
            )
        return self.manager

    def check_key_path(self, spec: NodeSpec) -> None:
        """The node's private key is one of the keys the admin put in an allowed folder: an API caller must
        not point Argus at any other file on this host."""
        real = Path(spec.ssh_key_path).resolve()
        roots = [d.resolve() for d in self.ssh_key_dirs]
        if not any(real.is_relative_to(root) for root in roots):
            raise NotAllowed(
                f"ssh_key_path {spec.ssh_key_path} of node {spec.name} is outside the SSH key folders "
                f"({', '.join(str(r) for r in roots) or 'none'})",
                hint="put the key in one of them, or ask an admin to add its folder to node_ssh_key_dirs",
            )
        if not real.is_file():
            raise NotFound(f"ssh_key_path {spec.ssh_key_path} of node {spec.name} is not a file",
                             hint="copy the private key there first (mode 600)")


def job_queue(store: JobQueueStore, jobs: JobController, registry: NodeRegistry | None, *, timeout_s: float = 10.0,
              default_timeout_s: float | None = None,
              user_limit: Callable[[str], int | None] = lambda _user: None,
              observe: Callable[[TickOutcome], None] | None = None) -> JobQueue:
    """The queue every job Argus starts goes through, reading Ray's capacity from the jobs' dashboard."""
    capacity = RayCapacity(jobs.dashboard_url, timeout_s=timeout_s)
    return JobQueue(store, jobs, capacity.read, registry=registry, default_timeout_s=default_timeout_s,
                    user_limit=user_limit, observe=observe)
