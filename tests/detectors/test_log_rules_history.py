"""LogRuleDetector on history and on jobs that went on to succeed: a line marked as history opens nothing, a new
line after it opens the one finding; a job's error line is closed at warning when the job SUCCEEDED.

Rules from a real YAML file (the same ones as test_log_rules.py); the last test runs the real JobLogsCollector over
a real file whose mtime is two days old.
"""

from __future__ import annotations

import os
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.engine import RuleSet
from detectors.log_rules import LogRuleDetector
from tests.detectors.test_log_rules import JOB, NOW, RULES, line

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
WRITTEN = NOW - timedelta(days=2)


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(RULES))
    return RuleSet.load([path])


def backlog(text: str, n: int, *, history: bool, written: datetime = WRITTEN, **kwargs) -> Signal:
    """A line as a collector gives it from a file's backlog: dated, and marked as history or not."""
    signal = line(text, n, **kwargs)
    attrs = {**signal.attrs, keys.LINE_TIME: written.isoformat(), keys.HISTORY: history}
    return signal.model_copy(update={"attrs": attrs})


def job_state(status: str, subject: Subject = JOB) -> Signal:
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", subject=subject, observed_at=NOW,
                  attrs={keys.STATUS: status, keys.SUBMISSION_ID: subject.id})


def test_a_history_line_opens_nothing_and_a_new_line_after_it_opens_one_finding(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    assert detector.detect([backlog("step 1", 1, history=True), backlog(OOM, 2, history=True)]) == []

    [finding] = detector.detect([line("step 2", 3), line(OOM, 4)])
    assert finding.category is Category.GPU_OOM and finding.severity is Severity.CRITICAL
    assert finding.attrs["line"] == 4
    # the history lines before it are context, quoted as evidence of what led up to it
    assert [e.line for e in finding.evidence] == [1, 2, 3, 4]
    assert detector.detect([line(OOM, 5)]) == []  # one finding per job and category, as before


def test_a_temporary_match_in_history_is_not_quoted_as_an_earlier_warning(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, context_lines=0, clock=lambda: NOW)
    detector.detect([backlog("memory usage is high on node 3", 1, history=True)])
    [finding] = detector.detect([line("Killed process 4242 (python)", 9)])
    assert finding.attrs["temporary_before"] == []


def test_a_dated_line_that_is_news_opens_a_finding_first_seen_when_it_was_written(rules: RuleSet) -> None:
    written = NOW - timedelta(minutes=3)
    [finding] = LogRuleDetector(rules, clock=lambda: NOW).detect([backlog(OOM, 7, history=False, written=written)])
    assert finding.first_seen == written and finding.evidence[-1].at == written
    assert finding.detected_at == NOW


def test_a_job_that_succeeded_after_its_error_line_closes_the_finding_at_warning(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    [finding] = detector.detect([job_state("RUNNING"), line(OOM, 12, source="/s/jobs/raysubmit_A/logs/train.log")])
    assert finding.severity is Severity.CRITICAL and detector.recoveries() == []

    detector.detect([job_state("RUNNING")])
    assert detector.recoveries() == []
    detector.detect([job_state("SUCCEEDED")])
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == finding.fingerprint and recovery.severity is Severity.WARNING
    assert recovery.detector == "log_rules"
    assert recovery.reason == ("job raysubmit_A SUCCEEDED: the error at /s/jobs/raysubmit_A/logs/train.log:12 did "
                               "not end it")
    detector.detect([job_state("SUCCEEDED")])
    assert detector.recoveries() == []  # told once


@pytest.mark.parametrize("status", ["FAILED", "STOPPED", "PENDING"])
def test_a_job_that_did_not_succeed_keeps_its_finding_open(rules: RuleSet, status: str) -> None:
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    detector.detect([job_state("RUNNING"), line(OOM, 12)])
    detector.detect([job_state(status)])
    assert detector.recoveries() == []


def test_an_error_line_of_a_job_already_succeeded_is_a_warning_closed_at_once(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    [finding] = detector.detect([job_state("SUCCEEDED"), line(OOM, 3)])
    assert finding.severity is Severity.WARNING and "raysubmit_A went on to succeed" in finding.summary
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == finding.fingerprint and recovery.severity is Severity.WARNING


@pytest.mark.parametrize("status", ["FAILED", "STOPPED"])
def test_an_error_line_read_after_its_job_failed_is_marked_as_late(rules: RuleSet, status: str) -> None:
    """Ray lists a short job's driver log only after it ended: the line is the failure already told (the job's
    FAILED message quotes it), marked so the incident desk files it there; it waits for no success."""
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    detector.detect([job_state(status)])
    [finding] = detector.detect([line(OOM, 1)])
    assert finding.attrs[keys.JOB_ENDED] == status and finding.severity is Severity.CRITICAL
    assert detector.detect([job_state("SUCCEEDED")]) == [] and detector.recoveries() == []
    [running] = LogRuleDetector(rules, clock=lambda: NOW).detect([job_state("RUNNING"), line(OOM, 1)])
    assert keys.JOB_ENDED not in running.attrs


def test_only_the_job_that_succeeded_is_closed(rules: RuleSet) -> None:
    other = Subject(kind=SubjectKind.JOB, id="raysubmit_B")
    node = Subject(kind=SubjectKind.NODE, id="n" * 56, name="10.0.0.7")
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    findings = detector.detect([line(OOM, 1), line(OOM, 1, subject=other, source="/s/b.log"),
                                line(OOM, 1, subject=node, stream="worker", source="ray://10.0.0.7/w.out")])
    assert len(findings) == 3
    detector.detect([job_state("SUCCEEDED", other)])
    [recovery] = detector.recoveries()
    assert recovery.fingerprint == next(f.fingerprint for f in findings if f.subject == other)


def test_a_new_run_under_the_same_id_is_news_again(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, clock=lambda: NOW)
    detector.detect([job_state("RUNNING"), line(OOM, 1)])
    detector.detect([job_state("SUCCEEDED")])
    detector.recoveries()
    [again] = detector.detect([job_state("RUNNING"), line(OOM, 40)])
    assert again.severity is Severity.CRITICAL


def test_the_real_collector_first_start_on_an_old_log(rules: RuleSet, tmp_path: Path) -> None:
    logs = tmp_path / "jobs" / "raysubmit_A" / "logs"
    logs.mkdir(parents=True)
    log = logs / "train.log"
    two_days_ago = datetime.now(timezone.utc) - timedelta(days=2)
    log.write_text(f"{two_days_ago:%Y-%m-%d %H:%M:%S},000 ERROR {OOM}\n")
    os.utime(log, (two_days_ago.timestamp(), two_days_ago.timestamp()))
    reader = JobLogsCollector(tmp_path, OffsetStore(tmp_path / "offsets.json"), log_zone=timezone.utc)
    detector = LogRuleDetector(rules)
    assert detector.detect(reader.collect()) == []
    with open(log, "a") as f:
        f.write(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S},000 ERROR {OOM}\n")
    [finding] = detector.detect(reader.collect())
    assert finding.attrs["line"] == 2 and finding.subject.id == "raysubmit_A"
