"""Metric rules: loading and validation, templates, the `for` logic, and evaluation on the real stack.

Unit tests build METRIC signals the way MetricRuleCollector emits them and drive the detector with a fake
clock. The real-stack tests use the session's real Prometheus (scraping the real local Ray cluster) and
the dcgm-exporter SIMULATOR: GPU values and Xids are simulated, the exposition format, scrapes, PromQL
evaluation and prometheus-api-client queries are real.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from collectors.dcgm_fields import DEFAULT_COUNTERS
from collectors.metric_rules import MetricRuleCollector, subject_of
from collectors.prometheus import PrometheusClient
from core.errors import InputError, RuleError, SourceUnavailable
from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.alert_templates import go_float, render_template
from detectors.metric_rules import (
    EVALUATED_ATTR,
    RULE_ATTR,
    MetricRuleDetector,
    MetricRuleSet,
    load_metric_rules,
    parse_duration,
)
from detectors.metric_rules_export import promtool_check
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until

GOOD = """\
group: test-group
rules:
  - reason: HotGpu
    category: gpu_hardware
    severity: warning
    for: 2m
    expr: DCGM_FI_DEV_GPU_TEMP > 90
    summary: 'GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }} C'
    action: check cooling
    labels: {team: ops}
  - reason: XidNow
    category: gpu_hardware
    severity: critical
    xid: true
    expr: DCGM_FI_DEV_XID_ERRORS == 79
    summary: 'GPU {{ $labels.UUID }} reported Xid {{ $value }}'
    action: drain the node
"""


def rule_text(reason: str, expr: str) -> str:
    """One more rule, indented to follow GOOD's list."""
    return (f"  - reason: {reason}\n    category: gpu_hardware\n    severity: warning\n"
            f"    expr: {expr}\n    summary: s\n")


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(RuleError) as info:
        MetricRuleSet.load([path])
    return str(info.value)


# --- loading --------------------------------------------------------------------------------------


def test_good_file_loads_with_locations_and_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    hot, xid = MetricRuleSet.load([path])
    assert (hot.reason, hot.category, hot.severity, hot.group) == ("HotGpu", Category.GPU_HARDWARE,
                                                                  Severity.WARNING, "test-group")
    assert (hot.for_text, hot.for_s, hot.labels, hot.xid) == ("2m", 120.0, {"team": "ops"}, False)
    assert (hot.file, hot.line) == (path, 3)
    assert (xid.for_s, xid.xid, xid.line) == (0.0, True, 11)


def test_shipped_rules_load_and_cover_the_fault_classes() -> None:
    rules = load_metric_rules()
    by_reason = {r.reason: r for r in rules}
    assert by_reason["GpuXidDrainAndReset"].category is Category.GPU_HARDWARE
    assert by_reason["GpuXidDrainAndReset"].severity is Severity.CRITICAL
    assert by_reason["GpuXidApplicationError"].category is Category.USER_ERROR
    assert by_reason["GpuMemoryNearlyFull"].category is Category.GPU_OOM
    assert (by_reason["GpuMemoryNearlyFull"].for_s, by_reason["DcgmExporterDown"].for_s) == (120.0, 60.0)
    assert by_reason["DcgmExporterDown"].category is Category.NODE_LOST
    assert by_reason["RayNodeDiskNearlyFull"].category is Category.DISK_FULL
    assert all(r.action and r.summary and r.description for r in rules)


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("rules:\n  - reason: A\n    expr: 'up\n", 4, "not valid YAML"),  # where the parser gives up
        ("", 1, "empty"),
        ("- just a list\n", 1, "must be a mapping"),
        ("source: job-logs\nrules: []\n", 1, "log rules (source, pattern) belong in detectors/rules/"),
        ("rules: []\n", 1, "`rules` is empty"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    summary: s\n", 2,
         "missing required field 'expr'"),
        ("rules:\n  - reason: A\n    category: gpu_melted\n    severity: warning\n    expr: up\n    summary: s\n",
         3, "unknown category 'gpu_melted'"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: loud\n    expr: up\n    summary: s\n",
         4, "unknown severity 'loud'"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    for: 2 minutes\n    summary: s\n", 6, "not a Prometheus duration"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    for: 120\n    summary: s\n", 6, "not a Prometheus duration"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n"
         "    expr: sum(rate(x[5m])\n    summary: s\n", 5, "unclosed '('"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n"
         "    expr: up{job=\"a}\n    summary: s\n", 5, "unterminated string"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    summary: '{{ $labels.gpu | toUpper }}'\n", 6, "unsupported placeholder"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    summary: s\n    labels: {severity: low}\n", 7, "set by Argus"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    type: permanent\n    pattern: x\n", 5,
         "looks like a log rule"),
        ("rules:\n  - reason: lower\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    summary: s\n", 2, "not a CamelCase name"),
        ("rules:\n  - reason: A\n    category: gpu_hardware\n    severity: warning\n    expr: up\n"
         "    expr: down\n    summary: s\n", 6, "appears twice"),
    ],
)
def test_bad_rule_files_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    assert f"{path}:{line}" in message and fragment in message, message


def test_duplicate_reason_across_files_names_both(tmp_path: Path) -> None:
    a, b = write(tmp_path, GOOD, "a.yaml"), write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(RuleError) as info:
        MetricRuleSet.load([a, b])
    assert f"{b}:3" in str(info.value) and f"{a}:3" in str(info.value)


def test_promql_prometheus_rejects_is_named_with_file_and_line(tmp_path: Path) -> None:
    """promtool (real) parses every expr; the error points at the rule's file and line."""
    path = write(tmp_path, GOOD + rule_text("RateOfGauge", "rate(DCGM_FI_DEV_GPU_TEMP) > 1"))
    rules = MetricRuleSet.load([path])
    with pytest.raises(RuleError) as info:
        promtool_check(rules)
    message = str(info.value)
    assert f"{path}:18 (rule RateOfGauge)" in message and "expected type range vector" in message
    promtool_check(load_metric_rules())  # the shipped rules pass


def test_extra_folder_and_missing_folder(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    rules = load_metric_rules([tmp_path])
    assert rules.get("HotGpu") is not None and rules.get("GpuXidDrainAndReset") is not None
    with pytest.raises(RuleError, match="does not exist"):
        load_metric_rules([tmp_path / "nope"])


# --- templates --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(79.0, "79"), (92.5, "92.5"), (0.0, "0"), (0.0001, "0.0001"), (0.00001, "1e-05"), (123456.0, "123456"),
     (1e6, "1e+06"), (1234567.0, "1.234567e+06"), (-3.25, "-3.25"), (float("nan"), "NaN"),
     (float("inf"), "+Inf")],
)
def test_values_print_as_go_prints_them(value: float, text: str) -> None:
    assert go_float(value) == text


def test_templates_fill_labels_values_and_percentages() -> None:
    labels = {"gpu": "3", "Hostname": "n1"}
    assert render_template("GPU {{ $labels.gpu }} on {{$labels.Hostname}}: {{ $value }}", labels, 91.0) == \
        "GPU 3 on n1: 91"
    assert render_template("{{ $value | humanizePercentage }} used, {{ $labels.missing }}.", labels, 0.9809) == \
        "98.09% used, ."
    assert parse_duration("1h30m") == 5400 and parse_duration("0s") == 0 and parse_duration("") is None


# --- the detector: `for`, episodes, fingerprints -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def gpu(uuid_: str = "GPU-1") -> Subject:
    return Subject(kind=SubjectKind.GPU, id=uuid_, name=f"n1/gpu{uuid_[-1]}")


def series(reason: str, value: float, subject: Subject, **labels: str) -> Signal:
    labels = {"gpu": subject.name[-1], "UUID": subject.id, "Hostname": "n1", **labels}
    return Signal(kind=SignalKind.METRIC, source="prometheus:test", subject=subject, value=value,
                  attrs={RULE_ATTR: reason, "metric": labels.get("__name__"), "labels": labels})


def evaluated(reason: str, n: int = 1) -> Signal:
    return Signal(kind=SignalKind.METRIC, source="prometheus:test",
                  subject=Subject(kind=SubjectKind.CLUSTER, id="cluster"), value=float(n),
                  attrs={RULE_ATTR: reason, EVALUATED_ATTR: True})


def test_for_waits_for_a_continuously_active_series_and_resets_when_it_clears(tmp_path: Path) -> None:
    rules = MetricRuleSet.load([write(tmp_path, GOOD)])
    clock = Clock()
    detector = MetricRuleDetector(rules, clock=clock)
    hot = [evaluated("HotGpu"), series("HotGpu", 95, gpu())]

    assert detector.detect(hot) == []  # pending from t=0
    clock.advance(60)
    assert detector.detect(hot) == []
    clock.advance(30)
    assert detector.detect([evaluated("HotGpu", 0)]) == []  # cleared at t=90: pending starts over
    clock.advance(10)
    assert detector.detect(hot) == []  # active again since t=100
    clock.advance(119)
    assert detector.detect(hot) == []
    clock.advance(1)
    [finding] = detector.detect(hot)  # 120 s of continuous activity
    assert finding.first_seen == clock.now - timedelta(seconds=120) and finding.detected_at == clock.now
    assert finding.summary == "GPU 1 on n1 at 95 C" and finding.recommended_action == "check cooling"
    assert finding.evidence[0].value == 95 and "rule HotGpu" in finding.evidence[0].text
    clock.advance(30)
    assert detector.detect(hot) == []  # still firing: reported once per episode


def test_a_poll_without_the_rule_keeps_its_state(tmp_path: Path) -> None:
    """When Prometheus cannot be queried the rule is not evaluated; that is not the series clearing."""
    rules = MetricRuleSet.load([write(tmp_path, GOOD)])
    clock = Clock()
    detector = MetricRuleDetector(rules, clock=clock)
    hot = [evaluated("HotGpu"), series("HotGpu", 95, gpu())]
    detector.detect(hot)
    clock.advance(100)
    assert detector.detect([]) == []  # a tick where the collector was down
    clock.advance(20)
    assert len(detector.detect(hot)) == 1


def fire_hot_gpu(detector: MetricRuleDetector, clock: Clock, *gpus: Subject):
    """HotGpu (for: 2m) active on `gpus` from now until it fires; the findings."""
    hot = [evaluated("HotGpu", len(gpus)), *(series("HotGpu", 95, g) for g in gpus)]
    assert detector.detect(hot) == []
    clock.advance(120)
    return detector.detect(hot)


def test_a_firing_rule_ends_once_absent_for_its_for_and_a_shorter_blip_does_not_end_it(tmp_path: Path) -> None:
    clock = Clock()
    detector = MetricRuleDetector(MetricRuleSet.load([write(tmp_path, GOOD)]), clock=clock)
    [finding] = fire_hot_gpu(detector, clock, gpu())
    hot, cool = [evaluated("HotGpu"), series("HotGpu", 95, gpu())], [evaluated("HotGpu", 0)]
    for seconds in (30, 60):  # absent at +30 and +90: 60 s, shorter than for: 2m
        clock.advance(seconds)
        assert detector.detect(cool) == []
    assert detector.recoveries() == []
    clock.advance(30)
    assert detector.detect(hot) == []  # back within its `for`: the same fault, not a new finding
    clock.advance(30)
    detector.detect(cool)  # absent from here
    clock.advance(119)
    detector.detect(cool)
    assert detector.recoveries() == [] and ("HotGpu", "gpu:GPU-1") in detector.pending()
    clock.advance(1)
    detector.detect(cool)
    [recovered] = detector.recoveries()
    assert recovered.fingerprint == finding.fingerprint and recovered.detector == "metric_rules"
    assert recovered.observed_at == clock.now
    assert recovered.reason == ("metric rule HotGpu no longer holds for n1/gpu1: `DCGM_FI_DEV_GPU_TEMP > 90` returned "
                                "no series for it since 2026-01-01 00:04:30 UTC (for: 2m)")
    assert detector.pending() == {}
    clock.advance(30)
    detector.detect(cool)
    assert detector.recoveries() == []  # told once
    [again] = fire_hot_gpu(detector, clock, gpu())  # a new episode: pending again for 2m, then the same fingerprint
    assert again.fingerprint == finding.fingerprint


def test_a_rule_with_for_0_ends_on_the_first_evaluation_without_it(tmp_path: Path) -> None:
    clock = Clock()
    detector = MetricRuleDetector(MetricRuleSet.load([write(tmp_path, GOOD)]), clock=clock)
    [finding] = detector.detect([evaluated("XidNow"), series("XidNow", 79, gpu())])
    clock.advance(30)
    detector.detect([evaluated("HotGpu", 0)])  # another rule's evaluation says nothing of this one
    assert detector.recoveries() == []
    detector.detect([evaluated("XidNow", 0)])
    [recovered] = detector.recoveries()
    assert recovered.fingerprint == finding.fingerprint
    assert recovered.reason.endswith("returned no series for it in the last evaluation (for: 0s)")


def test_an_outage_is_no_absence(tmp_path: Path) -> None:
    """Polls where the rule was not evaluated (Prometheus down, the query refused) neither start nor end the
    count: the fault ends only after evaluations that lacked it for the whole `for`."""
    clock = Clock()
    detector = MetricRuleDetector(MetricRuleSet.load([write(tmp_path, GOOD)]), clock=clock)
    fire_hot_gpu(detector, clock, gpu())
    for _ in range(20):  # ten minutes without an evaluation
        clock.advance(30)
        assert detector.detect([evaluated("XidNow", 0)]) == []
    assert detector.recoveries() == []
    detector.detect([evaluated("HotGpu", 0)])  # the first evaluation again, and the series is gone: count from here
    clock.advance(60)
    detector.detect([evaluated("HotGpu", 0)])
    assert detector.recoveries() == []
    clock.advance(60)
    detector.detect([evaluated("HotGpu", 0)])
    assert len(detector.recoveries()) == 1


def test_each_subject_is_its_own_fault(tmp_path: Path) -> None:
    clock = Clock()
    detector = MetricRuleDetector(MetricRuleSet.load([write(tmp_path, GOOD)]), clock=clock)
    first, second = fire_hot_gpu(detector, clock, gpu("GPU-1"), gpu("GPU-2"))
    only_two = [evaluated("HotGpu"), series("HotGpu", 95, gpu("GPU-2"))]
    detector.detect(only_two)
    clock.advance(120)
    assert detector.detect(only_two) == []
    [recovered] = detector.recoveries()
    assert recovered.fingerprint == first.fingerprint != second.fingerprint


def test_xid_finding_names_the_xid_its_meaning_and_the_catalog_action(tmp_path: Path) -> None:
    rules = MetricRuleSet.load([write(tmp_path, GOOD)])
    first = MetricRuleDetector(rules, clock=Clock())
    signals = [evaluated("XidNow", 2), series("XidNow", 79, gpu("GPU-1"), err_code="79"),
               series("XidNow", 79, gpu("GPU-1"), err_code="79", hpc_job="j2")]
    [finding] = first.detect(signals)  # two series of one GPU: one finding
    assert finding.category is Category.GPU_HARDWARE and finding.severity is Severity.CRITICAL
    assert finding.subject == gpu("GPU-1") and len(finding.evidence) == 2
    assert finding.summary == (
        "GPU GPU-1 reported Xid 79: Xid 79 (GPU has fallen off the bus; hardware: drain and reset)"
    )
    assert "Drain the node" in finding.recommended_action and "reboot" in finding.recommended_action
    assert finding.attrs["xid"] == 79 and finding.attrs["nvidia_action"] == "RESTART_BM"
    # A restarted Argus reports the same claim with the same fingerprint, so the store folds it.
    [again] = MetricRuleDetector(MetricRuleSet.load([tmp_path / "rules.yaml"]), clock=Clock()).detect(signals)
    assert again.fingerprint == finding.fingerprint
    other = MetricRuleDetector(rules, clock=Clock()).detect([evaluated("XidNow"), series("XidNow", 79, gpu("GPU-2"))])
    assert other[0].fingerprint != finding.fingerprint


def test_signals_of_other_sources_and_unknown_rules_are_ignored(tmp_path: Path) -> None:
    detector = MetricRuleDetector(MetricRuleSet.load([write(tmp_path, GOOD)]), clock=Clock())
    node_state = Signal(kind=SignalKind.NODE_STATE, source="ray", subject=gpu(), attrs={RULE_ATTR: "XidNow"})
    assert detector.detect([node_state, series("NotARule", 79, gpu()), evaluated("NotARule")]) == []


def test_subjects_from_labels() -> None:
    assert subject_of({"gpu": "2", "UUID": "GPU-x", "Hostname": "n1"}) == \
        Subject(kind=SubjectKind.GPU, id="GPU-x", name="n1/gpu2")
    assert subject_of({"Hostname": "n1", "instance": "10.0.0.1:9400"}).key() == "node:n1"
    node = subject_of({"instance": "10.0.0.1:9400", "job": "dcgm"})
    assert (node.kind, node.id, node.name) == (SubjectKind.NODE, "10.0.0.1:9400", "10.0.0.1")
    assert subject_of({}).kind is SubjectKind.CLUSTER


# --- real stack -----------------------------------------------------------------------------------------


@pytest.fixture
def dcgm_sim(prometheus_stack):
    """A simulated 4-GPU exporter with a hostname of its own, scraped by the session Prometheus."""
    sim = DcgmExporterSim(f"mr-{uuid.uuid4().hex[:8]}", gpus=4).start()
    job = f"dcgm-{sim.hostname}"
    prometheus_stack.prometheus.set_targets(job, [f"{sim.host}:{sim.port}"])
    yield sim
    prometheus_stack.prometheus.set_targets(job, [])
    sim.stop()


def test_xid_79_and_13_through_real_prometheus(prometheus_stack, dcgm_sim) -> None:
    client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=10)
    rules = load_metric_rules()
    collector = MetricRuleCollector(client, rules)
    detector = MetricRuleDetector(rules)
    dcgm_sim.set_gpu(1, xid=79)
    dcgm_sim.set_gpu(2, xid=13)
    uuids = {g.index: g.uuid for g in dcgm_sim.node.gpus}

    found: dict[str, object] = {}

    def both():
        for f in detector.detect(collector.collect()):
            if f.subject.id in (uuids[1], uuids[2]):
                found[f.subject.id] = f
        return len(found) == 2

    wait_until("findings for both simulated GPUs", both, timeout=60)
    assert collector.last_errors == {}
    hw, app = found[uuids[1]], found[uuids[2]]
    assert hw.category is Category.GPU_HARDWARE and hw.reason == "GpuXidDrainAndReset"
    assert hw.severity is Severity.CRITICAL and "drain" in hw.recommended_action.lower()
    assert hw.subject.name == f"{dcgm_sim.hostname}/gpu1"
    assert f"on {dcgm_sim.hostname} reported Xid 79: Xid 79 (GPU has fallen off the bus" in hw.summary
    assert hw.evidence[0].text.startswith("DCGM_FI_DEV_XID_ERRORS{") and hw.evidence[0].value == 79
    assert app.category is Category.USER_ERROR and app.reason == "GpuXidApplicationError"
    assert "application error, not hardware" in app.summary and app.severity is Severity.WARNING

    # The GPU comes back clean (after a reset the exporter reports 0): the series clears.
    dcgm_sim.set_gpu(1, xid=0)
    key = ("GpuXidDrainAndReset", f"gpu:{uuids[1]}")
    def cleared() -> bool:
        detector.detect(collector.collect())
        return key not in detector.pending()

    wait_until("the Xid 79 series to clear", cleared, timeout=60)


def test_rejected_query_skips_that_rule_and_unreachable_prometheus_raises(prometheus_stack, tmp_path: Path) -> None:
    rules = MetricRuleSet.load([write(tmp_path, GOOD + rule_text("Broken", "rate(up) > 0"))])
    collector = MetricRuleCollector(PrometheusClient(prometheus_stack.prometheus.url), rules)
    signals = collector.collect()
    assert set(collector.last_errors) == {"Broken"} and isinstance(collector.last_errors["Broken"], InputError)
    assert {s.attrs[RULE_ATTR] for s in signals if s.attrs.get(EVALUATED_ATTR)} == {"HotGpu", "XidNow"}
    with pytest.raises(SourceUnavailable):
        MetricRuleCollector(PrometheusClient("http://127.0.0.1:9", timeout_s=2), rules).collect()


def test_shipped_rules_use_metric_names_that_exist(prometheus_stack, dcgm_sim) -> None:
    """Every Ray metric a shipped rule reads is exported by the real Ray cluster; every DCGM field is one
    dcgm-exporter writes (the simulator's default counters, or the ECC counter from its optional set)."""
    client = PrometheusClient(prometheus_stack.prometheus.url)
    names = set()
    for rule in load_metric_rules():
        names |= set(re.findall(r"\b((?:DCGM_FI_[A-Z_]+)|(?:ray_[a-z_]+))\b", rule.expr))
    dcgm_known = {c.name for c in DEFAULT_COUNTERS} | {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    assert {n for n in names if n.startswith("DCGM_")} <= dcgm_known
    for name in sorted(n for n in names if n.startswith("ray_")):
        wait_until(f"{name} from the real Ray cluster", lambda name=name: client.query(name), timeout=90)

    # The disk rule's expression, with a threshold every node meets, yields one node subject per Ray node.
    disk = load_metric_rules().get("RayNodeDiskNearlyFull")
    rows = client.query(disk.expr.replace("< 0.05", "< 1.01"))
    ips = {n.ip for n in prometheus_stack.ray.nodes}
    assert {subject_of(r["metric"]).name for r in rows} >= ips
