"""Ray's metrics and the DCGM exporter simulator, scraped by a real Prometheus and read through
prometheus-api-client, as Argus reads a production Prometheus."""

import pytest

from collectors.prometheus import PrometheusClient, PrometheusTargetsCollector
from core.errors import InputError, SourceUnavailable
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until


@pytest.fixture
def dcgm_targets(prometheus_stack, ray_cluster):
    """A simulated 2-GPU exporter on each worker's loopback address, scraped by the session Prometheus."""
    sims = [DcgmExporterSim(f"gpu-node-{w.index}", gpus=2, host=w.ip).start() for w in ray_cluster.workers]
    prometheus_stack.prometheus.set_targets("dcgm", [f"{s.host}:{s.port}" for s in sims])
    yield sims
    prometheus_stack.prometheus.set_targets("dcgm", [])
    for sim in sims:
        sim.stop()


def test_dcgm_and_ray_series_through_prometheus_api_client(prometheus_stack, dcgm_targets, ray_cluster):
    client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=5)
    dcgm_targets[0].set_gpu(1, util=87, xid=79)

    def util_of_gpu1():
        rows = client.query('DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-1", gpu="1"}')
        return rows if rows and rows[0]["value"][1] == "87" else None

    [row] = wait_until("the simulated GPU's utilisation in Prometheus", util_of_gpu1, timeout=60)
    assert row["metric"]["modelName"].startswith("NVIDIA") and row["metric"]["UUID"].startswith("GPU-")
    xid = wait_until("the Xid", lambda: client.query('DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-node-1",gpu="1"} > 0'),
                     timeout=60)
    assert xid[0]["value"][1] == "79"
    assert len(wait_until("4 GPUs", lambda: (r := client.query("DCGM_FI_DEV_FB_USED")) and len(r) == 4 and r,
                          timeout=60)) == 4

    ray_ips = {n.ip for n in ray_cluster.nodes}
    mem = wait_until("Ray node memory per node",
                     lambda: (r := client.query("ray_node_mem_total")) and {x["metric"].get("ip") for x in r} >= ray_ips
                     and r, timeout=60)
    assert all(float(x["value"][1]) > 0 for x in mem)


def test_targets_collector_sees_every_target_up(prometheus_stack, dcgm_targets):
    collector = PrometheusTargetsCollector(PrometheusClient(prometheus_stack.prometheus.url))
    expected = {f"{s.host}:{s.port}" for s in dcgm_targets}

    def dcgm_up():  # targets of an earlier test may linger for a scrape or two after they were removed
        return {x.subject.id for x in collector.collect() if x.attrs["job"] == "dcgm" and x.value == 1}

    wait_until("exactly this test's dcgm targets up", lambda: dcgm_up() == expected, timeout=60)
    stopped = f"{dcgm_targets[0].host}:{dcgm_targets[0].port}"
    dcgm_targets[0].stop()
    down = wait_until(  # this test's target: one an earlier test stopped may still be listed down for a scrape
        "the stopped exporter to be down",
        lambda: [x for x in collector.collect() if x.attrs["job"] == "dcgm" and x.value == 0
                 and x.subject.id == stopped],
        timeout=60,
    )
    assert down[0].subject.name == dcgm_targets[0].host


def test_unreachable_prometheus_and_bad_query_are_clear_errors(prometheus_stack):
    with pytest.raises(SourceUnavailable) as info:
        PrometheusClient("http://127.0.0.1:9", timeout_s=2).query("up")
    assert "Prometheus at http://127.0.0.1:9" in info.value.message and "ARGUS_PROMETHEUS_URL" in info.value.hint
    with pytest.raises(InputError, match="rejected the query"):
        PrometheusClient(prometheus_stack.prometheus.url).query("sum(")
