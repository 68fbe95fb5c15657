"""Argus's own /metrics: served by a real uvicorn server on a loopback port, read over HTTP with httpx and
parsed with prometheus_client's parser, as Prometheus would scrape it.

Real: the HTTP server, the SQLite incident store, a pipeline tick against a dcgm-exporter SIMULATOR
(real HTTP) and an unreachable Ray address. Job placements and findings are built as values.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from argus.exporter import ArgusMetrics, metrics_router
from argus.pipeline import Pipeline
from argus.sim.dcgm_exporter import DcgmExporterSim
from argus.store.store import Store
from collectors.dcgm import DcgmScrapeCollector
from collectors.placement import GpuPlacementCollector, JobPlacement, NodeGpus
from core.types import Category, Finding, Subject, SubjectKind
from detectors.idle_gpu import IdleGpuDetector

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def served() -> Iterator[tuple[ArgusMetrics, str]]:
    """ArgusMetrics behind a real HTTP server: the router mounted in a FastAPI app under uvicorn."""
    metrics = ArgusMetrics()
    app = FastAPI()
    app.include_router(metrics_router(metrics))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; uvicorn serves on this very socket
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.05)
    try:
        yield metrics, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def scrape(base: str) -> dict[str, list]:
    response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def placement(sid: str | None, job_id: str, owner: str | None, *nodes: tuple[str, str, float]):
    return JobPlacement(job_id, sid, "RUNNING", owner, "python train.py --lr 3e-4",
                        tuple(NodeGpus(nid, ip, ip, gpus, 8) for nid, ip, gpus in nodes))


def finding(category: Category, latency_s: float, subject_id: str = "job-x") -> Finding:
    return Finding(category=category, reason="Test", subject=Subject(kind=SubjectKind.JOB, id=subject_id),
                   summary="a finding", first_seen=T0, detected_at=T0 + timedelta(seconds=latency_s))


def test_job_gpus_are_served_and_replaced_as_a_whole(served):
    metrics, base = served
    metrics.set_job_gpus([
        placement("raysubmit_a", "02000000", "alice", ("n1", "10.0.0.1", 8), ("n2", "10.0.0.2", 2)),
        placement(None, "03000000", None, ("n2", "10.0.0.2", 0.5)),
    ])
    rows = {(s.labels["job_id"], s.labels["node_ip"]): s for s in scrape(base)["argus_job_gpus"]}
    assert {k: s.value for k, s in rows.items()} == {
        ("02000000", "10.0.0.1"): 8, ("02000000", "10.0.0.2"): 2, ("03000000", "10.0.0.2"): 0.5}
    assert rows[("02000000", "10.0.0.1")].labels == {
        "submission_id": "raysubmit_a", "job_id": "02000000", "node_ip": "10.0.0.1", "node_id": "n1",
        "owner": "alice"}
    # a driver started without the Jobs API has no submission id
    assert rows[("03000000", "10.0.0.2")].labels["submission_id"] == ""

    metrics.set_job_gpus([placement("raysubmit_b", "04000000", "bob", ("n1", "10.0.0.1", 4))])
    rows = scrape(base)["argus_job_gpus"]
    assert [(s.labels["submission_id"], s.value) for s in rows] == [("raysubmit_b", 4)]


def test_entrypoint_label_is_opt_in_and_truncated():
    metrics = ArgusMetrics(include_entrypoint=True, entrypoint_max_chars=12)
    metrics.set_job_gpus([placement("s", "02000000", "alice", ("n1", "10.0.0.1", 1))])
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    [sample] = families["argus_job_gpus"].samples
    assert sample.labels["entrypoint"] == "python train"


def test_findings_latency_incidents_and_collectors(served, tmp_path):
    metrics, base = served
    before = scrape(base)
    assert {s.labels["category"] for s in before["argus_findings"] if s.name == "argus_findings_total"} == {
        c.value for c in Category}
    assert all(s.value == 0 for s in before["argus_incidents_open"])
    assert "argus_collector_up" not in before or before["argus_collector_up"] == []

    metrics.finding_recorded(finding(Category.IDLE_GPU, 630))
    metrics.finding_recorded(finding(Category.NODE_LOST, 2))

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        store.record_finding(finding(Category.IDLE_GPU, 600, "job-1"))
        store.record_finding(finding(Category.IDLE_GPU, 600, "job-2"))
        store.record_finding(finding(Category.NODE_LOST, 1, "node-1"))
        metrics.refresh_incidents(store)
    finally:
        store.close()

    with DcgmExporterSim("gpu-node-1", gpus=2) as sim:
        pipeline = Pipeline(
            collectors=[DcgmScrapeCollector([sim.metrics_url]),
                        GpuPlacementCollector("http://127.0.0.1:9", timeout_s=1)],
            detectors=[IdleGpuDetector()],
            store=None,  # no findings without placement, so nothing is recorded
        )
        metrics.observe_tick(pipeline.run_once(), pipeline.sources)

    after = scrape(base)
    totals = {s.labels["category"]: s.value for s in after["argus_findings"]
              if s.name == "argus_findings_total"}
    assert totals["idle_gpu"] == 1 and totals["node_lost"] == 1 and totals["gpu_oom"] == 0
    open_ = {s.labels["category"]: s.value for s in after["argus_incidents_open"]}
    assert open_["idle_gpu"] == 2 and open_["node_lost"] == 1 and open_["host_oom"] == 0
    up = {s.labels["collector"]: s.value for s in after["argus_collector_up"]}
    assert up == {"dcgm": 1, "gpu_placement": 0}

    hist = after["argus_detection_latency_seconds"]
    count = {s.labels["category"]: s.value for s in hist if s.name.endswith("_count")}
    assert count == {"idle_gpu": 1, "node_lost": 1}
    buckets = {(s.labels["category"], s.labels["le"]): s.value for s in hist if s.name.endswith("_bucket")}
    assert buckets[("idle_gpu", "600.0")] == 0 and buckets[("idle_gpu", "660.0")] == 1
    assert buckets[("node_lost", "2.5")] == 1
