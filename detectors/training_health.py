"""Training health: a job's step metrics as series, and findings when they go wrong while the job still runs.

Jobs that do not crash still fail: the loss turns NaN, gradients explode, steps slow down because one GPU
throttles, an RL run's entropy collapses or its responses hit the length cap. Trainers print every step's metrics;
this detector reads them from the job's log lines (LOG_LINE signals whose subject, or attrs, name the job):

- verl: `step:12 - actor/entropy:0.53 - critic/score/mean:0.1 - timing_s/step:41.2` (`key:value` after `step:N`)
- Hugging Face Trainer: `{'loss': 1.2, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.12}` (the step is the
  count of such lines, as the Trainer logs every `logging_steps`: the counter orders them, nothing else)
- Megatron: `iteration 100/ 1000 | ... | lm loss: 2.3E+00 | grad norm: 1.2 | elapsed time per iteration (ms): 812`
- mmengine (xtuner, OpenMMLab): `Epoch(train) [1][200/735]  lr: 1.9870e-04 ... loss: 2.7522  grad_norm: 3.0608`
  (the step counts across epochs)

Which metrics are kept, under which names, and the rules that judge them are data (detectors/training.yaml). A
series keeps its last `MAX_POINTS` values, each step once (eight ranks printing the same step are one value; a
step not above the last one seen is ignored). Lines from a log's backlog (`history`: written before Argus watched)
fill the series, so a restart keeps the run's baseline, but never fire a rule: an old NaN is no news.

Each rule fires once per job (the finding's fingerprint names the job and the rule; category training_anomaly);
slowdown, collapse and above rules also end, as recoveries, once their condition no longer holds. `series()` gives
each job's latest values for Argus's exporter (argus_job_train_metric), at most `max_series_per_job` per job and
`max_jobs` jobs, the most recently active first.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from core import signal_keys as keys
from core.errors import RuleError
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
    fingerprint_of,
    utcnow,
)
from detectors.rule_files import read_yaml

RULES_FILE = Path(__file__).with_name("training.yaml")
MAX_POINTS = 200  # values kept per series: the longest window a rule may use, and what a report quotes
RECENT_IN_FINDING = 20  # the values of the fired series a finding carries (the report shows them)
_MATCH_CHARS = 16 * 1024  # a metrics line is long (verl prints ~60 metrics); a 100 MB line is not searched whole
_JOB_KEYS = ("submission_id", "job", "job_id")
# What every metrics line of the four forms holds: a line without any of them is not read further (every log line
# of the cluster passes here, so the common case must cost a few substring checks)
_MARKERS = ("step:", "{'", "iteration", "(train)")
_NEVER = datetime.min.replace(tzinfo=timezone.utc)

_NUMBER = r"[-+]?(?:nan|inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_VERL_STEP = re.compile(r"(?<![\w/])step:(?P<step>\d+) - ")
_VERL_PAIR = re.compile(rf"(?:^| - )(?P<key>[A-Za-z_][\w/.@()-]{{0,120}}):(?P<value>{_NUMBER})(?= - |\s*$)", re.I)
_HF_DICT = re.compile(r"\{'[^{}]{0,4000}\}")
_HF_PAIR = re.compile(rf"'(?P<key>[\w/. -]{{1,120}})': (?P<value>{_NUMBER})(?=[,}}])", re.I)
_MEGATRON = re.compile(r"\biteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|")
# mmengine (xtuner, OpenMMLab): "Epoch(train) [1][200/735]  lr: 1.9870e-04  ...  loss: 2.7522  grad_norm: 3.0608"
_MMENGINE = re.compile(r"\b(?:Epoch|Iter)\(train\)\s*(?:\[(?P<epoch>\d+)\])?\s*\[(?P<iter>\d+)/(?P<total>\d+)\]")
_MMENGINE_PAIR = re.compile(rf"(?:^|\s)(?P<key>[A-Za-z_][\w/.]{{0,80}}): (?P<value>{_NUMBER})(?=\s|$)", re.I)
_MEGATRON_PAIR = re.compile(rf"\|\s*(?P<key>[A-Za-z][\w /().-]{{0,80}}?):\s*(?P<value>{_NUMBER})\s*(?=\|)", re.I)


def _number(text: str) -> float:
    return float(text.lower().replace("infinity", "inf"))


@dataclass(frozen=True)
class StepMetrics:
    """One metrics line: the step it reports (None: the Trainer's dict lines, which carry no step) and its values."""

    step: int | None
    values: dict[str, float]
    form: str  # "verl", "hf", "megatron", "mmengine"


def parse_metrics(line: str) -> StepMetrics | None:
    """The step metrics a line prints, or None for any other line."""
    text = line[:_MATCH_CHARS]
    if not any(marker in text for marker in _MARKERS):  # most lines: four substring checks, no regex
        return None
    if (m := _VERL_STEP.search(text)) is not None:
        rest = text[m.start():]
        values = {p["key"]: _number(p["value"]) for p in _VERL_PAIR.finditer(rest) if p["key"] != "step"}
        return StepMetrics(int(m["step"]), values, "verl") if values else None
    if (m := _MEGATRON.search(text)) is not None:
        values = {p["key"].strip(): _number(p["value"]) for p in _MEGATRON_PAIR.finditer(text[m.end() - 1:] + "|")}
        return StepMetrics(int(m["step"]), values, "megatron") if values else None
    if (m := _MMENGINE.search(text)) is not None:
        values = {p["key"]: _number(p["value"]) for p in _MMENGINE_PAIR.finditer(text[m.end():])}
        step = int(m["iter"]) + (int(m["epoch"]) - 1) * int(m["total"]) if m["epoch"] else int(m["iter"])
        return StepMetrics(step, values, "mmengine") if values else None
    if (m := _HF_DICT.search(text)) is not None:
        values = {p["key"]: _number(p["value"]) for p in _HF_PAIR.finditer(m.group(0))}
        if values and ("loss" in values or "grad_norm" in values or "eval_loss" in values):
            return StepMetrics(None, values, "hf")
    return None


# -- rules as data ------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeriesSpec(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,40}$")
    match: str = Field(min_length=1, max_length=1000)
    scale: float = Field(default=1.0, gt=0)


class TrainingRule(_Strict):
    id: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9]{0,63}$")
    kind: Literal["non_finite", "spike", "slowdown", "collapse", "drop", "above"]
    series: list[str] = Field(min_length=1)
    severity: Severity = Severity.WARNING
    summary: str
    action: str
    window: int = Field(default=50, ge=3, le=MAX_POINTS)
    min_points: int = Field(default=10, ge=3, le=MAX_POINTS)
    z: float = Field(default=10.0, gt=0)
    factor: float = Field(default=2.0, gt=1)
    for_steps: int = Field(default=3, ge=1, le=MAX_POINTS)
    baseline_points: int = Field(default=10, ge=1, le=MAX_POINTS)
    fraction: float = Field(default=0.1, gt=0, lt=1)
    threshold: float = 0.0

    @property
    def ends(self) -> bool:
        return self.kind in ("slowdown", "collapse", "drop", "above")


class TrainingRules(_Strict):
    series: list[SeriesSpec] = Field(min_length=1)
    rules: list[TrainingRule]
    _patterns: list[tuple[re.Pattern[str], SeriesSpec]] = PrivateAttr(default_factory=list)
    _names: dict[str, tuple[str, float] | None] = PrivateAttr(default_factory=dict)  # by key printed: few, reused

    def model_post_init(self, __context: Any) -> None:
        self._patterns = [(re.compile(s.match, re.I), s) for s in self.series]

    def name_of(self, key: str) -> tuple[str, float] | None:
        if key not in self._names:
            if len(self._names) > 10_000:  # keys are the trainers' own; a run printing endless new ones is cut
                self._names.clear()
            found = next(((s.name, s.scale) for pattern, s in self._patterns if pattern.fullmatch(key)), None)
            self._names[key] = found
        return self._names[key]


def load_training_rules(path: Path = RULES_FILE) -> TrainingRules:
    """The series allow-list and the rules; RuleError naming the file and what is wrong."""
    _, data = read_yaml(path, kind="training rule", empty_hint="give `series:` and `rules:`")
    for spec in (data or {}).get("series") or [] if isinstance(data, dict) else []:
        try:
            re.compile(str(spec.get("match", "")) if isinstance(spec, dict) else "")
        except re.error as exc:
            raise RuleError(f"{path}: series {spec.get('name')!r}: match is not a regular expression: {exc}",
                            hint="fix the pattern") from None
    try:
        rules = TrainingRules.model_validate(data)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise RuleError(f"{path}: {where}: {problem['msg']}",
                        hint="see the comment at the top of detectors/training.yaml for each field") from None
    names = {s.name for s in rules.series}
    for rule in rules.rules:
        unknown = sorted(set(rule.series) - names)
        if unknown:
            raise RuleError(f"{path}: rule {rule.id} judges series {', '.join(unknown)} that no `series:` entry keeps",
                            hint=f"use one of: {', '.join(sorted(names))}")
    return rules


# -- series and judgement -----------------------------------------------------------------------------------------


@dataclass
class _Series:
    points: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    start: list[float] = field(default_factory=list)  # the run's first values (a collapse rule's baseline)

    def add(self, step: int, value: float) -> bool:
        if self.points and step <= self.points[-1][0]:
            return False
        self.points.append((step, value))
        if len(self.start) < MAX_POINTS:
            self.start.append(value)
        return True


@dataclass
class _Job:
    series: dict[str, _Series] = field(default_factory=dict)
    hf_count: int = 0  # the Trainer's dict lines carry no step: their count stands in
    fired: set[str] = field(default_factory=set)  # rules reported, not yet ended
    last_at: datetime | None = None


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _mad_z(value: float, window: Sequence[float]) -> tuple[float, float]:
    """(robust z-score of `value` against `window`, the window's median)."""
    median = statistics.median(window)
    mad = statistics.median(abs(v - median) for v in window)
    spread = 1.4826 * mad or abs(median) * 1e-3 or 1e-12  # a flat window: any real jump counts
    return abs(value - median) / spread, median


def judge(rule: TrainingRule, points: Sequence[tuple[int, float]], start: Sequence[float]) -> dict[str, Any] | None:
    """What the rule sees in a series now (the values its summary names), or None when it does not hold."""
    if not points:
        return None
    step, value = points[-1]
    if rule.kind == "non_finite":
        return None if math.isfinite(value) else {"step": step, "value": value}
    if not math.isfinite(value):
        return None
    values = [v for _, v in points]
    if rule.kind == "spike":
        window = _finite(values[-rule.window - 1:-1])
        if len(window) < rule.min_points:
            return None
        z, median = _mad_z(value, window)
        return {"step": step, "value": value, "z": z, "median": median} if z > rule.z else None
    recent = values[-rule.for_steps:]
    if len(recent) < rule.for_steps or not all(math.isfinite(v) for v in recent):
        return None
    if rule.kind == "slowdown":
        before = _finite(values[-rule.for_steps - rule.window:-rule.for_steps])
        if len(before) < rule.min_points:
            return None
        median = statistics.median(before)
        return {"step": step, "value": value, "median": median} if median > 0 and all(
            v >= rule.factor * median for v in recent) else None
    if rule.kind == "drop":
        before = _finite(values[-rule.for_steps - rule.window:-rule.for_steps])
        if len(before) < rule.min_points:
            return None
        median = statistics.median(before)
        spread = 1.4826 * statistics.median(abs(v - median) for v in before)
        floor = median - max(rule.z * spread, rule.fraction * abs(median))
        return {"step": step, "value": value, "median": median} if all(v < floor for v in recent) else None
    if rule.kind == "collapse":
        base = _finite(start[: rule.baseline_points])
        if len(base) < rule.baseline_points or len(values) < rule.baseline_points + rule.for_steps:
            return None
        median = statistics.median(base)
        return {"step": step, "value": value, "median": median} if median > 0 and all(
            v < rule.fraction * median for v in recent) else None
    return {"step": step, "value": value} if all(v > rule.threshold for v in recent) else None


def _text(value: Any) -> str:
    if isinstance(value, float):
        return str(value) if not math.isfinite(value) else f"{value:.4g}"
    return str(value)


class TrainingHealthDetector:
    """See the module docstring."""

    name = "training_health"

    def __init__(self, rules: TrainingRules | None = None, *, max_jobs: int = 200, max_series_per_job: int = 24,
                 clock: Any = utcnow) -> None:
        self.rules = rules or load_training_rules()
        self.max_jobs = max_jobs
        self.max_series_per_job = max_series_per_job
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._ended: list[Recovery] = []

    # -- reading --------------------------------------------------------------------------------------------------

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        findings: list[Finding] = []
        for signal in signals:
            if signal.kind is not SignalKind.LOG_LINE or not signal.text:
                continue
            job_id = _job_of(signal)
            if job_id is None:
                continue
            parsed = parse_metrics(signal.text)
            if parsed is None:
                continue
            job = self._jobs.get(job_id)
            if job is None:
                job = self._jobs[job_id] = _Job(last_at=signal.observed_at)
                self._forget_oldest(keep=job_id)
            job.last_at = signal.observed_at
            # judged line by line: of two bad steps read in one poll, the first is the one to name
            if self._add(job, parsed) and not signal.attrs.get(keys.HISTORY):
                findings.extend(self._judge(job_id, job, signal))
        return findings

    def recoveries(self) -> list[Recovery]:
        ended, self._ended = self._ended, []
        return ended

    def _add(self, job: _Job, parsed: StepMetrics) -> bool:
        step = parsed.step
        if step is None:
            job.hf_count += 1
            step = job.hf_count
        added = False
        for key, value in parsed.values.items():
            named = self.rules.name_of(key)
            if named is None:
                continue
            name, scale = named
            if name not in job.series and len(job.series) >= self.max_series_per_job:
                continue
            added |= job.series.setdefault(name, _Series()).add(step, value * scale)
        return added

    def _forget_oldest(self, *, keep: str) -> None:
        while len(self._jobs) > self.max_jobs:
            oldest = min((j for j in self._jobs if j != keep), key=lambda j: self._jobs[j].last_at or _NEVER)
            del self._jobs[oldest]

    def _judge(self, job_id: str, job: _Job, signal: Signal) -> list[Finding]:
        findings = []
        for rule in self.rules.rules:
            seen = next(((name, hit) for name in rule.series if (s := job.series.get(name)) is not None
                         and (hit := judge(rule, s.points, s.start)) is not None), None)
            subject = Subject(kind=SubjectKind.JOB, id=job_id)
            if seen is None:
                if rule.ends and rule.id in job.fired and self._cleared(rule, job):
                    job.fired.discard(rule.id)
                    self._ended.append(Recovery(
                        fingerprint=fingerprint_of(Category.TRAINING_ANOMALY, subject, rule.id),
                        reason=f"{rule.id} no longer holds for {rule.for_steps} steps", detector=self.name))
                continue
            if rule.id in job.fired:
                continue
            job.fired.add(rule.id)
            name, hit = seen
            findings.append(self._finding(rule, job_id, name, hit, job.series[name], signal))
        return findings

    def _cleared(self, rule: TrainingRule, job: _Job) -> bool:
        """A rule that ends has ended once none of its series met it on any of its last `for_steps` values."""
        for name in rule.series:
            series = job.series.get(name)
            if series is None:
                continue
            points = list(series.points)
            for back in range(rule.for_steps):
                if judge(rule.model_copy(update={"for_steps": 1}), points[: len(points) - back], series.start):
                    return False
        return True

    def _finding(self, rule: TrainingRule, job_id: str, name: str, hit: dict[str, Any], series: _Series,
                 signal: Signal) -> Finding:
        words = {**{k: _text(v) for k, v in hit.items()}, "series": name, "window": rule.window,
                 "factor": f"{rule.factor:g}", "for_steps": rule.for_steps, "fraction": f"{rule.fraction:g}",
                 "z": hit.get("z", 0.0)}
        subject = Subject(kind=SubjectKind.JOB, id=job_id)
        recent = [[s, v if math.isfinite(v) else str(v)] for s, v in list(series.points)[-RECENT_IN_FINDING:]]
        return Finding(
            category=Category.TRAINING_ANOMALY, reason=rule.id, subject=subject, severity=rule.severity,
            summary=f"job {job_id}: " + rule.summary.format(**words),
            evidence=(Evidence(source=signal.source, text=(signal.text or "")[:2000], line=signal.line,
                               at=signal.observed_at),),
            first_seen=signal.observed_at, detected_at=self._clock(),
            recommended_action=rule.action.format(**words),
            fingerprint=fingerprint_of(Category.TRAINING_ANOMALY, subject, rule.id),
            attrs={keys.SUBMISSION_ID: job_id, "series": name, "step": hit["step"],
                   "value": _text(hit["value"]), "recent": recent},
        )

    # -- for the exporter ---------------------------------------------------------------------------------------------

    def series(self) -> dict[str, dict[str, float]]:
        """Each job's latest value per series (NaN and Inf as they are: Prometheus takes them)."""
        return {job_id: {name: s.points[-1][1] for name, s in job.series.items() if s.points}
                for job_id, job in self._jobs.items()}

    def recent(self, job_id: str) -> Mapping[str, list[tuple[int, float]]]:
        job = self._jobs.get(job_id)
        return {} if job is None else {name: list(s.points) for name, s in job.series.items()}


def _job_of(signal: Signal) -> str | None:
    if signal.subject.kind is SubjectKind.JOB:
        return signal.subject.id
    for key in _JOB_KEYS:
        value = signal.attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None
