"""Metrics through Argus: the PromQL Argus writes from a described query (escaped, bounded), the API's refusals of
what it does not describe, and real answers from the session's Prometheus (its Ray nodes and a simulated DCGM
exporter), for a series and around an incident."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.metric_queries import MAX_POINTS, MAX_SERIES, Matcher, MetricQueries, MetricQuery, step_for
from argus.store.store import Store
from argus.store.tokens import Role
from core.errors import InputError, SourceUnavailable
from core.types import Category, Finding, Severity, Subject, SubjectKind

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)


def test_the_promql_is_written_from_the_description_with_values_escaped() -> None:
    hostile = 'x"} or vector(1) or up{a="\\'
    query = MetricQuery(metric="DCGM_FI_DEV_GPU_UTIL", matchers=(Matcher("Hostname", "=", hostile),
                                                                Matcher("gpu", "!=", "0")),
                        function="avg_over_time", window_s=120, aggregation="max", by=("Hostname",))
    assert query.promql() == ('max by (Hostname) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{Hostname="x\\"} or vector(1) '
                              'or up{a=\\"\\\\",gpu!="0"}[120s]))')
    assert MetricQuery(metric="up").promql() == "up"
    assert MetricQuery(metric="up", aggregation="count").promql() == "count (up)"


def test_the_step_keeps_a_series_under_its_point_cap() -> None:
    day = T0 + timedelta(hours=24)
    assert (day - T0).total_seconds() / step_for(T0, day, None) < MAX_POINTS
    assert step_for(T0, day, 1) == step_for(T0, day, None)  # a finer step than allowed is raised
    assert step_for(T0, T0 + timedelta(minutes=5), None) == 1.0
    assert step_for(T0, T0 + timedelta(minutes=5), 30) == 30


class RecordingPrometheus:
    """The client's two calls, answering what the test sets (the real Prometheus answers below)."""

    url = "http://prometheus.invalid:9090"

    def __init__(self, series: list[dict[str, Any]] | None = None, refuse: str | None = None) -> None:
        self.series = series or []
        self.refuse = refuse
        self.asked: list[tuple[str, datetime, datetime, float]] = []

    def query_range(self, promql: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
        self.asked.append((promql, start, end, step_s))
        if self.refuse:
            raise InputError(self.refuse)
        return self.series


def test_series_are_capped_and_a_refusal_is_prometheus_failing_not_the_caller() -> None:
    many = [{"metric": {"i": str(n)}, "values": [[1.0, "1"], [2.0, "NaN"]]} for n in range(MAX_SERIES + 5)]
    queries = MetricQueries(RecordingPrometheus(many), lambda incident: [], clock=lambda: T0)  # type: ignore[arg-type]
    answer = queries.range(MetricQuery(metric="up"))
    assert answer["series_total"] == MAX_SERIES + 5 and answer["truncated"] is True
    assert len(answer["series"]) == MAX_SERIES and answer["series"][0]["values"] == [[1.0, 1.0], [2.0, None]]
    assert answer["start"] == (T0 - timedelta(minutes=15)).isoformat() and answer["promql"] == "up"
    refusing = MetricQueries(RecordingPrometheus(refuse="query timed out"), lambda incident: [])  # type: ignore[arg-type]
    with pytest.raises(SourceUnavailable, match="query timed out"):
        refusing.range(MetricQuery(metric="up"))
    with pytest.raises(InputError, match="not before end"):
        queries.range(MetricQuery(metric="up"), start=T0, end=T0)
    with pytest.raises(InputError, match="more than"):
        queries.range(MetricQuery(metric="up"), start=T0, end=T0 + timedelta(hours=25))


@pytest.fixture
def api(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    prometheus = RecordingPrometheus([{"metric": {"instance": "10.0.0.7:9400"}, "values": [[1.0, "42"]]}])
    app = create_app(store=store, metric_queries=MetricQueries(prometheus, lambda incident: [],  # type: ignore[arg-type]
                                                               clock=lambda: T0))
    token = store.create_token("v", Role.VIEWER, created_by="tests")[1]
    yield TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False), prometheus
    store.close()


def test_the_api_builds_the_query_and_refuses_what_it_does_not_describe(api) -> None:
    client, prometheus = api
    answer = client.get("/v1/metrics/query_range", params={
        "metric": "DCGM_FI_DEV_GPU_UTIL", "match": ["Hostname=gpu-3", "gpu!=1"], "fn": "max_over_time",
        "agg": "avg", "by": ["Hostname"], "minutes": 60, "end": "2026-11-29T09:00:00Z"})
    assert answer.status_code == 200, answer.text
    promql, start, end, step = prometheus.asked[-1]
    assert promql == 'avg by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-3",gpu!="1"}[300s]))'
    assert (start, end) == (T0, T0 + timedelta(hours=1)) and step == 4.0
    assert answer.json()["series"] == [{"metric": {"instance": "10.0.0.7:9400"}, "values": [[1.0, 42.0]]}]
    for bad in ({"metric": 'up{job="x"}'}, {"metric": "up", "match": "1a=b"}, {"metric": "up", "match": "a=b\n"},
                {"metric": "up", "minutes": 1441}, {"metric": "up", "fn": "holt_winters"},
                {"metric": "up", "end": "1700000000"}, {"metric": "up", "match": ["a=b"] * 11}):
        refused = client.get("/v1/metrics/query_range", params=bad)
        assert refused.status_code == 422, (bad, refused.text)
    assert len(prometheus.asked) == 1  # nothing refused reached Prometheus
    regex_like = client.get("/v1/metrics/query_range", params={"metric": "up", "match": "a=~.+"})
    assert regex_like.json()["promql"] == 'up{a="~.+"}'  # exact matchers only: "~.+" is the value


def test_without_a_prometheus_the_metric_routes_say_so(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        token = store.create_token("v", Role.VIEWER, created_by="tests")[1]
        client = TestClient(create_app(store=store), headers={"Authorization": f"Bearer {token}"})
        answer = client.get("/v1/metrics/query_range", params={"metric": "up"})
        assert answer.status_code == 503 and "prometheus_url" in answer.json()["hint"]
    finally:
        store.close()


@pytest.mark.prometheus
def test_real_series_and_the_readings_around_an_incident(prometheus_stack, ray_cluster, tmp_path: Path) -> None:
    from collectors.prometheus import PrometheusClient
    from rca.metrics import PrometheusMetricsReader
    from stage.sim.dcgm_exporter import DcgmExporterSim
    from tests.helpers import wait_until

    # the last worker and a job of its own: tests/rca/test_metrics_real.py reads the first worker's DCGM series
    worker = ray_cluster.workers[-1]
    exporter = DcgmExporterSim("gpu-node-9", gpus=2, host=worker.ip).start()
    prometheus_stack.prometheus.set_targets("dcgm-api", [f"{exporter.host}:{exporter.port}"])
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        exporter.set_gpu(0, util=91)
        client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=5)
        reader = PrometheusMetricsReader(client, before_s=120, after_s=5, step_s=1)
        token = store.create_token("v", Role.VIEWER, created_by="tests")[1]
        api = TestClient(create_app(store=store, metric_queries=MetricQueries(client, reader)),
                         headers={"Authorization": f"Bearer {token}"})
        # this exporter's GPU 0 only: other tests' simulated exporters may have left series in the session's Prometheus
        params = {"metric": "DCGM_FI_DEV_GPU_UTIL", "match": ["gpu=0", "Hostname=gpu-node-9"], "agg": "max",
                  "by": "Hostname", "minutes": 5}

        def utilisation() -> list[Any] | None:
            found = api.get("/v1/metrics/query_range", params=params).json()["series"]
            return found if found and found[0]["values"] and found[0]["values"][-1][1] == 91.0 else None

        series = wait_until("the simulated GPU's utilisation through Argus", utilisation, timeout=60, interval=1)
        assert series[0]["metric"] == {"Hostname": "gpu-node-9"}
        ups = api.get("/v1/metrics/query_range", params={"metric": "up", "agg": "count", "minutes": 1}).json()
        assert ups["promql"] == "count (up)" and ups["series"][0]["values"][-1][1] >= 2  # Ray's nodes and the exporter

        incident, _ = store.record_finding(Finding(
            category=Category.GPU_HARDWARE, reason="XidCritical", severity=Severity.CRITICAL,
            subject=Subject(kind=SubjectKind.NODE, id="n9", name=worker.ip), summary="Xid 79 on gpu-node-9",
            attrs={"node_ip": worker.ip}))
        around = api.get(f"/v1/incidents/{incident.id}/metrics").json()
        assert "gpu_util_mean" in {s["name"] for s in around["summaries"]}
        assert {s["labels"]["node_ip"] for s in around["summaries"]} == {worker.ip}
        assert api.get("/v1/incidents/inc-000000000000/metrics").status_code == 404
    finally:
        prometheus_stack.prometheus.set_targets("dcgm-api", [])
        exporter.stop()
        store.close()


@pytest.mark.prometheus
def test_a_step_with_a_fraction_of_a_second_is_answered(prometheus_stack) -> None:
    """Prometheus takes a step in seconds ("2.5") and refuses the same as a duration ("2.5s")."""
    from collectors.prometheus import PrometheusClient
    from core.types import utcnow

    client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=5)
    end = utcnow()
    assert isinstance(client.query_range("up", end - timedelta(minutes=1), end, 2.5), list)
