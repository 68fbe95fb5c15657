"""GpuPlacementCollector on the real session Ray cluster.

Real: the Ray cluster, a submitted job, its actors, task and placement group, Ray's state API, the
exporter's text. The GPUs are Ray's bookkeeping only: workers advertise 4 GPUs each (`--num-gpus=4`)
and no GPU exists on this machine, so what is tested is which job Ray says holds how many GPUs where.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from argus.exporter import ArgusMetrics
from collectors.placement import GpuPlacementCollector, JobPlacement, NodeGpus
from core.errors import SourceUnavailable
from core.types import SignalKind, SubjectKind
from tests.helpers import holding_job, wait_until

# worker1: an actor with 2 GPUs and one placement group bundle; worker2: the other bundle and a task.
# The actors inside the bundles use the bundles' GPUs, so they must not be counted a second time.
JOB = """
import time, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init()

@ray.remote(num_cpus=0)
class Holder:
    def ready(self):
        return True

@ray.remote(num_cpus=0, num_gpus=1, resources={"worker2": 0.01})
def hold():
    time.sleep(900)

pair = Holder.options(num_gpus=2, resources={"worker1": 0.01}).remote()
pg = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="STRICT_SPREAD")
ray.get(pg.ready())
in_pg = [Holder.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
         for i in range(2)]
ray.get([pair.ready.remote()] + [a.ready.remote() for a in in_pg])
task = hold.remote()
print("HOLDING", flush=True)
time.sleep(900)
"""


def job_gpus_samples(metrics: ArgusMetrics, submission_id: str) -> dict[str, tuple[float, dict]]:
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    return {
        s.labels["node_ip"]: (s.value, s.labels)
        for s in families["argus_job_gpus"].samples
        if s.labels["submission_id"] == submission_id
    }


@pytest.fixture
def gpu_job(ray_cluster, tmp_workdir):
    with holding_job(ray_cluster.dashboard_url, tmp_workdir / "hold_gpus.py", JOB, owner="dave") as (sid, stop):
        yield sid, stop


def test_placement_of_a_real_job_and_its_exported_metric(ray_cluster, gpu_job):
    sid, stop = gpu_job
    w1, w2 = ray_cluster.worker(1), ray_cluster.worker(2)
    metrics = ArgusMetrics()
    collector = GpuPlacementCollector(ray_cluster.dashboard_url, on_placement=metrics.set_job_gpus)

    def placement_of_job():
        # the running task shows in the state API a moment after it starts
        signals = collector.collect()
        mine = [s for s in signals if s.subject.id == sid]
        return (signals, mine[0]) if mine and mine[0].attrs["placement"].get(w2.ip) == 2 else None

    signals, job = wait_until("the job's 5 GPUs in the map", placement_of_job, timeout=60)
    assert job.kind is SignalKind.METRIC and job.subject.kind is SubjectKind.JOB
    assert job.attrs["metric"] == "argus_job_gpus" and job.value == 5
    assert job.attrs["placement"] == {w1.ip: 3, w2.ip: 2}
    assert job.attrs["status"] == "RUNNING" and job.attrs["owner"] == "dave"
    assert job.attrs["job_id"] and job.attrs["submission_id"] == sid
    assert job.attrs["gpu_indices_known"] is False
    by_ip = {n["node_ip"]: n for n in job.attrs["nodes"]}
    assert by_ip[w1.ip]["node_id"] == w1.node_id and by_ip[w1.ip]["node_gpus_total"] == 4
    assert by_ip[w1.ip]["whole_node"] is False

    [snapshot] = [s for s in signals if s.attrs["metric"] == "argus_gpu_placement"]
    assert snapshot.subject.kind is SubjectKind.CLUSTER and sid in snapshot.attrs["jobs"]
    nodes = {n["node_ip"]: n for n in snapshot.attrs["nodes"]}
    assert nodes[w1.ip]["gpus_total"] == 4 and nodes[ray_cluster.head.ip]["gpus_total"] == 0

    exported = job_gpus_samples(metrics, sid)
    assert {ip: value for ip, (value, _) in exported.items()} == {w1.ip: 3, w2.ip: 2}
    labels = exported[w1.ip][1]
    assert labels["owner"] == "dave" and labels["node_id"] == w1.node_id
    assert labels["job_id"] == job.attrs["job_id"] and "entrypoint" not in labels

    stop()
    wait_until("the job to leave the map",
               lambda: not [s for s in collector.collect() if s.subject.id == sid])
    assert job_gpus_samples(metrics, sid) == {}


def test_unreachable_ray_is_a_clear_error():
    with pytest.raises(SourceUnavailable) as info:
        GpuPlacementCollector("http://127.0.0.1:9", timeout_s=2).collect()
    assert "Ray state API at http://127.0.0.1:9" in info.value.message
    assert "ARGUS_RAY_DASHBOARD_URL" in info.value.hint


def test_job_placement_key_and_totals():
    job = JobPlacement("03000000", None, "RUNNING", None, None,
                       (NodeGpus("n1", "10.0.0.1", "a", 8, 8), NodeGpus("n2", "10.0.0.2", "b", 0.5, 8)))
    assert job.key == "03000000" and job.gpus == 8.5
    assert [n.whole_node for n in job.nodes] == [True, False]
