"""Prometheus scraping the real Ray cluster, alerts flowing through Alertmanager to a webhook."""

from __future__ import annotations

import uuid

import pytest
from prometheus_api_client import PrometheusConnect

from core.errors import ConfigError
from stage.localstack.alertmanager import Alertmanager
from stage.localstack.process import is_alive
from stage.localstack.prometheus import Prometheus

RAY_IPS = {"127.0.0.2", "127.0.0.3", "127.0.0.4"}


@pytest.mark.prometheus
@pytest.mark.ray
def test_ray_node_metrics_are_scraped_per_node(prometheus_stack):
    prom = prometheus_stack.prometheus
    prom.wait_for_series("ray_node_mem_total", timeout=120, min_series=3)
    client = PrometheusConnect(url=prom.url, disable_ssl=True)
    series = client.custom_query("ray_node_mem_total")
    ips = {s["metric"].get("ip") or s["metric"].get("instance", "").split(":")[0] for s in series}
    assert RAY_IPS <= ips
    assert all(float(s["value"][1]) > 0 for s in series)
    up = client.custom_query('up{job="ray"}')
    assert any(s["value"][1] == "1" for s in up)


@pytest.mark.prometheus
@pytest.mark.ray
def test_targets_added_at_run_time_are_scraped(prometheus_stack):
    prom, am = prometheus_stack.prometheus, prometheus_stack.alertmanager
    job = f"extra-{uuid.uuid4().hex[:8]}"
    # Alertmanager's own /metrics is a real exporter to scrape.
    prom.set_targets(job, [f"{am.host}:{am.port}"], labels={"role": "probe"})
    try:
        series = prom.wait_for_series(f'up{{job="{job}"}} == 1', timeout=60)
        assert series[0]["metric"]["role"] == "probe"
    finally:
        prom.set_targets(job, [])


@pytest.mark.prometheus
@pytest.mark.ray
def test_alert_rule_reaches_the_webhook_through_alertmanager(prometheus_stack, tmp_workdir):
    prom, am, receiver = prometheus_stack.prometheus, prometheus_stack.alertmanager, prometheus_stack.receiver
    name = f"ArgusProbe{uuid.uuid4().hex[:8]}"
    rule = tmp_workdir / f"{name}.yml"
    rule.write_text(
        "groups:\n"
        f"  - name: {name}\n"
        "    rules:\n"
        f"      - alert: {name}\n"
        "        expr: vector(1)\n"
        "        for: 0s\n"
        "        labels: {severity: warning}\n"
        "        annotations: {summary: always firing}\n"
    )
    installed = prom.add_rule_file(rule)
    try:
        post = receiver.wait_for(
            lambda item: item["path"] == "/alertmanager"
            and isinstance(item["body"], dict)
            and any(a["labels"].get("alertname") == name for a in item["body"].get("alerts", [])),
            timeout=120,
            what=f"an Alertmanager notification for {name}",
        )
    finally:
        installed.unlink()
        prom.reload()
    body = post["body"]
    for key in ("receiver", "status", "alerts", "groupLabels", "commonLabels", "commonAnnotations",
                "externalURL", "version", "groupKey", "truncatedAlerts"):
        assert key in body, key
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "webhook"
    assert body["externalURL"].rstrip("/") == am.url
    alert = body["alerts"][0]
    for key in ("status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"):
        assert key in alert, key
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["summary"] == "always firing"
    assert alert["generatorURL"].startswith(prom.url)


def test_bad_rule_file_is_a_config_error_before_anything_starts(tmp_workdir):
    bad = tmp_workdir / "bad.yml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: sum(\n")
    prom = Prometheus(tmp_workdir / "prom", rule_files=[bad])
    with pytest.raises(ConfigError, match="bad.yml"):
        prom.start()
    assert prom.process is None
    prom.stop()


@pytest.mark.prometheus
def test_prometheus_and_alertmanager_stop_leaves_no_process(tmp_workdir, webhook_receiver):
    with Alertmanager(tmp_workdir / "am", webhook_url=webhook_receiver.url) as am:
        with Prometheus(tmp_workdir / "prom", alertmanager_url=am.url) as prom:
            pids = prom.process.pids() + am.process.pids()
            assert prom.query("vector(1)")[0]["value"][1] == "1"
    assert pids and [p for p in pids if is_alive(p)] == []
    am.stop()
    prom.stop()
