"""IdleGpuDetector: the window logic with a fake clock and built signals, then on the real stack.

Unit tests build the signals the collectors emit (placement snapshot, argus_job_gpus, DCGM utilisation)
by hand. The real-stack test at the end says what is real and what is simulated.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from collectors.placement import GpuPlacementCollector, PrometheusGpuCollector
from collectors.prometheus import PrometheusClient
from core.errors import ConfigError
from core.types import Category, Signal, SignalKind, Subject, SubjectKind
from detectors.idle_gpu import IdleGpuDetector
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import holding_job, wait_until
from tests.support import Clock

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
W1 = ("node-w1", "10.0.0.1", 4.0)  # node id, ip, GPUs Ray advertises
W2 = ("node-w2", "10.0.0.2", 4.0)


def snapshot(*nodes: tuple[str, str, float]) -> Signal:
    return Signal(
        kind=SignalKind.METRIC, source="ray.placement", subject=Subject(kind=SubjectKind.CLUSTER, id="ray"),
        attrs={"metric": "argus_gpu_placement", "nodes": [
            {"node_id": n, "node_ip": ip, "node_name": ip, "state": "ALIVE", "gpus_total": total}
            for n, ip, total in nodes]},
    )


def job(key: str, holds: dict[tuple[str, str, float], float], status: str = "RUNNING", owner: str = "alice"):
    nodes = [{"node_id": n, "node_ip": ip, "node_name": ip, "gpus": g, "node_gpus_total": total,
              "whole_node": g >= total} for (n, ip, total), g in holds.items()]
    return Signal(
        kind=SignalKind.METRIC, source="ray.placement",
        subject=Subject(kind=SubjectKind.JOB, id=key, name="python train.py"),
        value=sum(holds.values()),
        attrs={"metric": "argus_job_gpus", "job_id": "02000000", "submission_id": key, "status": status,
               "owner": owner, "entrypoint": "python train.py", "nodes": nodes,
               "placement": {n["node_ip"]: n["gpus"] for n in nodes}},
    )


def util(node_ip: str, index: int, value: float, at: datetime, *, hostname: str = "gpu-host") -> Signal:
    uuid = f"GPU-{node_ip}-{index}"
    return Signal(
        kind=SignalKind.METRIC, source="prometheus:http://prom:9090",
        subject=Subject(kind=SubjectKind.GPU, id=uuid, name=f"{hostname}/gpu{index}"),
        observed_at=at, value=value,
        attrs={"metric": "DCGM_FI_DEV_GPU_UTIL", "hostname": hostname, "gpu": index, "uuid": uuid,
               "labels": {"instance": f"{node_ip}:9400", "Hostname": hostname, "gpu": str(index),
                          "UUID": uuid}},
    )


def node_util(node: tuple[str, str, float], value: float, at: datetime, gpus: int = 4) -> list[Signal]:
    return [util(node[1], i, value, at) for i in range(gpus)]


def poll(detector, clock, *signals_or_lists, every: float = 30.0):
    flat = []
    for item in signals_or_lists:
        flat.extend(item if isinstance(item, list) else [item])
    found = detector.detect(flat)
    clock.tick(every)
    return found


def idle_polls(detector, clock, n, *extra, value=1.0):
    """n polls, 30 s apart, of job-a holding all of W1 with every GPU at `value`%."""
    found = []
    for _ in range(n):
        found += poll(detector, clock, snapshot(W1, W2), job("job-a", {W1: 4}),
                      node_util(W1, value, clock.now), *extra)
    return found


def test_idle_for_the_whole_window_gives_one_finding_naming_job_owner_nodes_and_waste():
    clock = Clock(T0)
    detector = IdleGpuDetector(threshold_pct=5, window_s=600, clock=clock)
    assert idle_polls(detector, clock, 20) == []  # 0 .. 570 s: not yet a whole window
    [finding] = idle_polls(detector, clock, 1)  # at 600 s
    assert finding.category is Category.IDLE_GPU
    assert finding.subject.id == "job-a" and finding.attrs["owner"] == "alice"
    assert finding.attrs["gpus"] == 4 and finding.attrs["attribution"] == "exact"
    assert finding.attrs["nodes"][0]["node_ip"] == "10.0.0.1"
    assert finding.attrs["gpu_hours_wasted"] == pytest.approx(4 * 600 / 3600, abs=1e-4)
    assert "job-a" in finding.summary and "alice" in finding.summary and "10.0.0.1" in finding.summary
    assert "0.67 GPU-hours" in finding.summary and "per node" not in finding.summary
    assert finding.first_seen == T0 and finding.detected_at == T0 + timedelta(seconds=600)
    gpu_lines = [e for e in finding.evidence if "DCGM_FI_DEV_GPU_UTIL" in e.text]
    assert len(gpu_lines) == 4 and all(e.value == 1.0 and e.at is not None for e in gpu_lines)
    assert "ray job stop job-a" in finding.recommended_action
    assert idle_polls(detector, clock, 10) == []  # the same episode is reported once


def test_busy_gpus_stay_quiet_and_one_busy_poll_restarts_the_window():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=600, clock=clock)
    assert idle_polls(detector, clock, 30, value=90.0) == []
    assert idle_polls(detector, clock, 15) == []
    # one of the four GPUs busy for one poll: the window starts again
    assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}),
                node_util(W1, 0, clock.now)[:3] + [util(W1[1], 3, 50.0, clock.now)]) == []
    assert idle_polls(detector, clock, 20) == []
    assert len(idle_polls(detector, clock, 1)) == 1


def test_threshold_is_strict_and_configurable():
    clock = Clock(T0)
    assert idle_polls(IdleGpuDetector(threshold_pct=5, window_s=60, clock=clock), clock, 5, value=5.0) == []
    clock = Clock(T0)
    detector = IdleGpuDetector(threshold_pct=10, window_s=60, clock=clock)
    assert len(idle_polls(detector, clock, 5, value=5.0)) == 1


def test_a_job_that_is_not_running_or_released_its_gpus_is_quiet_and_ends_the_episode():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=600, clock=clock)
    for _ in range(30):
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}, status="STOPPED"),
                    node_util(W1, 0, clock.now)) == []
    assert idle_polls(detector, clock, 19) == []
    assert poll(detector, clock, snapshot(W1), node_util(W1, 0, clock.now)) == []  # job gone from the map
    assert idle_polls(detector, clock, 20) == []  # so the window started again
    assert len(idle_polls(detector, clock, 1)) == 1


def test_unknown_is_not_idle_no_samples_too_few_samples_or_stale_samples():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, stale_after_s=120, clock=clock)
    for _ in range(10):  # no DCGM at all
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4})) == []
    for _ in range(10):  # 3 of the 4 GPUs Ray advertises
        three = node_util(W1, 0, clock.now, gpus=3)
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), three) == []
    old = clock.now - timedelta(seconds=300)  # samples older than stale_after_s
    for _ in range(10):
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), node_util(W1, 0, old)) == []
    # DCGM from a host that is no Ray node
    for _ in range(10):
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), node_util(W2, 0, clock.now)) == []


def test_a_later_idle_episode_after_busy_is_a_new_finding_under_the_jobs_fingerprint():
    # the same job idle again is the same fault coming back: one fingerprint, so the desk reopens its incident
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=120, clock=clock)
    [first] = idle_polls(detector, clock, 5)
    assert idle_polls(detector, clock, 2, value=80.0) == []
    [second] = idle_polls(detector, clock, 5)
    assert first.fingerprint == second.fingerprint and first.subject == second.subject
    assert second.first_seen > first.detected_at


def test_same_episode_gives_the_same_fingerprint_in_a_fresh_detector():
    def run():
        clock = Clock(T0)
        return idle_polls(IdleGpuDetector(window_s=120, clock=clock), clock, 5)[0].fingerprint

    assert run() == run()


def test_a_poll_without_placement_changes_nothing_and_a_scrape_gap_keeps_a_reported_episode():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=120, stale_after_s=60, clock=clock)
    assert idle_polls(detector, clock, 2) == []
    assert poll(detector, clock, node_util(W1, 0, clock.now)) == []  # Ray unreachable this poll
    assert len(idle_polls(detector, clock, 2)) == 1  # the window kept running: 0, 30, (60), 90, 120
    for _ in range(4):  # DCGM gone for 2 minutes: unknown, but the reported episode stays open
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4})) == []
    assert idle_polls(detector, clock, 10) == []


def test_shared_node_is_attributed_per_node_and_a_busy_neighbour_keeps_the_job_unflagged():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, clock=clock)
    found = []
    for _ in range(3):
        found += poll(detector, clock, snapshot(W1, W2), job("job-b", {W1: 4, W2: 1}, owner="bob"),
                      node_util(W1, 0, clock.now), node_util(W2, 2, clock.now))
    [finding] = found
    assert finding.attrs["attribution"] == "per_node" and finding.attrs["gpus"] == 5
    assert "attribution is per node on 10.0.0.2" in finding.summary and "bob" in finding.summary
    assert {n["node_ip"]: n["attribution"] for n in finding.attrs["nodes"]} == {
        "10.0.0.1": "exact", "10.0.0.2": "per_node"}
    assert finding.confidence < 1.0

    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, clock=clock)
    for _ in range(6):  # another job keeps one GPU of W2 busy: which GPU is job-b's is unknown
        w2 = node_util(W2, 0, clock.now)[:3] + [util(W2[1], 3, 70.0, clock.now)]
        assert poll(detector, clock, snapshot(W1, W2), job("job-b", {W1: 4, W2: 1}),
                    node_util(W1, 0, clock.now), w2) == []


def test_hostname_matching_with_a_map_when_the_exporter_is_not_scraped_at_the_node_ip():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, node_match=("hostname",),
                               hostname_to_node_ip={"dgx-01": "10.0.0.1"}, clock=clock)
    found = []
    for _ in range(3):
        samples = [util("192.168.9.9", i, 0.0, clock.now, hostname="dgx-01") for i in range(4)]
        found += poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), samples)
    assert len(found) == 1
    # by instance only, the same samples (scraped at another address) match nothing
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, node_match=("instance",), clock=clock)
    for _ in range(3):
        samples = [util("192.168.9.9", i, 0.0, clock.now, hostname="dgx-01") for i in range(4)]
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), samples) == []


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="node_match"):
        IdleGpuDetector(node_match=("ip",))
    with pytest.raises(ConfigError, match="threshold_pct"):
        IdleGpuDetector(threshold_pct=0)
    with pytest.raises(ConfigError, match="window_s"):
        IdleGpuDetector(window_s=0)


# -- recovery ------------------------------------------------------------------------------------------


def test_gpus_used_again_close_the_episode_once_naming_the_busiest_gpu():
    clock = Clock(T0)
    detector = IdleGpuDetector(threshold_pct=5, window_s=120, clock=clock)
    [finding] = idle_polls(detector, clock, 5)
    assert detector.recoveries() == []
    assert idle_polls(detector, clock, 3) == [] and detector.recoveries() == []  # still idle
    at = clock.now
    busy = [util(W1[1], 0, 1.0, at), util(W1[1], 1, 12.0, at), util(W1[1], 2, 37.0, at), util(W1[1], 3, 0.0, at)]
    assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}), busy) == []
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == finding.fingerprint and recovery.detector == "idle_gpu"
    assert recovery.observed_at == at
    assert recovery.reason == "GPU utilisation back to 37% on 10.0.0.1 GPU 2 (at or over the 5% threshold)"
    assert idle_polls(detector, clock, 3, value=80.0) == [] and detector.recoveries() == []  # told once


def test_no_recovery_on_missing_data_nor_for_an_episode_never_reported():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=120, stale_after_s=60, clock=clock)
    assert idle_polls(detector, clock, 3) == []  # idle, not yet a whole window
    assert idle_polls(detector, clock, 1, value=50.0) == []
    assert detector.recoveries() == []  # the busy poll ended an episode nobody was told of
    [finding] = idle_polls(detector, clock, 5)
    for _ in range(4):  # DCGM gone: the GPUs are unknown, not busy
        assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4})) == []
    assert detector.recoveries() == []
    # busy samples that match no node of the job (another host's exporter)
    assert poll(detector, clock, snapshot(W1, W2), job("job-a", {W1: 4}), node_util(W2, 90.0, clock.now)) == []
    assert detector.recoveries() == []
    assert poll(detector, clock, node_util(W1, 90.0, clock.now)) == []  # busy samples but no placement
    assert detector.recoveries() == []
    # the next poll with placement judges them (still fresh): the job's GPUs are busy
    assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4})) == []
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == finding.fingerprint and "back to 90% on 10.0.0.1" in recovery.reason


def test_a_job_that_leaves_running_or_releases_its_gpus_closes_its_episode():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, clock=clock)
    [first] = idle_polls(detector, clock, 3)
    # STOPPED, yet an actor of it still holds the GPUs in Ray (a detached actor outlives its job): the episode
    # ends, but the GPUs are still held idle, so it is no recovery and the incident stays open
    assert poll(detector, clock, snapshot(W1), job("job-a", {W1: 4}, status="STOPPED"),
                node_util(W1, 0, clock.now)) == []
    assert detector.recoveries() == []

    [second] = idle_polls(detector, clock, 3)  # RUNNING again (a resubmission under the same key): a new episode
    assert poll(detector, clock, snapshot(W1), node_util(W1, 0, clock.now)) == []  # gone from the placement
    [released] = detector.recoveries()
    assert released.fingerprint == second.fingerprint == first.fingerprint  # one job, one fingerprint: the desk reopens
    assert released.reason == "job job-a released its GPUs (it holds none in Ray's placement now)"

    [third] = idle_polls(detector, clock, 3)
    gone = job("job-a", {W1: 4}, status="STOPPED").model_copy(update={"value": 0.0})
    assert poll(detector, clock, snapshot(W1), gone, node_util(W1, 0, clock.now)) == []
    assert [(r.fingerprint, r.reason) for r in detector.recoveries()] == [
        (third.fingerprint, "job job-a released its GPUs (STOPPED)")]


def test_flapping_at_the_threshold_closes_once_and_opens_again_only_after_a_whole_window():
    clock = Clock(T0)
    detector = IdleGpuDetector(threshold_pct=5, window_s=120, clock=clock)
    [first] = idle_polls(detector, clock, 5)
    recoveries, findings = [], []
    for n in range(12):  # 4.9% and 5% in turns: one busy poll ends the episode, idle ones start a window anew
        findings += idle_polls(detector, clock, 1, value=5.0 if n % 2 else 4.9)
        recoveries += detector.recoveries()
    assert findings == [] and [r.fingerprint for r in recoveries] == [first.fingerprint]
    assert "back to 5% on 10.0.0.1" in recoveries[0].reason


def test_a_busy_neighbour_on_a_shared_node_is_named_as_possibly_not_the_jobs():
    clock = Clock(T0)
    detector = IdleGpuDetector(window_s=60, clock=clock)
    [finding] = [f for _ in range(3) for f in poll(
        detector, clock, snapshot(W1, W2), job("job-b", {W1: 4, W2: 1}),
        node_util(W1, 0, clock.now), node_util(W2, 0, clock.now))]
    w2 = node_util(W2, 0, clock.now)[:3] + [util(W2[1], 3, 70.0, clock.now)]
    poll(detector, clock, snapshot(W1, W2), job("job-b", {W1: 4, W2: 1}), node_util(W1, 0, clock.now), w2)
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == finding.fingerprint
    assert recovery.reason.startswith("GPU utilisation back to 70% on 10.0.0.2 GPU 3")
    assert "may be a neighbour's" in recovery.reason


# -- the real stack ------------------------------------------------------------------------------------

HOLD_WHOLE_WORKER1 = """
import time, ray
ray.init()
@ray.remote(num_cpus=0, num_gpus=4, resources={"worker1": 0.01})
class Holder:
    def ready(self):
        return True
holder = Holder.remote()
ray.get(holder.ready.remote())
print("HOLDING", flush=True)
time.sleep(900)
"""


@pytest.fixture
def whole_worker1_job(ray_cluster, tmp_workdir):
    """A real Ray job whose actor holds all 4 (advertised) GPUs of worker 1; stopped afterwards."""
    script = tmp_workdir / "hold_whole.py"
    with holding_job(ray_cluster.dashboard_url, script, HOLD_WHOLE_WORKER1, owner="carol") as (sid, _stop):
        yield sid


def test_idle_then_busy_gpus_of_a_real_job_through_prometheus(ray_cluster, prometheus_stack,
                                                               whole_worker1_job):
    """Real: the Ray cluster, the job and its actor's GPU reservation (Ray's bookkeeping; no GPUs exist
    here), Prometheus scraping, prometheus-api-client. Simulated: the GPUs' utilisation, served by a
    DcgmExporterSim on worker 1's address."""
    worker1 = ray_cluster.worker(1)
    sim = DcgmExporterSim("gpu-node-1", gpus=4, host=worker1.ip).start()
    prometheus = prometheus_stack.prometheus
    try:
        sim.set_all(util=0)
        prometheus.set_targets("dcgm-idle", [f"{sim.host}:{sim.port}"])
        client = PrometheusClient(prometheus.url, timeout_s=10)
        dcgm = PrometheusGpuCollector(client, queries={
            "DCGM_FI_DEV_GPU_UTIL": 'DCGM_FI_DEV_GPU_UTIL{job="dcgm-idle"}'})
        placement = GpuPlacementCollector(ray_cluster.dashboard_url)

        def all_four_at(value):
            rows = client.query('DCGM_FI_DEV_GPU_UTIL{job="dcgm-idle"}')
            return len(rows) == 4 and all(float(r["value"][1]) == value for r in rows)

        wait_until("4 idle GPUs in Prometheus", lambda: all_four_at(0))
        gpu_signals = dcgm.collect()
        assert {s.subject.id for s in gpu_signals} == {g["uuid"] for g in sim.state()["gpus"]}
        assert all(s.attrs["metric"] == "DCGM_FI_DEV_GPU_UTIL" and s.attrs["hostname"] == "gpu-node-1"
                   and s.attrs["labels"]["instance"] == f"{sim.host}:{sim.port}" for s in gpu_signals)
        # series without a GPU (here the target's `up`) are not GPU samples
        assert PrometheusGpuCollector(client, queries={"up": 'up{job="dcgm-idle"}'}).collect() == []
        detector = IdleGpuDetector(threshold_pct=5, window_s=3)

        def idle_finding():
            return [f for f in detector.detect(placement.collect() + dcgm.collect())
                    if f.subject.id == whole_worker1_job]

        [finding] = wait_until("an idle_gpu finding", idle_finding, timeout=60)
        assert finding.category is Category.IDLE_GPU and finding.attrs["owner"] == "carol"
        assert finding.attrs["gpus"] == 4 and finding.attrs["attribution"] == "exact"
        assert finding.attrs["nodes"][0]["node_ip"] == worker1.ip
        assert finding.attrs["nodes"][0]["node_id"] == worker1.node_id
        assert whole_worker1_job in finding.summary and "carol" in finding.summary

        sim.set_all(util=90)
        wait_until("busy GPUs in Prometheus", lambda: all_four_at(90))
        busy = IdleGpuDetector(threshold_pct=5, window_s=3)
        deadline = time.monotonic() + 8  # more than two windows of polls
        while time.monotonic() < deadline:
            gpus = dcgm.collect()
            assert len(gpus) == 4 and all(s.value == 90 for s in gpus)  # known busy, not merely unknown
            assert busy.detect(placement.collect() + gpus) == []
            time.sleep(0.5)
    finally:
        prometheus.set_targets("dcgm-idle", [])
        sim.stop()
