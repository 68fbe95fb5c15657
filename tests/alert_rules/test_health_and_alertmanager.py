"""Argus's own health rules and the example alertmanager.yml: promtool, amtool and a real Alertmanager.

The inhibition test runs the real Alertmanager with the example's route tree and inhibit rules, its receivers
pointed at a real local HTTP receiver (one path per receiver), and posts alerts to its API the way Prometheus
does.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from argus.cli_rules import HEALTH_FILE_NAME, PROMETHEUS_SERIES, find_amtool, unknown_metrics
from argus.exporter import ArgusMetrics, exported_series_names
from core.types import Severity
from detectors.metric_rules import load_metric_rules
from detectors.promql import rule_file_metric_names
from stage.localstack.alertmanager import Alertmanager
from stage.localstack.webhook_receiver import WebhookReceiver
from tests.alert_rules.test_export import ALERT_RULES, COMMITTED, UNIT_TESTS, cli, promtool

HEALTH = ALERT_RULES / HEALTH_FILE_NAME
EXAMPLE = ALERT_RULES / "alertmanager.yml"
HEALTH_TESTS = [p for p in UNIT_TESTS if yaml.safe_load(p.read_text())["rule_files"] == [f"../{HEALTH_FILE_NAME}"]]
HEALTH_ALERTS = ("ArgusDown", "ArgusLoopStalled", "ArgusCollectorFailing", "ArgusNotificationsFailing",
                 "ArgusRemediationFailing")


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_amtool(), *args], capture_output=True, text=True, timeout=60)


def health_rules() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(HEALTH.read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"]}


# -- the health rules --------------------------------------------------------------------------------------


def test_health_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = promtool("check", "rules", str(HEALTH))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert HEALTH_TESTS, "alert_rules/tests/ has no unit tests for argus-health.rules.yml"
    tested = promtool("test", "rules", *map(str, HEALTH_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every health alert is made to fire in some test
    text = "\n".join(p.read_text() for p in HEALTH_TESTS)
    for alert in HEALTH_ALERTS:
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts:\n\s+- exp_labels:", text), alert


def test_health_rules_share_the_exported_label_vocabulary() -> None:
    rules = health_rules()
    assert set(rules) == set(HEALTH_ALERTS)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {s.value for s in Severity}, name
        assert rule["labels"]["component"] == "argus", name
        assert "category" not in rule["labels"], name  # categories are cluster faults, not Argus's own state
        assert {"summary", "action", "description"} <= set(rule["annotations"]), name


def test_health_rules_read_only_metrics_argus_exports() -> None:
    known = exported_series_names(ArgusMetrics().registry) | PROMETHEUS_SERIES
    read = rule_file_metric_names(HEALTH)
    assert set(read) == set(HEALTH_ALERTS)
    for alert, names in read.items():
        assert names and names <= known, (alert, names - known)
    assert unknown_metrics(HEALTH) == {}
    assert read["ArgusLoopStalled"] == {"argus_loop_last_tick_timestamp_seconds"}
    assert read["ArgusDown"] == {"up"}


def test_a_misspelt_metric_in_a_health_rule_is_caught(tmp_path: Path) -> None:
    """promtool accepts a rule on a metric nobody exports (it would just never fire); the name check does not."""
    out = tmp_path / "alert_rules"
    shutil.copytree(ALERT_RULES, out)
    health = out / HEALTH_FILE_NAME
    health.write_text(HEALTH.read_text().replace("argus_loop_last_tick_timestamp_seconds",
                                                 "argus_loop_last_tick_timestamp"))
    assert promtool("check", "rules", str(health)).returncode == 0
    assert unknown_metrics(health) == {"ArgusLoopStalled": {"argus_loop_last_tick_timestamp"}}
    result = CliRunner().invoke(cli(), ["rules", "check", "--out", str(out)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "ArgusLoopStalled reads argus_loop_last_tick_timestamp" in said and "does not export" in said


def test_the_health_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    out = tmp_path / "alert_rules"
    shutil.copytree(ALERT_RULES, out)
    health = out / HEALTH_FILE_NAME
    health.write_text(HEALTH.read_text().replace('outcome="failed"}[1h]', 'outcome="skipped"}[1h]'))
    result = promtool("test", "rules", *(str(out / "tests" / p.name) for p in HEALTH_TESTS))
    assert result.returncode != 0 and "ArgusRemediationFailing" in result.stdout + result.stderr


# -- alertmanager.yml ----------------------------------------------------------------------------------


def test_the_example_passes_amtool_and_a_broken_one_does_not(tmp_path: Path) -> None:
    checked = amtool("check-config", str(EXAMPLE))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(EXAMPLE.read_text().replace("receiver: im\n", "receiver: no-such-receiver\n", 1))
    result = amtool("check-config", str(broken))
    assert result.returncode != 0 and "no-such-receiver" in result.stdout + result.stderr
    out = tmp_path / "alert_rules"
    shutil.copytree(ALERT_RULES, out)
    shutil.copy(broken, out / "alertmanager.yml")
    refused = CliRunner().invoke(cli(), ["rules", "check", "--out", str(out)])
    assert refused.exit_code == 2 and "amtool check-config" in refused.output and "failed" in refused.output


@pytest.mark.parametrize(("labels", "receivers"), [
    ({"alertname": "GpuXidDrainAndReset", "severity": "critical", "category": "gpu_hardware"}, "argus,im"),
    ({"alertname": "GpuMemoryNearlyFull", "severity": "warning", "category": "gpu_oom"}, "argus"),
    ({"alertname": "ArgusLoopStalled", "severity": "critical", "component": "argus"}, "im"),
    ({"alertname": "ArgusCollectorFailing", "severity": "warning", "component": "argus"}, "im"),
])
def test_routes(labels: dict[str, str], receivers: str) -> None:
    result = amtool("config", "routes", "test", f"--config.file={EXAMPLE}",
                    *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == receivers


def test_the_inhibition_matches_labels_the_rules_really_have() -> None:
    """The source side is the exported node-lost rules' category; the equal labels are the ones the scrape
    config in README.md adds (node_ip) and Prometheus's external label (cluster)."""
    config = yaml.safe_load(EXAMPLE.read_text())
    [rule] = config["inhibit_rules"]
    assert 'category="node_lost"' in rule["source_matchers"]
    assert {r.reason for r in load_metric_rules() if r.category.value == "node_lost"} >= {
        "DcgmExporterDown", "RayMetricsTargetDown"}
    exported = yaml.safe_load(COMMITTED.read_text())
    assert any(r["labels"].get("category") == "node_lost" for g in exported["groups"] for r in g["rules"])
    assert rule["equal"] == ["cluster", "node_ip"]
    readme = (ALERT_RULES / "README.md").read_text()
    assert readme.count("target_label: node_ip") == 2 and "job_name: argus" in readme
    assert set(config["route"]["group_by"]) >= {"cluster", "node_ip", "submission_id"}


def test_the_readme_scrape_config_passes_promtool(tmp_path: Path) -> None:
    [block] = re.findall(r"```yaml\n(# prometheus\.yml.*?)```", (ALERT_RULES / "README.md").read_text(), re.S)
    (tmp_path / "rules").mkdir()
    for name in (COMMITTED.name, HEALTH_FILE_NAME):
        shutil.copy(ALERT_RULES / name, tmp_path / "rules" / name)
    (tmp_path / "prometheus.yml").write_text(block)
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 2 rule files found" in checked.stdout


class ExampleAlertmanager(Alertmanager):
    """The real Alertmanager with the example's route tree and inhibit rules, each receiver replaced by a
    webhook to `<receiver_url>/<receiver name>` and the waits cut to a second."""

    def __init__(self, work_dir: Path, receiver_url: str) -> None:
        super().__init__(work_dir, webhook_url=receiver_url)
        self.example = yaml.safe_load(EXAMPLE.read_text())

    def config(self) -> dict[str, Any]:
        config = copy.deepcopy(self.example)
        config["global"] = {"resolve_timeout": config["global"]["resolve_timeout"]}
        routes = [config["route"], *config["route"].get("routes", [])]
        for route in routes:
            for key in ("group_wait", "group_interval"):
                if key in route:
                    route[key] = "1s"
        config["receivers"] = [
            {"name": r["name"], "webhook_configs": [{"url": f"{self.webhook_url}/{r['name']}", "send_resolved": True}]}
            for r in self.example["receivers"]]
        return config


def post_alerts(alertmanager: Alertmanager, *alerts: dict[str, Any]) -> None:
    response = httpx.post(f"{alertmanager.url}/api/v2/alerts", json=list(alerts), timeout=10)
    assert response.status_code == 200, response.text


def alert(labels: dict[str, str], *, ends: datetime | None = None) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    body: dict[str, Any] = {"labels": labels, "annotations": {"summary": labels["alertname"]},
                            "startsAt": (now - timedelta(minutes=1)).isoformat()}
    if ends is not None:
        body["endsAt"] = ends.isoformat()
    return body


def delivered(receiver: WebhookReceiver, path: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts posted to `path` whose labels include `labels`."""
    return [a for post in receiver.received if post["path"] == path and isinstance(post["body"], dict)
            for a in post["body"].get("alerts", []) if labels.items() <= a["labels"].items()]


@pytest.mark.prometheus
def test_a_lost_node_silences_the_job_alerts_on_that_node_only(tmp_path: Path) -> None:
    lost = {"alertname": "RayMetricsTargetDown", "severity": "warning", "category": "node_lost", "cluster": "c1",
            "node_ip": "10.0.0.1", "job": "ray", "instance": "10.0.0.1:8080"}
    job_on_lost = {"alertname": "TrainingJobStalled", "severity": "critical", "category": "nccl_hang",
                   "cluster": "c1", "node_ip": "10.0.0.1", "submission_id": "raysubmit_on_lost"}
    job_elsewhere = {**job_on_lost, "node_ip": "10.0.0.2", "submission_id": "raysubmit_elsewhere"}
    health = {"alertname": "ArgusLoopStalled", "severity": "critical", "component": "argus", "job": "argus",
              "instance": "ray-head:8600"}
    with WebhookReceiver() as receiver, ExampleAlertmanager(tmp_path / "am", receiver.url) as alertmanager:
        post_alerts(alertmanager, alert(lost))
        receiver.wait_for(lambda p: p["path"] == "/argus", what="the node-lost alert at Argus's webhook")

        post_alerts(alertmanager, alert(job_on_lost), alert(job_elsewhere), alert(health))
        for path in ("/argus", "/im"):  # critical: to Argus and straight to IM
            receiver.wait_for(lambda p, path=path: p["path"] == path and any(
                a["labels"].get("submission_id") == "raysubmit_elsewhere" for a in p["body"]["alerts"]),
                what=f"the job alert on the other node at {path}")
        receiver.wait_for(lambda p: p["path"] == "/im" and any(
            a["labels"].get("component") == "argus" for a in p["body"]["alerts"]), what="Argus's own alert at IM")

        held = {a["labels"]["submission_id"]: a for a in httpx.get(
            f"{alertmanager.url}/api/v2/alerts", params={"filter": 'alertname="TrainingJobStalled"'}, timeout=10
        ).json()}
        assert held["raysubmit_on_lost"]["status"]["state"] == "suppressed"
        assert held["raysubmit_on_lost"]["status"]["inhibitedBy"], held["raysubmit_on_lost"]["status"]
        assert held["raysubmit_elsewhere"]["status"]["state"] == "active"
        assert delivered(receiver, "/argus", submission_id="raysubmit_on_lost") == []
        assert delivered(receiver, "/im", submission_id="raysubmit_on_lost") == []
        assert delivered(receiver, "/im", alertname="RayMetricsTargetDown") == []  # a warning: Argus only

        # The node is back: the job alert it held back goes out, which shows the inhibition held it.
        post_alerts(alertmanager, alert(lost, ends=datetime.now(timezone.utc) - timedelta(seconds=1)))
        for path in ("/argus", "/im"):
            receiver.wait_for(lambda p, path=path: p["path"] == path and any(
                a["labels"].get("submission_id") == "raysubmit_on_lost" for a in p["body"]["alerts"]),
                what=f"the job alert on the recovered node at {path}")
        assert delivered(receiver, "/argus", component="argus") == []  # Argus is never told about itself
