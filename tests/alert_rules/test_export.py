"""`argus rules export` / `argus rules check` and the committed alert_rules/ files.

promtool, Prometheus and Alertmanager are real processes; in the end-to-end test the GPU data comes from
the dcgm-exporter SIMULATOR (an Xid 79 set in process), scraped and evaluated by the real Prometheus.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from argus.cli_rules import register
from detectors.metric_rules import MetricRuleSet, load_metric_rules
from detectors.metric_rules_export import EXPORT_FILE_NAME, export_prometheus_rules, write_export
from detectors.promql import find_promtool
from stage.sim.dcgm_exporter import DcgmExporterSim

ROOT = Path(__file__).resolve().parents[2]
ALERT_RULES = ROOT / "alert_rules"
COMMITTED = ALERT_RULES / EXPORT_FILE_NAME
UNIT_TESTS = sorted((ALERT_RULES / "tests").glob("*.yml"))
# The unit tests of the exported rules (the others test the hand-written argus-health.rules.yml).
DETECTION_TESTS = [p for p in UNIT_TESTS if yaml.safe_load(p.read_text())["rule_files"] == [f"../{EXPORT_FILE_NAME}"]]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """argus"""

    register(app)
    return app


def test_export_is_deterministic_and_the_committed_file_is_fresh() -> None:
    first = export_prometheus_rules(load_metric_rules())
    assert first == export_prometheus_rules(load_metric_rules())
    assert COMMITTED.read_text(encoding="utf-8") == first, (
        "alert_rules/argus-detections.rules.yml is stale: run `argus rules export` and commit it"
    )


def test_export_carries_every_rule_field() -> None:
    exported = yaml.safe_load(COMMITTED.read_text(encoding="utf-8"))
    alerts = {r["alert"]: r for g in exported["groups"] for r in g["rules"]}
    rules = load_metric_rules()
    assert set(alerts) == {r.reason for r in rules}
    for rule in rules:
        alert = alerts[rule.reason]
        assert alert["expr"] == rule.expr and alert.get("for", "0s") == rule.for_text
        assert alert["labels"] == {"severity": rule.severity.value, "category": rule.category.value, **rule.labels}
        assert alert["annotations"]["summary"] == rule.summary and alert["annotations"]["action"] == rule.action
    assert {g["name"] for g in exported["groups"]} == {r.group for r in rules}


def test_promtool_checks_and_unit_tests_pass() -> None:
    checked = promtool("check", "rules", str(COMMITTED))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert UNIT_TESTS, "alert_rules/tests/*.yml are missing"
    tested = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_unit_tests_catch_a_rule_that_lost_xid_79(tmp_path: Path) -> None:
    """The promtool unit tests fail when the drain rule no longer covers Xid 79."""
    rules = load_metric_rules()
    broken = [
        replace(r, expr=r.expr.replace("DCGM_FI_DEV_XID_ERRORS == 79", "DCGM_FI_DEV_XID_ERRORS == 78"))
        if r.reason == "GpuXidDrainAndReset" else r
        for r in rules
    ]
    write_export(MetricRuleSet(broken), tmp_path)
    shutil.copytree(ALERT_RULES / "tests", tmp_path / "tests")
    result = promtool("test", "rules", *(str(tmp_path / "tests" / p.name) for p in DETECTION_TESTS))
    assert result.returncode != 0 and "GpuXidDrainAndReset" in result.stdout + result.stderr


def test_cli_export_then_check(tmp_path: Path) -> None:
    runner = CliRunner()
    exported = runner.invoke(cli(), ["rules", "export", "--out", str(tmp_path)])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / EXPORT_FILE_NAME).read_text() == COMMITTED.read_text()
    shutil.copytree(ALERT_RULES / "tests", tmp_path / "tests")
    for name in ("argus-health.rules.yml", "alertmanager.yml"):
        shutil.copy(ALERT_RULES / name, tmp_path / name)
    checked = runner.invoke(cli(), ["rules", "check", "--out", str(tmp_path)])
    assert checked.exit_code == 0, checked.output
    said = " ".join(checked.output.split())  # rich wraps long paths
    assert f"promtool test rules ({len(UNIT_TESTS)} files): ok" in said
    assert "argus-health.rules.yml reads only metrics Argus exports" in said
    assert "alertmanager.yml: ok" in said

    (tmp_path / EXPORT_FILE_NAME).write_text(COMMITTED.read_text().replace("for: 2m", "for: 3m"))
    stale = runner.invoke(cli(), ["rules", "check", "--out", str(tmp_path)])
    assert stale.exit_code == 2 and "is stale" in stale.output and "argus rules export" in stale.output


def test_cli_check_names_a_bad_rule_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "rules:\n  - reason: Bad\n    category: gpu_hardware\n    severity: warning\n"
        "    expr: rate(up) > 0\n    summary: s\n"
    )
    result = CliRunner().invoke(cli(), ["rules", "check", "--rules-dir", str(tmp_path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'bad.yaml'}:2 (rule Bad)" in " ".join(result.output.split())


def test_exported_alert_reaches_alertmanager_with_the_summary_argus_writes(prometheus_stack) -> None:
    """The committed rule file, loaded into the real Prometheus, fires on a simulated Xid 79 and the
    alert reaches the webhook behind the real Alertmanager with the same summary Argus renders."""
    prometheus = prometheus_stack.prometheus
    sim = DcgmExporterSim(f"ex-{uuid.uuid4().hex[:8]}", gpus=2).start()
    job = f"dcgm-{sim.hostname}"
    loaded = None
    try:
        sim.set_gpu(0, xid=79)
        prometheus.set_targets(job, [f"{sim.host}:{sim.port}"])
        loaded = prometheus.add_rule_file(COMMITTED)
        gpu_uuid = sim.node.gpus[0].uuid

        def ours(post) -> bool:
            body = post["body"]
            return post["path"] == "/alertmanager" and isinstance(body, dict) and any(
                a["labels"].get("alertname") == "GpuXidDrainAndReset" and a["labels"].get("UUID") == gpu_uuid
                for a in body.get("alerts", [])
            )

        post = prometheus_stack.receiver.wait_for(ours, timeout=90, what="GpuXidDrainAndReset for the Xid 79 GPU")
        alert = next(a for a in post["body"]["alerts"] if a["labels"].get("UUID") == gpu_uuid)
        assert alert["status"] == "firing"
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["category"] == "gpu_hardware"
        rule = load_metric_rules().get("GpuXidDrainAndReset")
        assert alert["annotations"]["summary"] == rule.render_summary(alert["labels"], 79.0)
        assert alert["annotations"]["summary"] == f"GPU 0 ({gpu_uuid}) on {sim.hostname} reported Xid 79"
        assert "Drain the node" in alert["annotations"]["action"]
    finally:
        prometheus.set_targets(job, [])
        sim.stop()
        if loaded is not None:
            loaded.unlink(missing_ok=True)
            prometheus.reload()


def test_the_detection_unit_tests_are_found() -> None:
    assert len(DETECTION_TESTS) >= 2, "alert_rules/tests/*.yml no longer test argus-detections.rules.yml"


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_unit_tests_point_at_a_shipped_rule_file(path: Path) -> None:
    [rule_file] = yaml.safe_load(path.read_text())["rule_files"]
    assert rule_file in (f"../{EXPORT_FILE_NAME}", "../argus-health.rules.yml")
