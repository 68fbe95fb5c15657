"""Ray's metric names from a throwaway local cluster: `argus-stage ray-metrics`.

A stage tool: it starts Ray here (head + one worker advertising GPUs). On a real cluster,
`argus dashboards ray-metrics --target host:port` scrapes the running Ray instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from argus.dashboards.ray_scrape import wait_for_ray_names
from stage.localstack.ray_cluster import RayCluster


def scrape_local_ray(*, timeout: float = 180.0) -> tuple[set[str], set[str]]:
    """Start a throwaway local cluster (head + one worker advertising GPUs), scrape it, stop it: the metric
    names and Ray versions it served."""
    with tempfile.TemporaryDirectory(prefix="argus-ray-metrics-") as tmp:
        cluster = RayCluster(Path(tmp), worker_ips=("127.0.0.3",), worker_gpus=4)
        with cluster:
            return wait_for_ray_names(cluster.sd_file, nodes=len(cluster.nodes), timeout=timeout)
