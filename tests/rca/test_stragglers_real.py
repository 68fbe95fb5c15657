"""A straggler suspect named from real DCGM series: a job's steps slowed down (a StepSlowdown finding), and the
report compares each of the job's GPUs with the others over the same window in the session's Prometheus, scraping a
DCGM-format exporter (the simulator: no GPU here) where one GPU is throttled."""

from __future__ import annotations

import pytest

from collectors.prometheus import PrometheusClient
from core.types import Category, Severity, Subject, SubjectKind, utcnow
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.metrics import PrometheusMetricsReader
from rca.redact import Redactor
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until
from tests.support import make_finding, make_incident

pytestmark = pytest.mark.prometheus

IP = "127.0.0.21"  # an address of this test's own: other tests' exporters run on the cluster's worker addresses


def test_the_report_names_the_gpu_that_stands_out_from_the_jobs_others(prometheus_stack) -> None:
    exporter = DcgmExporterSim("gpu-node-21", gpus=4, host=IP).start()
    prometheus = prometheus_stack.prometheus
    prometheus.set_targets("dcgm-stragglers", [f"{exporter.host}:{exporter.port}"])
    try:
        for gpu in range(4):
            exporter.set_gpu(gpu, util=95, sm_clock_mhz=1980, power_w=600.0, temp_c=62)
        exporter.set_gpu(2, util=58, sm_clock_mhz=990, power_w=340.0, temp_c=88)  # throttled
        wait_until("the throttled GPU's clock in Prometheus", lambda: any(
            s["value"][1] == "990" for s in prometheus.query(f'DCGM_FI_DEV_SM_CLOCK{{instance=~"{IP}:.*",gpu="2"}}')),
            timeout=60, interval=1)
        now = utcnow()
        slow = make_finding("job grpo-7: step_time is 24.1 s at step 23, at least 2× its median of 10.2 s for 3 steps",
                            category=Category.TRAINING_ANOMALY, reason="StepSlowdown", severity=Severity.WARNING,
                            subject=Subject(kind=SubjectKind.JOB, id="grpo-7"), attrs={"node_ip": IP},
                            first_seen=now)
        incident = make_incident(category=Category.TRAINING_ANOMALY, reason="StepSlowdown", subject=slow.subject,
                                 summary=slow.summary, attrs={"node_ip": IP}, severity=Severity.WARNING,
                                 first_seen=now, detected_at=now)
        reader = PrometheusMetricsReader(PrometheusClient(prometheus.url, timeout_s=5), before_s=30, after_s=5,
                                         step_s=1)
        report = RcaEngine(load_rules([]), Redactor, metrics=reader).report(incident, [slow], use_llm=False)
        assert "Straggler suspects" in report.markdown
        assert f"GPU 2 on {IP}: sm clock 990 MHz against the job's median of 1980 MHz" in report.markdown
        named = {m["name"] for m in report.data["metrics"] if m["labels"].get("gpu") == "2"}
        assert {"straggler_sm_clock", "straggler_gpu_util", "straggler_power", "straggler_temp"} <= named
        assert not [m for m in report.data["metrics"] if m["name"].startswith("straggler_")
                    and m["labels"].get("gpu") != "2"]  # the healthy GPUs are not named
    finally:
        prometheus.set_targets("dcgm-stragglers", [])
        exporter.stop()
