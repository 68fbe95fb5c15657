"""GPU and host metrics around an incident, read from a real Prometheus scraping the DCGM exporter simulator
and the session Ray cluster, summarised per node, and shown in the report."""

from __future__ import annotations

import pytest

from collectors.prometheus import PrometheusClient
from core.types import Category, utcnow
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.metrics import PrometheusMetricsReader
from rca.redact import Redactor
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until
from tests.rca.test_report import OOM_LOG, finding, incident


@pytest.fixture
def sim(prometheus_stack, ray_cluster):
    worker = ray_cluster.workers[0]
    exporter = DcgmExporterSim("gpu-node-7", gpus=2, host=worker.ip).start()
    prometheus_stack.prometheus.set_targets("dcgm", [f"{exporter.host}:{exporter.port}"])
    yield exporter
    prometheus_stack.prometheus.set_targets("dcgm", [])
    exporter.stop()


def test_metrics_around_the_event_per_node(prometheus_stack, ray_cluster, sim) -> None:
    client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=5)
    ip = ray_cluster.workers[0].ip
    sim.set_gpu(0, util=97, fb_used_mib=70_000, xid=79)
    sim.set_gpu(1, util=3)
    wait_until("the simulated Xid in Prometheus",
               lambda: client.query(f'DCGM_FI_DEV_XID_ERRORS{{instance="{ip}:{sim.port}"}} > 0'), timeout=60)
    wait_until("Ray's node memory in Prometheus", lambda: client.query(f'ray_node_mem_total{{ip="{ip}"}}'), timeout=60)

    reader = PrometheusMetricsReader(client, before_s=120, after_s=5, step_s=1)
    hit = incident(Category.GPU_HARDWARE, "XidCritical", node_ip=ip).model_copy(update={"first_seen": utcnow()})
    by_name = {m.name: m for m in reader(hit)}
    assert by_name["gpu_last_xid"].last == 79 and by_name["gpu_last_xid"].labels["node_ip"] == ip
    assert by_name["gpu_util_mean"].last == 50  # (97 + 3) / 2
    assert by_name["gpu_fb_used_max"].last == 70_000
    assert 0 < by_name["host_mem_used_ratio"].last < 1

    engine = RcaEngine(load_rules([]), Redactor, metrics=reader)
    report = engine.report(hit, [finding("JobFailed", Category.UNKNOWN, "x")], [OOM_LOG])
    assert "| gpu_last_xid " in report.markdown and f"| {ip} |" in report.markdown


def test_prometheus_down_leaves_the_report_without_metrics_and_says_so(ray_cluster) -> None:
    from stage.localstack.ports import free_port

    reader = PrometheusMetricsReader(PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=2))
    engine = RcaEngine(load_rules([]), Redactor, metrics=reader)
    report = engine.report(incident(node_ip="10.0.0.7"), [finding("JobFailed", Category.UNKNOWN, "x")], [OOM_LOG])
    assert report.category is Category.GPU_OOM and "metrics (could not read them" in report.markdown
