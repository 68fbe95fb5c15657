"""Stall detector: a RUNNING job whose progress has stopped, found long before NCCL's 10-minute watchdog.

A hung collective prints nothing: the ranks sit in all_reduce until the c10d timeout (10 min by default)
and Ray still reports the job RUNNING. What does change is the job's own rhythm: it printed a step every
N seconds and now prints none. So the detector learns each job's step interval from its log lines and
fires `nccl_hang` when no progress has come for longer than max(min_stall_s, factor x interval).

What counts as progress, per job:
- step lines: any of `patterns` (data, not code: "step 12", "global_step=12", verl's "step:12 - ",
  tqdm bars such as "Epoch 1: 45%|...| 45/100", "iteration 120/1000"). A counter (pattern + the bar's
  label) advances only on a new high, so the same step printed by eight ranks is one step, and a counter
  that drops below half its high (a new epoch's bar) starts over.
- log growth: any new line, but only for jobs that never printed a step line. Once a job prints steps,
  its steps are the truth: Ray's and libraries' periodic warnings keep coming while a collective hangs.
  Before its first step a job imports, loads weights and meets its peers, often silently for minutes, so
  log growth alone is judged against `startup_grace_s` (or factor x the longest silence seen, if longer).
- GPU activity, where known: the job's GPU utilisation moving by at least `gpu_activity_delta` points.
  A GPU pinned at 100% (NCCL kernels spin while they wait) or idle at 0% is not progress.

The interval of a counter is the larger of the median of its recent per-step gaps and its last gap, so a
job whose steps slow down gradually raises its own threshold with each step that still arrives. Lines
read in one poll share one time, so a batch of k new steps after a gap g counts as k gaps of g/k.

Lines from a log's backlog (what a file held when Argus first saw it) carry the time they were written
(`attrs["line_time"]`, set by the collector); they count as progress at that time, not at the moment they were
read, so a burst of old step lines read at start teaches the job's real rhythm and is no fresh progress. Their
times come from the cluster's clocks and stamps, so they never call a stall on their own: a job whose backlog
shows it silent for hours is called stalled only if nothing moves for its usual threshold after Argus first
read it (as after a restart), and a stamp read in the wrong zone costs no false alarm.

A job is judged only while its last JOB_STATE says RUNNING and only once a log line of it was seen (a job
whose logs are not collected has no rhythm to lose). The detector returns the finding on every call while
the stall lasts; progress ends the episode as a recovery (`recoveries()`, read by the loop after each tick,
closes the incident). A job that leaves RUNNING while hung also ends the episode, but that is no recovery: its
incident stays open until a resubmission of it reaches RUNNING (detectors/resubmissions.py), or for a person.
The fingerprint names the job, so one stall is one incident across restarts, and a job that hangs again soon after
it resumed reopens that incident (the desk's reopen_window_s) instead of opening another.

Restarts: with a `memory` (core.ports.DetectorMemory), each job's rhythm (detectors/stall_state.py) is saved after
every tick in which it changed and loaded at construction, so a job already hung when Argus restarts is found
within its usual threshold of its real last progress, under the same fingerprint. A remembered job is judged
again only once Ray says it is still RUNNING; one that is not is dropped, and forgotten in the memory too. A job
that ended while hung is remembered (under HUNG_ENDED_MEMORY) until a resubmission of it runs, so a resubmission
that runs after a restart still closes the stall's incident.

One module past 400 lines on purpose: the progress patterns, the per-job rhythm and the verdict are one
algorithm; the state they share is the detector's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from loguru import logger

from core import signal_keys as keys
from core.errors import ConfigError
from core.ports import DetectorMemory
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
from detectors.hang_stacks import HangCall, judge, ranks_of
from detectors.memory import SavedState, StateUnreadable, job_key, keep_newest
from detectors.resubmissions import JobRuns
from detectors.stall_state import (
    HUNG_ENDED_MEMORY,
    MAX_COUNTERS,
    HungEnded,
    ProgressCounter,
    RankProgress,
    WatchedJob,
    recalled,
    recalled_hung_ended,
    remembered,
    remembered_hung_ended,
)
from detectors.timestamps import parse_iso

REASON = "TrainingStalled"
LOG_GROWTH = "log-growth"
ACTION = (
    "Find the rank that stopped: dump every rank's Python stack (`py-spy dump --pid <pid>`, or the Ray "
    "dashboard's stack trace of the job's actors) and look for the one not inside the collective. Keep the "
    "scene, then stop the job and resubmit it from its last checkpoint; check that rank's node for GPU Xid "
    "errors, NIC faults or host memory pressure before reusing it."
)

# Utilisation metrics that say whether a GPU is working; DCGM_FI_PROF_* are ratios (0-1), the rest percent.
GPU_ACTIVITY_METRICS = frozenset(
    {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "nvml_gpu_util"}
)
_JOB_LABELS = ("submission_id", "job", "job_id")

_MAX_HUNG_ENDED = 10_000  # hung jobs that ended, kept until resubmitted: the oldest are let go past this
_MATCH_CHARS = 8 * 1024  # step markers sit at the start of a line; a 100 MB line is not searched whole


@dataclass(frozen=True)
class ProgressPattern:
    """One kind of progress line. Named groups: `step` (the counter), `pct` (a bar's percent, used when
    there is no count) and `label` (which bar, so parallel bars count separately)."""

    name: str
    pattern: str
    regex: re.Pattern[str] = field(init=False, compare=False, repr=False)  # compiled in __post_init__

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(
                f"progress pattern '{self.name}' is not a valid regular expression: {exc}",
                hint="fix the pattern; named groups step, pct and label are read when present",
            ) from None
        object.__setattr__(self, "regex", compiled)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ProgressPattern:
        if not isinstance(data, Mapping) or not {"name", "pattern"} <= set(data):
            raise ConfigError(
                f"progress pattern {data!r} needs a name and a pattern",
                hint="write e.g. {name: my_step, pattern: 'it=(?P<step>\\d+)'}",
            )
        return cls(str(data["name"]), str(data["pattern"]))


# Specific before generic: the first pattern that matches a line decides its counter.
DEFAULT_PATTERNS: tuple[ProgressPattern, ...] = (
    # verl's per-step metrics line: "step:12 - actor/entropy:0.5 - ..."
    ProgressPattern("verl_step", r"(?<![\w/])step:(?P<step>\d+) - "),
    ProgressPattern("global_step", r"(?i)\bglobal[_ ]step\s*[=:]\s*(?P<step>\d+)"),
    # Megatron-LM: " iteration      120/    1000 | consumed samples: ..."
    ProgressPattern("iteration", r"(?i)\biter(?:ation)?\s*[=:]?\s*(?P<step>\d+)\s*/\s*\d+"),
    # tqdm and Lightning bars: "Epoch 1:  45%|####5     | 45/100 [00:10<00:12, 4.5it/s]"
    ProgressPattern(
        "tqdm",
        r"(?:(?P<label>[A-Za-z][^|:\r\n]{0,60}):\s*)?(?P<pct>\d{1,3})%\|[^|\r\n]{0,200}\|(?:\s*(?P<step>\d+)/)?",
    ),
    # Hugging Face Trainer's log dicts: "{'loss': 0.52, 'learning_rate': 1e-05, 'epoch': 0.12}"
    ProgressPattern("hf_epoch", r"\{'loss': [^}]{0,400}'epoch': (?P<step>\d+(?:\.\d+)?)"),
    # "step 12", "Step: 12", "step=12/1000", "[step #12]"; not "global_step", "steps 12" or "/step 1"
    ProgressPattern("step", r"(?i)(?<![\w/])step\s*[=:#]?\s*(?P<step>\d+)\b"),
)


def load_patterns(items: Iterable[Mapping[str, Any] | ProgressPattern]) -> tuple[ProgressPattern, ...]:
    """Patterns from data (e.g. a YAML list of {name, pattern}); ConfigError on a bad one."""
    return tuple(p if isinstance(p, ProgressPattern) else ProgressPattern.from_mapping(p) for p in items)


@dataclass
class _Suspicion:
    """A job silent past its suspicion threshold, and what its stacks said of it (not kept across restarts: it is
    found again within one suspicion threshold)."""

    last_at: datetime  # the progress it went silent after: progress since ends the suspicion
    since: datetime  # when Argus began to suspect it; samples taken before do not count
    requested_at: datetime | None = None
    call: HangCall | None = None
    call_at: datetime | None = None  # when the samples behind `call` were taken (the first of the two)


@dataclass(frozen=True)
class JobProgress:
    """What the detector has learnt of one RUNNING job's progress (for dashboards; it judges nothing)."""

    step: float  # the highest value of the job's main step counter
    interval_s: float | None  # that counter's learnt step interval; None until it has seen enough steps


@dataclass(frozen=True)
class _Verdict:
    stalled: bool  # silent past the threshold: a hang even without stacks
    suspected: bool  # silent past the suspicion threshold: stacks are asked for, and may confirm it at once
    mode: str
    last_at: datetime
    last_line: Signal | None
    interval: float | None
    threshold: float
    steps: int


class StallDetector:
    name = "stall"

    def __init__(
        self,
        *,
        min_stall_s: float = 60.0,
        factor: float = 3.0,
        suspect_min_s: float = 20.0,
        max_work_s: float = 1800.0,
        resample_s: float = 10.0,
        patterns: Sequence[ProgressPattern] | Iterable[Mapping[str, Any]] = DEFAULT_PATTERNS,
        startup_grace_s: float = 300.0,
        log_stream: str | None = "job-logs",
        gpu_activity_delta: float = 10.0,
        forget_after_s: float = 6 * 3600.0,
        memory: DetectorMemory | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`memory`: where each job's rhythm is kept across restarts (loaded here, saved after each detect);
        None keeps it in this process only. `suspect_min_s`: a job silent for max(suspect_min_s, factor x interval)
        is suspected, and its stacks (STACKS signals, asked for through `stack_requests`) confirm a hang at once;
        without stacks a hang is called after max(min_stall_s, factor x interval). `max_work_s`: how long stacks
        showing silent work (a checkpoint save, data loading) hold a hang call back. `resample_s`: how soon stacks
        that did not confirm are asked for again."""
        if min_stall_s <= 0 or factor < 1:
            raise ConfigError(
                f"stall detector needs min_stall_s > 0 and factor >= 1, got {min_stall_s} and {factor}",
                hint="the defaults are min_stall_s=60, factor=3",
            )
        self.min_stall_s = float(min_stall_s)
        self.factor = float(factor)
        self.suspect_min_s = float(suspect_min_s)
        self.max_work = timedelta(seconds=max_work_s)
        self.resample = timedelta(seconds=resample_s)
        self._suspects: dict[str, _Suspicion] = {}
        self.startup_grace_s = float(startup_grace_s)
        self.patterns = load_patterns(patterns)
        self.log_stream = log_stream  # None: every LOG_LINE about a job counts
        self.gpu_activity_delta = float(gpu_activity_delta)
        self.forget_after = timedelta(seconds=forget_after_s)
        self._clock = clock
        self._jobs: dict[str, WatchedJob] = {}
        self._recovered: list[Recovery] = []
        self._changed: set[str] = set()  # jobs whose remembered state may differ from what was saved
        self._saved = SavedState(memory, self.name)
        self._runs = JobRuns()
        self._hung_ended: dict[str, HungEnded] = {}  # job -> its ended stall, until resubmitted; oldest first
        self._hung_changed: set[str] = set()  # jobs whose ended stall may differ from what was saved
        self._hung_saved = SavedState(memory, HUNG_ENDED_MEMORY)
        self._recall()

    # -- the one verb ------------------------------------------------------------------------------

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        now = self._clock()
        self._runs.observe(signals)
        for signal in signals:
            if signal.kind is SignalKind.JOB_STATE and signal.subject.kind is SubjectKind.JOB:
                job = self._job(signal.subject)
                status = str(signal.attrs.get(keys.STATUS) or "") or None
                if status != job.status or signal.subject != job.subject:
                    self._changed.add(job.subject.id)
                job.subject = signal.subject  # the state collector's subject carries the entrypoint
                job.status = status
                job.seen_at = now
            elif signal.kind is SignalKind.LOG_LINE and signal.subject.kind is SubjectKind.JOB:
                if self.log_stream is None or signal.attrs.get(keys.STREAM) in (None, self.log_stream):
                    self._on_line(self._job(signal.subject), signal)
            elif signal.kind is SignalKind.METRIC and signal.attrs.get(keys.METRIC) in GPU_ACTIVITY_METRICS:
                self._on_gpu(signal)
        for signal in signals:  # after the lines: a sample of a job that has just moved again is stale
            if signal.kind is SignalKind.STACKS and signal.subject.kind is SubjectKind.JOB:
                self._on_stacks(signal)
        findings = self._judge(now)
        self._remember()
        return findings

    def progress(self) -> dict[str, JobProgress]:
        """Per RUNNING job that printed step lines: its main counter's step and interval. Read-only.

        The main counter is the one with the most progress events (verl's step line rather than an eval bar
        that runs now and then); jobs judged by log growth alone have no step and are left out.
        """
        out: dict[str, JobProgress] = {}
        for job_id, job in self._jobs.items():
            if job.status != "RUNNING":
                continue
            counted = [c for c in job.counters.values() if c.high is not None]
            if not counted:
                continue
            main = max(counted, key=lambda c: c.steps)  # on a tie max() keeps the counter seen first
            assert main.high is not None
            out[job_id] = JobProgress(step=main.high, interval_s=main.interval())
        return out

    def recoveries(self) -> list[Recovery]:
        """The stall episodes that ended with progress since the last call (the second verb: see core.ports)."""
        done, self._recovered = self._recovered, []
        return done

    def stack_requests(self) -> list[str]:
        """The jobs whose stacks should be sampled now (the stack sampler asks each tick): those suspected of
        hanging and not yet confirmed, once per suspicion, and again `resample_s` after stacks that did not
        confirm it (silent work, or stacks that could not tell)."""
        now = self._clock()
        # A job that has become suspect since the last detect is suspected now, not a tick later: the stacks the
        # sampler starts now are what confirm the hang.
        for job_id, watched in self._jobs.items():
            if job_id in self._suspects or watched.status != "RUNNING" or watched.episode is not None:
                continue
            verdict = self._verdict(watched, now)
            if verdict is not None and verdict.suspected:
                self._suspects[job_id] = _Suspicion(last_at=verdict.last_at, since=now)
        wanted: list[str] = []
        for job_id, suspicion in self._suspects.items():
            job = self._jobs.get(job_id)
            if job is None or job.episode is not None:
                continue
            if suspicion.requested_at is None or (
                    suspicion.call is not None and now - suspicion.requested_at >= self.resample):
                suspicion.requested_at = now
                wanted.append(job_id)
        return wanted

    # -- memory across restarts (detectors/stall_state.py) ------------------------------------------

    def _recall(self) -> None:
        """The jobs remembered from before a restart, each judged again once Ray says it is still RUNNING."""
        now = self._clock()
        for key, value in self._saved.load().items():
            try:
                self._jobs[key] = recalled(key, value, now)
            except StateUnreadable as err:
                logger.warning("stall detector: the remembered state of job {} is unreadable ({}): it starts fresh",
                               key, err)
                self._saved.forget_loaded(key)
        if self._jobs:
            logger.info("stall detector remembers the progress of {} job(s) from before the restart", len(self._jobs))
        self._recall_hung_ended()

    def _recall_hung_ended(self) -> None:
        """The jobs that ended hung before a restart, still waiting for a resubmission to run: of the readable ones,
        the most recent _MAX_HUNG_ENDED (the others are forgotten, as if let go)."""
        readable: list[tuple[str, str, HungEnded]] = []
        for key, value in self._hung_saved.load().items():
            try:
                job_id, ended = recalled_hung_ended(key, value)
            except StateUnreadable as err:
                logger.warning("stall detector: the remembered stall of ended job {} is unreadable ({}): it starts "
                               "fresh", key, err)
                self._hung_saved.forget_loaded(key)
                continue
            readable.append((key, job_id, ended))
        for job_id, ended in keep_newest(self._hung_saved, readable, _MAX_HUNG_ENDED, lambda ended: ended.ended_at):
            self._hung_ended[job_id] = ended
        if self._hung_ended:
            logger.info("stall detector remembers {} job(s) that ended hung, until they are resubmitted",
                        len(self._hung_ended))

    def _remember(self) -> None:
        """Save the jobs changed this tick: at most one write per tick and kind of state, none when nothing changed."""
        changed, self._changed = self._changed, set()
        self._saved.save({key: remembered(self._jobs[key]) if key in self._jobs else None for key in changed})
        hung, self._hung_changed = self._hung_changed, set()
        self._hung_saved.save({job_key(job_id): remembered_hung_ended(job_id, self._hung_ended[job_id])
                               if job_id in self._hung_ended else None for job_id in hung})

    # -- reading signals ---------------------------------------------------------------------------

    def _job(self, subject: Subject) -> WatchedJob:
        job = self._jobs.get(subject.id)
        if job is None:
            job = self._jobs[subject.id] = WatchedJob(subject=subject)
        return job

    def _on_line(self, job: WatchedJob, signal: Signal) -> None:
        text = (signal.text or "")[:_MATCH_CHARS]
        at = signal.observed_at
        written = parse_iso(signal.attrs.get(keys.LINE_TIME))
        if written is not None:  # a backlog line: progress when it was written, never later than it was read
            at = min(written, at)
            job.watch_from = job.watch_from or signal.observed_at
        job.seen_at = max(job.seen_at or signal.observed_at, signal.observed_at)
        self._changed.add(job.subject.id)
        _advance(job.log, at, signal, value=None)
        for pattern in self.patterns:
            matches = list(pattern.regex.finditer(text))
            if not matches:
                continue
            last = matches[-1]  # a tqdm line holds every \r-separated update; the last is the newest
            groups = last.groupdict()
            raw = groups.get("step") or groups.get("pct")
            label = (groups.get("label") or "").strip()
            # "Epoch 1" and "Epoch 2" bars are one counter that starts over, not 2 counters.
            key = (pattern.name, re.sub(r"\d+", "#", label))
            counter = job.counters.get(key)
            if counter is None:
                if len(job.counters) >= MAX_COUNTERS:
                    oldest = min(job.counters, key=lambda k: job.counters[k].last_at or at)
                    del job.counters[oldest]
                counter = job.counters[key] = ProgressCounter()
            _advance(counter, at, signal, value=float(raw) if raw is not None else None)
            if (tag := _RAY_PREFIX.match(text)) is not None:
                _rank_progressed(job, RankProgress(int(tag["pid"]), tag["ip"], text.strip()[:300], at))
            return

    def _on_stacks(self, signal: Signal) -> None:
        suspicion = self._suspects.get(signal.subject.id)
        samples = signal.attrs.get(keys.SAMPLES)
        times = signal.attrs.get(keys.SAMPLED_AT) or []
        if suspicion is None or not isinstance(samples, list) or len(samples) < 2:
            return
        taken = parse_iso(times[0]) if times else signal.observed_at
        if taken is None or taken < suspicion.since:
            return  # taken before this suspicion began: it says nothing of it
        first, second = ranks_of(samples[-2]), ranks_of(samples[-1])
        if not second:
            return
        suspicion.call, suspicion.call_at = judge(first, second, previous=suspicion.call), taken
        logger.info("stacks of suspected job {}: {} ({})", signal.subject.id, suspicion.call.verdict,
                    suspicion.call.why)

    def _on_gpu(self, signal: Signal) -> None:
        job_id = _job_of(signal)
        if job_id is None or job_id not in self._jobs or signal.value is None:
            return
        job = self._jobs[job_id]
        value = signal.value * (100.0 if str(signal.attrs.get(keys.METRIC, "")).startswith("DCGM_FI_PROF") else 1.0)
        gpu = signal.subject.id
        previous = job.gpu_last.get(gpu)
        job.gpu_last[gpu] = value
        job.gpu_samples[gpu] = signal
        if previous is not None and abs(value - previous) >= self.gpu_activity_delta:
            if job.gpu_activity_at is None or signal.observed_at > job.gpu_activity_at:
                job.gpu_activity_at = signal.observed_at
                self._changed.add(job_id)

    # -- judging -----------------------------------------------------------------------------------

    def _judge(self, now: datetime) -> list[Finding]:
        findings: list[Finding] = []
        for job_id in list(self._jobs):
            job = self._jobs[job_id]
            episode = job.episode
            findings.extend(self._judge_job(job_id, job, now))
            if job_id not in self._jobs or job.episode != episode:
                self._changed.add(job_id)
        self._resubmitted(now)
        return findings

    def _judge_job(self, job_id: str, job: WatchedJob, now: datetime) -> list[Finding]:
        if job.seen_at is not None and now - job.seen_at > self.forget_after:
            self._end_episode(job)
            self._suspects.pop(job_id, None)
            del self._jobs[job_id]
            return []
        if job.status is None:
            # Ray has not said this job is RUNNING (yet, or since a restart): not judged, its episode kept
            return []
        if job.status != "RUNNING":
            if job.episode is not None:
                self._hung_ended.pop(job_id, None)  # ended again: now the most recent
                self._hung_ended[job_id] = HungEnded(fingerprint=job.episode, status=job.status, ended_at=now)
                self._hung_changed.add(job_id)
                while len(self._hung_ended) > _MAX_HUNG_ENDED:
                    oldest = next(iter(self._hung_ended))
                    del self._hung_ended[oldest]
                    self._hung_changed.add(oldest)
            self._end_episode(job)
            self._suspects.pop(job_id, None)
            # Finished jobs keep nothing; a resubmission under the same id starts afresh.
            job.counters.clear()
            job.log = ProgressCounter()
            job.gpu_last.clear()
            job.gpu_samples.clear()
            job.gpu_activity_at = None
            job.watch_from = None
            return []
        verdict = self._verdict(job, now)
        if verdict is not None and not verdict.suspected and job.episode is not None:
            self._recovered.append(Recovery(fingerprint=job.episode, reason=_resumed(verdict),
                                            detector=self.name, observed_at=now))
        if verdict is None or not verdict.suspected:
            self._suspects.pop(job_id, None)
            self._end_episode(job)
            return []
        suspicion = self._suspects.get(job_id)
        if suspicion is None or suspicion.last_at != verdict.last_at:
            suspicion = self._suspects[job_id] = _Suspicion(last_at=verdict.last_at, since=now)
        call = suspicion.call
        if job.episode is not None:
            confirmed_by = "stacks" if call is not None and call.verdict == "hung" else "silence"
        elif call is not None and call.verdict == "hung":
            confirmed_by = "stacks"
        elif not verdict.stalled:
            return []  # suspected: its stacks will tell
        elif call is not None and call.verdict == "working" and now - verdict.last_at < self.max_work:
            return []  # silent work, as its stacks show: no hang while it lasts
        else:
            confirmed_by = "silence"
        finding = self._finding(job, verdict, now, call, confirmed_by)
        job.episode = finding.fingerprint
        return [finding]

    def _resubmitted(self, now: datetime) -> None:
        """Hung jobs that ended (stopped to be resubmitted, or killed by the watchdog) whose resubmission runs."""
        for job_id, ended in list(self._hung_ended.items()):
            new = self._runs.resubmission_ran(job_id)
            if new is not None:
                del self._hung_ended[job_id]
                self._hung_changed.add(job_id)
                self._recovered.append(Recovery(
                    fingerprint=ended.fingerprint, detector=self.name, observed_at=now,
                    reason=f"job {job_id} ended {ended.status} while hung and was resubmitted as {new}, "
                    "which reached RUNNING"))

    def _verdict(self, job: WatchedJob, now: datetime) -> _Verdict | None:
        if job.log.last_at is None:
            return None  # no line of this job was ever collected: nothing to judge by
        if job.counters:
            counters = list(job.counters.values())
            mode = "steps"
        else:
            counters = [job.log]
            mode = LOG_GROWTH
        # Stalled only when every counter is overdue: a fast eval bar must not hide behind a slow step.
        due: list[tuple[datetime, float, ProgressCounter]] = []
        for counter in counters:
            assert counter.last_at is not None
            threshold = self._threshold(counter, mode)
            due.append((counter.last_at + timedelta(seconds=threshold), threshold, counter))
        # The counter due last decides; its interval and threshold are the ones the finding quotes.
        stall_at, threshold, governing = max(due, key=lambda d: d[0])
        suspect_at = max(c.last_at + timedelta(seconds=self._suspicion(c, mode)) for c in counters
                         if c.last_at is not None)
        for since in (job.gpu_activity_at, job.watch_from):
            if since is not None:
                stall_at = max(stall_at, since + timedelta(seconds=threshold))
                suspect_at = max(suspect_at, since + timedelta(seconds=self._suspicion(governing, mode)))
        latest = max(counters, key=lambda c: c.last_at or now)
        assert latest.last_at is not None
        return _Verdict(
            stalled=now > stall_at,
            suspected=now > min(suspect_at, stall_at),
            mode=mode,
            last_at=latest.last_at,
            last_line=latest.last_line,
            interval=governing.interval() if mode == "steps" else governing.longest,
            threshold=threshold,
            steps=sum(c.steps for c in counters),
        )

    def _threshold(self, counter: ProgressCounter, mode: str) -> float:
        if mode == LOG_GROWTH:
            return max(self.startup_grace_s, self.min_stall_s, self.factor * (counter.longest or 0.0))
        interval = counter.interval()
        if interval is None:
            # Too few steps to know the job's rhythm: wait as long as a job at the floor would be allowed.
            return self.min_stall_s * self.factor
        return max(self.min_stall_s, self.factor * interval)

    def _suspicion(self, counter: ProgressCounter, mode: str) -> float:
        """How long a silence makes a job suspect: max(suspect_min_s, factor x interval), never past the threshold.
        A job whose rhythm is not known yet (no steps, or too few) is suspected only at its threshold."""
        threshold = self._threshold(counter, mode)
        interval = counter.interval() if mode == "steps" else None
        if interval is None:
            return threshold
        return min(threshold, max(self.suspect_min_s, self.factor * interval))

    @staticmethod
    def _end_episode(job: WatchedJob) -> None:
        job.episode = None

    def _finding(self, job: WatchedJob, v: _Verdict, now: datetime, call: HangCall | None,
                 confirmed_by: str) -> Finding:
        stalled_s = (now - v.last_at).total_seconds()
        line = v.last_line
        what = "step line" if v.mode == "steps" else "log line"
        rhythm = (
            f"its step interval is about {v.interval:.1f} s" if v.interval is not None
            else "too few steps to know its interval"
        )
        summary = (
            f"Job {job.subject.id} is RUNNING but made no progress for {stalled_s:.0f} s "
            f"(threshold {v.threshold:.0f} s; {rhythm}); the last {what} was "
            f"{_quote(line.text if line else None)}. "
        )
        if confirmed_by == "stacks" and call is not None:
            summary += (f"Its ranks' stacks, sampled twice a few seconds apart, show a hang: "
                        f"{call.localization.sentence}.")
        else:
            summary += "A hung collective is likely: NCCL's watchdog only fires after its timeout."
            if call is not None:
                summary += f" Its ranks' stacks: {call.why}."
        rule = (
            f"max({self.min_stall_s:g} s, {self.factor:g} x interval)" if v.mode == "steps"
            else f"no step lines yet: max({self.startup_grace_s:g} s start-up grace, {self.factor:g} x longest silence)"
        )
        evidence = []
        if line is not None:
            text = (line.text or "").strip()
            text = text if len(text) <= 500 else text[:499] + "…"
            evidence.append(Evidence(source=line.source, text=text, line=line.line, at=v.last_at))
        evidence.append(
            Evidence(
                source="argus.stall",
                text=f"no progress for {stalled_s:.0f} s; step interval estimate "
                f"{'unknown' if v.interval is None else f'{v.interval:.2f} s'} from {v.steps} progress events; "
                f"stall threshold {v.threshold:.0f} s ({rule})",
                at=now,
                value=round(stalled_s, 1),
            )
        )
        if call is not None:
            evidence.extend(Evidence(source="py-spy", text=text, at=now) for text in call.localization.lines())
        first = _stopped_first(job, v)
        if first is not None and (call is None or not call.localization.culprits):
            # The stacks name no rank (none taken, or every rank waits): the rank whose progress stopped first may.
            summary += f" {first[1]}."
            evidence.append(Evidence(source=line.source if line else "argus.stall", text=first[1], at=first[0].at))
        for gpu, sample in sorted(job.gpu_samples.items())[:8]:
            evidence.append(
                Evidence(
                    source=sample.source,
                    text=f"{sample.attrs.get(keys.METRIC)} of GPU {sample.subject.name or gpu} = {sample.value:g}",
                    at=sample.observed_at,
                    value=sample.value,
                )
            )
        gpu_seen = bool(job.gpu_samples)
        confidence = {"steps": 0.8, LOG_GROWTH: 0.55}[v.mode] + (0.1 if gpu_seen else 0.0)
        if confirmed_by == "stacks":
            confidence = 0.95
        return Finding(
            category=Category.NCCL_HANG,
            reason=REASON,
            subject=job.subject,
            summary=summary,
            severity=Severity.CRITICAL,
            confidence=confidence,
            evidence=tuple(evidence),
            first_seen=v.last_at,
            detected_at=now,
            recommended_action=ACTION,
            # One fingerprint per job: the same job hung again after it resumed is the same fault coming back, which
            # the desk reopens (reopen_window_s) instead of opening another incident.
            fingerprint=fingerprint_of(Category.NCCL_HANG, job.subject, "stall"),
            attrs={
                "submission_id": job.subject.id,
                "mode": v.mode,
                "stalled_s": round(stalled_s, 1),
                "step_interval_s": None if v.interval is None else round(v.interval, 3),
                "threshold_s": round(v.threshold, 1),
                "last_progress_at": v.last_at.isoformat(),
                "last_progress_line": line.text if line is not None else None,
                "last_progress_source": line.source if line is not None else None,
                "last_progress_line_no": line.line if line is not None else None,
                "gpus": sorted(job.gpu_samples),
                "confirmed_by": confirmed_by,
                "stacks_verdict": call.verdict if call is not None else None,
                "localization": call.localization.as_json() if call is not None else None,
                "rank_progress": [{"pid": r.pid, "node": r.node, "line": r.text, "at": r.at.isoformat()}
                                  for r in sorted(job.rank_progress.values(), key=lambda r: r.at)],
                "stopped_first": {"pid": first[0].pid, "node": first[0].node} if first is not None else None,
            },
        )


# Ray's tag on a line an actor or task printed: "(Rank pid=4242, ip=10.0.0.7) step 11 ...".
_RAY_PREFIX = re.compile(r"^\s*\((?:[\w.<>-]+ )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)")
_MAX_RANKS = 64


def _rank_progressed(job: WatchedJob, progress: RankProgress) -> None:
    before = job.rank_progress.get(progress.pid)
    if before is None and len(job.rank_progress) >= _MAX_RANKS:
        oldest = min(job.rank_progress.values(), key=lambda r: r.at)
        del job.rank_progress[oldest.pid]
    job.rank_progress[progress.pid] = replace(progress, count=before.count + 1) if before else progress


def _stopped_first(job: WatchedJob, v: _Verdict) -> tuple[RankProgress, str] | None:
    """The one rank whose progress lines stopped well before every other's (by more than 2 step intervals and
    5 s), with the sentence that says so; None when the ranks stopped together or only one rank prints."""
    # Only ranks that print progress as they go (3 lines or more): a rank that printed once at start-up and then
    # let rank 0 speak for it did not stop first.
    ranks = sorted((r for r in job.rank_progress.values() if r.count >= 3), key=lambda r: r.at)
    if len(ranks) < 2:
        return None
    first, then = ranks[0], ranks[1]
    gap = (then.at - first.at).total_seconds()
    if gap <= max(5.0, 2 * (v.interval or 0.0)) or (v.last_at - then.at).total_seconds() > gap:
        return None
    where = f" (node {first.node})" if first.node else ""
    return first, (f"pid {first.pid}{where} printed its last progress {gap:.0f} s before any other rank: "
                   f"{_quote(_RAY_PREFIX.sub('', first.text))}")


def _advance(counter: ProgressCounter, at: datetime, line: Signal, *, value: float | None) -> None:
    """Record one line on a counter; a valueless counter (the log itself) advances on every line."""
    high = counter.high
    if value is not None and high is not None and (value == high or high / 2 < value < high):
        return  # the same or an earlier step, e.g. printed by another rank: no progress
    if counter.last_at is None:
        counter.last_at = at
    elif at > counter.last_at:
        counter.batch_gap = (at - counter.last_at).total_seconds()
        counter.batch_n = 1
        counter.longest = max(counter.longest or 0.0, counter.batch_gap)
        counter.gaps.append(counter.batch_gap)
        counter.last_at = at
    elif counter.batch_gap is not None:
        # Another step read in the same poll: the batch's gap is shared among its k steps (k gaps of g/k).
        counter.batch_n += 1
        share = counter.batch_gap / counter.batch_n
        for i in range(1, min(counter.batch_n - 1, len(counter.gaps)) + 1):
            counter.gaps[-i] = share
        counter.gaps.append(share)
    counter.high = value
    counter.last_line = line
    counter.steps += 1


def _job_of(signal: Signal) -> str | None:
    for key in _JOB_LABELS:
        value = signal.attrs.get(key)
        if isinstance(value, str) and value:
            return value
    labels = signal.attrs.get(keys.LABELS)
    if isinstance(labels, Mapping):
        for key in _JOB_LABELS:
            value = labels.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def _quote(text: str | None, limit: int = 200) -> str:
    if not text:
        return "(none)"
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _resumed(v: _Verdict) -> str:
    line = v.last_line
    what = "steps" if v.mode == "steps" else "log lines"
    text = (line.text or "").strip()[:200] if line is not None else ""
    return f"progress resumed ({what}) at {v.last_at.isoformat()}" + (f": {text}" if text else "")
