"""Training health (detectors/training_health.py): step metric lines parsed into series, and the rules of
detectors/training.yaml judging them. Synthetic runs here exercise each rule's edges; the real excerpts from public
issues are judged in test_training_health_real_logs.py."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from core import signal_keys as keys
from core.errors import RuleError
from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.training_health import (
    MAX_POINTS,
    TrainingHealthDetector,
    load_training_rules,
    parse_metrics,
)

T0 = datetime(2026, 11, 29, 6, 0, tzinfo=timezone.utc)


def line(text: str, sid: str = "grpo-1", n: int = 0, *, history: bool = False) -> Signal:
    attrs = {keys.HISTORY: True} if history else {}
    return Signal(kind=SignalKind.LOG_LINE, source=f"/shared/jobs/{sid}/logs/driver.log", line=n, text=text,
                  observed_at=T0 + timedelta(seconds=n), subject=Subject(kind=SubjectKind.JOB, id=sid), attrs=attrs)


def verl(step: int, **metrics: float) -> str:
    names = {"entropy": "actor/entropy", "grad_norm": "actor/grad_norm", "pg_loss": "actor/pg_loss",
             "score": "critic/score/mean", "clip": "response_length/clip_ratio", "step_time": "timing_s/step"}
    return f"(TaskRunner pid=4242) step:{step} - " + " - ".join(f"{names.get(k, k)}:{v}" for k, v in metrics.items())


def run(detector: TrainingHealthDetector, texts: list[str], sid: str = "grpo-1") -> list:
    found = []
    for i, text in enumerate(texts):
        found += detector.detect([line(text, sid, i)])
    return found


def test_the_three_forms_parse_and_other_lines_do_not() -> None:
    assert parse_metrics(verl(3, entropy=0.5, step_time=41.2)).values == {"actor/entropy": 0.5, "timing_s/step": 41.2}
    hf = parse_metrics("{'loss': 2.1, 'grad_norm': nan, 'learning_rate': 1.9e-05, 'epoch': 0.12}")
    assert hf is not None and hf.step is None and math.isnan(hf.values["grad_norm"]) and hf.values["loss"] == 2.1
    mega = parse_metrics(" iteration      100/    1000 | elapsed time per iteration (ms): 812.3 | lm loss: "
                         "2.345678E+00 | grad norm: inf |")
    assert mega is not None and mega.step == 100 and mega.values["lm loss"] == 2.345678
    assert math.isinf(mega.values["grad norm"])
    for other in ("step 12 loss 0.3", "global_step=12", "{'eval_runtime': 3.1}", "step:x - loss:1", "", "step:1 - ",
                  "Traceback (most recent call last):", "{'a': 'b'}"):
        assert parse_metrics(other) is None, other


def test_a_nan_gradient_is_critical_once_and_names_the_step() -> None:
    detector = TrainingHealthDetector()
    texts = [verl(s, pg_loss=0.01, grad_norm=1.0 + s / 100) for s in range(1, 30)] + [verl(30, grad_norm=float("nan"))]
    texts += [verl(31, grad_norm=float("nan"))]
    [finding] = run(detector, texts)
    assert finding.category is Category.TRAINING_ANOMALY and finding.severity is Severity.CRITICAL
    assert finding.reason == "NonFiniteLossOrGradient" and finding.attrs["step"] == 30
    assert finding.summary == "job grpo-1: grad_norm is nan at step 30: training diverged"
    assert "resume from the last checkpoint before step 30" in (finding.recommended_action or "")
    assert finding.evidence[0].text.startswith("(TaskRunner pid=4242) step:30") and finding.evidence[0].line == 29
    assert finding.attrs["recent"][-1] == [30, "nan"] and len(finding.attrs["recent"]) == 20


def test_backlog_lines_fill_the_series_but_never_fire() -> None:
    detector = TrainingHealthDetector()
    old = [line(verl(s, grad_norm=float("nan") if s == 5 else 1.0), n=s, history=True) for s in range(1, 10)]
    assert detector.detect(old) == []
    assert detector.series()["grpo-1"]["grad_norm"] == 1.0  # the series is there for the exporter and baselines


def test_a_loss_spike_is_a_warning_and_noise_is_not() -> None:
    rng = random.Random(7)
    healthy = [f"{{'loss': {2.0 * math.exp(-s / 300) + rng.gauss(0, 0.05):.4f}, 'grad_norm': "
               f"{1.0 + rng.gauss(0, 0.1):.4f}, 'learning_rate': 2e-05, 'epoch': {s / 1000:.3f}}}" for s in range(500)]
    detector = TrainingHealthDetector()
    assert run(detector, healthy) == []  # 500 noisy steps of a run that converges: no finding
    [spike] = run(detector, ["{'loss': 9.5, 'grad_norm': 1.0, 'learning_rate': 2e-05, 'epoch': 0.5}"])
    assert spike.reason == "LossSpike" and spike.severity is Severity.WARNING and spike.attrs["series"] == "loss"
    assert "jumped to 9.5 at step 501" in spike.summary


def test_steps_slowing_down_are_a_straggler_suspect_that_ends_when_they_speed_up() -> None:
    detector = TrainingHealthDetector()
    steady = [verl(s, step_time=10.0 + (s % 3) * 0.2) for s in range(1, 21)]
    slow = [verl(s, step_time=24.0) for s in range(21, 24)]
    assert run(detector, steady + slow[:2]) == []  # two slow steps are not yet a trend
    [finding] = run(detector, slow[2:])
    assert finding.reason == "StepSlowdown" and "a straggler suspect" in finding.summary
    assert "at least 2× its median of 10.2 s for 3 steps" in finding.summary
    assert run(detector, [verl(s, step_time=10.1) for s in range(24, 26)]) == [] and detector.recoveries() == []
    run(detector, [verl(26, step_time=10.1)])
    [ended] = detector.recoveries()
    assert ended.fingerprint == finding.fingerprint and "no longer holds for 3 steps" in ended.reason


def test_rl_collapse_signs_are_warnings() -> None:
    detector = TrainingHealthDetector()
    start = [verl(s, entropy=1.2 - s * 0.01, clip=0.02) for s in range(1, 11)]
    collapsing = [verl(s, entropy=0.05, clip=0.8) for s in range(11, 16)]
    found = run(detector, start + collapsing)
    assert sorted(f.reason for f in found) == ["EntropyCollapse", "ResponsesAtLengthCap"]
    assert all(f.severity is Severity.WARNING for f in found)
    assert len({f.fingerprint for f in found}) == 2  # one incident per rule and job


def test_a_reward_that_falls_and_stays_down_is_a_collapse_and_a_dip_is_not() -> None:
    rng = random.Random(3)
    rising = [verl(s, score=min(1.0, 0.2 + 0.6 * (1 - math.exp(-s / 400)) + rng.gauss(0, 0.05)))
              for s in range(1, 150)]
    dip = [verl(s, score=0.05) for s in range(150, 155)] + [verl(s, score=0.35) for s in range(155, 170)]
    detector = TrainingHealthDetector()
    assert run(detector, rising + dip) == []  # five bad steps, then back: not a collapse
    fallen = [verl(s, score=0.05 + rng.gauss(0, 0.01)) for s in range(170, 185)]
    [collapse] = run(detector, fallen)
    assert collapse.reason == "RewardCollapse" and collapse.severity is Severity.WARNING
    assert collapse.attrs["step"] == 179 and "the policy's reward collapsed" in collapse.summary


def test_ranks_printing_one_step_make_one_value_and_jobs_are_apart() -> None:
    detector = TrainingHealthDetector()
    for _rank in range(8):
        detector.detect([line(verl(1, grad_norm=1.0)), line(verl(1, grad_norm=1.0), sid="sft-2")])
    assert len(detector.recent("grpo-1")["grad_norm"]) == 1 and set(detector.series()) == {"grpo-1", "sft-2"}
    detector.detect([line(verl(0, grad_norm=float("nan")))])  # an older step printed late: ignored
    assert detector.series()["grpo-1"]["grad_norm"] == 1.0


def test_series_and_jobs_are_capped_and_unknown_metrics_are_not_kept() -> None:
    detector = TrainingHealthDetector(max_jobs=3, max_series_per_job=2)
    for j in range(5):
        detector.detect([line(verl(1, entropy=1.0, grad_norm=1.0, score=0.3, weird_metric=5.0), sid=f"job-{j}", n=j)])
    assert set(detector.series()) == {"job-2", "job-3", "job-4"}  # the most recently active
    assert detector.series()["job-4"] == {"entropy": 1.0, "grad_norm": 1.0}
    long = "step:1 - " + " - ".join(f"k{i}:{i}" for i in range(5000)) + " - loss:nan"
    assert TrainingHealthDetector().detect([line(long)]) == []  # past the searched prefix: never read, never a crash
    many = [line(verl(s, grad_norm=1.0), n=s) for s in range(1, MAX_POINTS + 50)]
    detector.detect(many)
    assert len(detector.recent("grpo-1")["grad_norm"]) == MAX_POINTS


@pytest.mark.parametrize(("text", "problem"), [
    ("series: []\nrules: []\n", "series"),
    ("series:\n  - {name: loss, match: '(unclosed'}\nrules: []\n", "not a regular expression"),
    ("series:\n  - {name: loss, match: loss}\nrules:\n  - {id: X, kind: non_finite, series: [gradz], summary: s, "
     "action: a}\n", "no `series:` entry keeps"),
    ("series:\n  - {name: loss, match: loss}\nrules:\n  - {id: X, kind: sometimes, series: [loss], summary: s, "
     "action: a}\n", "kind"),
    ("series:\n  - {name: loss, match: loss, colour: red}\nrules: []\n", "colour"),
    ("", "empty"),
    ("[1, 2", "not valid YAML"),
])
def test_bad_rule_files_are_refused_naming_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "training.yaml"
    path.write_text(text)
    with pytest.raises(RuleError, match="training.yaml") as err:
        load_training_rules(path)
    assert problem in err.value.message


def test_the_built_in_rules_load() -> None:
    rules = load_training_rules()
    assert {r.id for r in rules.rules} == {"NonFiniteLossOrGradient", "LossSpike", "StepSlowdown",
                                          "EntropyCollapse", "RewardCollapse", "ResponsesAtLengthCap"}
    assert rules.name_of("actor/grad_norm") == ("grad_norm", 1.0)
    assert rules.name_of("elapsed time per iteration (ms)") == ("step_time", 0.001)
    assert rules.name_of("epoch") is None


def test_the_report_of_a_training_anomaly_shows_the_series_recent_values() -> None:
    from detectors.engine import load_rules
    from rca.engine import RcaEngine
    from rca.redact import Redactor
    from tests.support import make_incident

    detector = TrainingHealthDetector()
    [finding] = run(detector, [verl(s, grad_norm=1.0 + s / 100) for s in range(1, 30)]
                    + [verl(30, grad_norm=float("inf"))])
    incident = make_incident(category=Category.TRAINING_ANOMALY, reason=finding.reason, subject=finding.subject,
                             summary=finding.summary, fingerprint=finding.fingerprint)
    report = RcaEngine(load_rules([]), Redactor).report(incident, [finding], use_llm=False)
    assert report.category is Category.TRAINING_ANOMALY and report.markdown.startswith("# training_anomaly on")
    assert "is inf at step 30: training diverged" in report.markdown  # (Markdown escapes the underscore)
    assert "Recent values of `grad_norm`" in report.markdown
    assert "| step | 19 | 20 |" in report.markdown and "| 1.29 | inf |" in report.markdown
    assert "training-resume-earlier" in str(report.data) or "resume from the last checkpoint before" in report.markdown
