"""The dashboards against the real local stack.

- The Ray metric names the dashboards use are served by the installed Ray (a live scrape of the session
  cluster), and dashboards/known_metrics/ray.txt was written from this Ray version.
- Every query of every dashboard runs on a real Prometheus scraping the Ray cluster, the dcgm-exporter
  SIMULATOR (bound on a Ray worker's IP, as dcgm-exporter runs on each node) and Argus's own /metrics, and
  the joins between them return the job's GPUs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from argus.dashboards.build import build_all
from argus.dashboards.check import check_built
from argus.dashboards.known_metrics import RAY_METRICS_FILE, known_metrics, read_metric_list, recorded_ray_version
from argus.dashboards.queries import queries_of, substitute, variable_promql, variable_samples
from argus.dashboards.ray_scrape import wait_for_ray_names
from argus.exporter import ArgusMetrics
from collectors.placement import JobPlacement, NodeGpus
from core.errors import ConfigError
from detectors.stall import JobProgress
from stage.localstack.ports import free_port
from stage.sim.dcgm_exporter import DcgmExporterSim

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RAY_LIST = DASHBOARDS / RAY_METRICS_FILE
SUBMISSION = "raysubmit_dashboards"


def _expr(built, dashboard: str, where: str) -> str:
    b = next(b for b in built if b.name == f"{dashboard}.dashboard.py")
    return next(q.text for q in queries_of(b.name, b.data())[0] if q.where == where)


@pytest.mark.ray
def test_ray_metric_names_the_dashboards_use_are_served_by_the_installed_ray(ray_cluster):
    built, problems = build_all(DASHBOARDS)
    assert problems == []
    ray_names = read_metric_list(RAY_LIST)
    used = {name for name in check_built(built, known_metrics(DASHBOARDS)).uses if name in ray_names}
    assert {"ray_node_cpu_utilization", "ray_node_mem_used", "ray_node_disk_usage"} <= used

    served, versions = wait_for_ray_names(ray_cluster.sd_file, nodes=len(ray_cluster.nodes), timeout=180)

    assert sorted(used - served) == [], "Ray no longer serves these; fix the dashboards and regenerate ray.txt"
    assert versions == {recorded_ray_version(RAY_LIST)}, (
        "ray.txt was scraped from another Ray version: run `argus dashboards ray-metrics`"
    )


@pytest.mark.prometheus
@pytest.mark.ray
def test_every_dashboard_query_runs_on_real_prometheus(prometheus_stack):
    prom = prometheus_stack.prometheus
    worker_ip = prometheus_stack.ray.worker(1).ip
    tag = uuid.uuid4().hex[:8]
    dcgm_job, argus_job = f"dcgm-dash-{tag}", f"argus-dash-{tag}"

    sim = DcgmExporterSim("worker1", gpus=4, host=worker_ip).start()
    sim.set_all(util=0, fb_used_mib=2048, power_w=85.0, temp_c=40)  # held but idle
    metrics = ArgusMetrics()
    metrics.set_job_gpus([JobPlacement(
        job_id="03000000", submission_id=SUBMISSION, status="RUNNING", owner="alice", entrypoint=None,
        nodes=(NodeGpus(node_id="n1", node_ip=worker_ip, node_name=worker_ip, gpus=4.0, node_gpus_total=4.0),),
    )])
    metrics.set_job_progress({SUBMISSION: JobProgress(step=120.0, interval_s=2.0)})
    server, thread = start_http_server(free_port(), addr="127.0.0.1", registry=metrics.registry)
    try:
        prom.set_targets(dcgm_job, [f"{worker_ip}:{sim.port}"])
        prom.set_targets(argus_job, [f"127.0.0.1:{server.server_port}"])
        prom.wait_for_series(f'argus_job_gpus{{submission_id="{SUBMISSION}", job="{argus_job}"}}', timeout=90)
        prom.wait_for_series(f'DCGM_FI_DEV_GPU_UTIL{{job="{dcgm_job}"}}', timeout=90, min_series=4)
        prom.wait_for_series(f'ray_node_cpu_utilization{{ip="{worker_ip}"}}', timeout=120)

        results: dict[tuple[str, str], list[dict]] = {}
        errors: list[str] = []
        built, problems = build_all(DASHBOARDS)
        assert problems == []
        for b in built:
            data = b.data()
            queries, problems = queries_of(b.name, data)
            assert problems == []
            # Windows short enough for series a few seconds old; the chosen job and node are real.
            samples = variable_samples(data) | {"submission_id": SUBMISSION, "node": worker_ip, "__range": "5m",
                                                "__rate_interval": "1m", "__interval": "15s"}
            for query in queries:
                expr, unknown = substitute(query.text, samples)
                assert unknown == []
                if query.kind == "variable":
                    expr, trouble = variable_promql(expr)
                    assert trouble is None and expr
                try:
                    results[(b.name, query.where)] = prom.query(expr)
                except ConfigError as exc:
                    errors.append(f"{b.name}: {query.where}: {exc}")
        assert errors == []
        assert len(results) > 60

        def series(dashboard: str, where: str) -> list[dict]:
            return results[(f"{dashboard}.dashboard.py", where)]

        job_util = [s for s in series("job", "panel 'GPU utilisation', query A") if s["metric"]["job"] == dcgm_job]
        assert len(job_util) == 4 and {s["metric"]["node_ip"] for s in job_util} == {worker_ip}
        idle = [s for s in series("cluster", "panel 'Idle GPUs held by jobs', query A")
                if s["metric"].get("submission_id") == SUBMISSION]
        assert [(s["metric"]["owner"], float(s["value"][1])) for s in idle] == [("alice", 4.0)]
        # GPU-hours sum a 1m-aligned subquery: the series counts from the first minute boundary it lives at.
        hours_expr, _ = substitute(_expr(built, "cluster", "panel 'GPU-hours by job', query A"), {"__range": "5m"})
        ours = f'argus_job_gpus{{submission_id="{SUBMISSION}"}}'
        hours = prom.wait_for_series(f"({hours_expr}) and on (submission_id) {ours}", timeout=120)
        assert [(s["metric"]["owner"], float(s["value"][1]) > 0) for s in hours] == [("alice", True)]
        assert len([s for s in series("node", "panel 'GPU utilisation (DCGM)', query A")
                    if s["metric"]["job"] == dcgm_job]) == 4
        assert len(series("node", "panel 'Ray node CPU', query A")) == 1
        assert [float(s["value"][1]) for s in series("job", "panel 'Step', query A")] == [120.0]
        assert {s["metric"]["submission_id"] for s in series("job", "variable $submission_id")} >= {SUBMISSION}
    finally:
        prom.set_targets(dcgm_job, [])
        prom.set_targets(argus_job, [])
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        sim.stop()
