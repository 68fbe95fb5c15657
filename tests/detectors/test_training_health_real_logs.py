"""Training health on real log lines from public issues (tests/fixtures/training/, sources and changes in its
SOURCES.md): each file is fed as the live log of one job, and the findings must be the ones its failure shows:
a non-finite loss or gradient is critical; healthy runs (one with a gradient-norm outlier) give nothing."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.training_health import TrainingHealthDetector, parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "training"
T0 = datetime(2026, 11, 29, 6, 0, tzinfo=timezone.utc)

# file -> (the series whose non-finite value must be found, or None for a healthy log; the form its lines are in)
EXPECTED = {
    "awesome-ml-sys-106_verl_healthy_steps.log": (None, "verl"),
    "verl-2060_healthy_step0_step1.log": (None, "verl"),
    "rllm-54_verl_zero_reward_steps.log": (None, "verl"),
    "hf-transformers-29659_healthy.log": (None, "hf"),
    "megatron-llm-11_healthy_iterations.log": (None, "megatron"),
    "tinyzero-101_verl_all_nan_clip_ratio_1.log": ("pg_loss", "verl"),
    "verl-pr1037_grad_norm_nan.log": ("grad_norm", "verl"),
    "hf-modernbert-233_grad_norm_nan.log": ("grad_norm", "hf"),
    "hf-pink-6_loss_zero_grad_norm_nan.log": ("grad_norm", "hf"),
    "hf-time-moe-71_intermittent_grad_norm_nan.log": ("grad_norm", "hf"),
    "hf-vg-llm-45_loss_spike_grad_norm_nan.log": ("grad_norm", "hf"),
    "megatron-ds-396_grad_norm_nan_no_lm_loss.log": ("grad_norm", "megatron"),
    "xtuner-187_grad_norm_nan.log": ("grad_norm", "mmengine"),
}


def test_every_fixture_is_listed_with_its_source() -> None:
    files = {p.name for p in FIXTURES.glob("*.log")}
    assert files == set(EXPECTED)
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert all(name in sources for name in files)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_logs_give_the_finding_their_failure_shows(name: str) -> None:
    series, form = EXPECTED[name]
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    parsed = [p for p in map(parse_metrics, lines) if p is not None]
    assert parsed and {p.form for p in parsed} == {form}, name
    detector = TrainingHealthDetector()
    findings = []
    for i, text in enumerate(lines):
        findings += detector.detect([Signal(kind=SignalKind.LOG_LINE, source=f"/jobs/{name}/driver.log", line=i + 1,
                                            text=text, observed_at=T0 + timedelta(seconds=i),
                                            subject=Subject(kind=SubjectKind.JOB, id="job-1"))])
    if series is None:
        assert findings == [], [f.summary for f in findings]
        return
    first = findings[0]
    assert first.category is Category.TRAINING_ANOMALY and first.severity is Severity.CRITICAL
    assert first.reason == "NonFiniteLossOrGradient" and first.attrs["series"] == series
    bad = next(i for i, p in enumerate(map(parse_metrics, lines)) if p is not None and any(
        not math.isfinite(v) for v in p.values.values()))
    assert first.evidence[0].line == bad + 1  # the first line that shows it
