"""Evidence bundles: bounded by their budget at any log size, the first failure across logs, secrets gone
before anything is rendered, and line times read from the common log formats."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from core.line_time import line_time, times_of
from core.types import Category, Finding, Incident
from detectors.engine import load_rules
from rca.evidence import EvidenceBuilder, LogSource, read_tail, tokens
from rca.redact import Redactor
from tests.support import job, make_finding, make_incident

RULES = load_rules([])
CASES = Path(__file__).parents[1] / "rca_cases"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
SECRET_KEY = "wandb_api_key=0123456789abcdef0123456789abcdef01234567"
SECRET_BEARER = "Authorization: Bearer sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def incident(category: Category = Category.UNKNOWN, **attrs: Any) -> Incident:
    return make_incident(category=category, subject=job("grpo-1"), summary="job grpo-1 failed",
                         detected_at=T0 + timedelta(seconds=20), attrs=attrs)


def finding(reason: str = "JobFailed", category: Category = Category.UNKNOWN, text: str = "job failed") -> Finding:
    return make_finding(text, category=category, reason=reason, subject=job("grpo-1"))


def case_log(name: str) -> LogSource:
    [path] = sorted((CASES / name).glob("*.log"))[:1]
    return read_tail(path)


def builder(budget: int = 6000) -> EvidenceBuilder:
    return EvidenceBuilder(RULES, Redactor(), token_budget=budget)


def training_log(n: int, *, failure: str, at: int | None = None) -> list[str]:
    lines = [f"2026-05-01 11:{i // 60 % 60:02d}:{i % 60:02d},000 INFO step:{i} - actor/loss:0.{i % 97:02d}"
             for i in range(n)]
    lines.insert(at if at is not None else n, f"2026-05-01 12:00:00,000 ERROR {failure}")
    return lines


def test_the_oom_decides_and_its_echoes_do_not(tmp_path: Path) -> None:
    log = case_log("07_reused_composed_oom_then_watchdog_timeouts")
    bundle, verdict = builder().build(incident(), [finding()], [log])
    assert verdict.category is Category.GPU_OOM
    assert bundle.first_failure is not None and "out of memory" in bundle.first_failure.text.lower()
    assert bundle.windows and bundle.windows[0].focus_line == bundle.first_failure.line
    assert bundle.evidence[0].ref == 1 and bundle.evidence[0].why.startswith("rule ")


@pytest.mark.parametrize("budget", [500, 1000, 3000, 6000])
def test_a_huge_log_stays_within_the_budget(budget: int) -> None:
    lines = training_log(100_000, failure="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                         at=75_000)
    lines[75_001:75_001] = ["x" * 100_000]  # a monster line right after the failure
    bundle, verdict = builder(budget).build(incident(), [finding()], [LogSource("rank0.log", lines)])
    assert verdict.category is Category.GPU_OOM
    assert bundle.tokens_used <= budget
    assert tokens(bundle.model_dump_json()) < budget * 2  # field names and JSON punctuation on top of the text
    assert all(len(e.text) <= 400 for e in bundle.evidence)
    assert all(len(line) <= 400 for w in bundle.windows for line in w.lines)
    if budget == 500:
        assert bundle.omitted, "a small budget must say what it left out"


def test_last_progress_line_before_the_failure() -> None:
    lines = training_log(50, failure="RuntimeError: NCCL error: unhandled system error")
    bundle, _ = builder().build(incident(), [finding()], [LogSource("driver.log", lines)])
    assert bundle.last_progress is not None and "step:49 " in bundle.last_progress.text
    assert bundle.last_progress.line == 50


def test_first_failure_in_time_across_ranks() -> None:
    host = LogSource("rank0.log", ["2026-05-01 12:00:09,000 ERROR Memory on the node was low at the time the "
                                   "OOM killer ran: Task was killed due to the node running low on memory."])
    gpu = LogSource("rank1.log", ["2026-05-01 12:00:03,000 ERROR torch.OutOfMemoryError: CUDA out of memory. "
                                  "Tried to allocate 20.00 MiB"])
    nccl = LogSource("rank2.log", ["2026-05-01 11:59:59,000 [Rank 2] Watchdog caught collective operation timeout: "
                                   "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds before "
                                   "timing out."])
    bundle, verdict = builder().build(incident(), [finding()], [nccl, host, gpu])
    assert verdict.category is Category.GPU_OOM and bundle.decided_by == "rank1.log"
    assert "Decided across 3 logs" in verdict.summary
    assert bundle.first_failure.at == datetime(2026, 5, 1, 12, 0, 3, tzinfo=timezone.utc)


def test_without_logs_the_findings_evidence_is_classified() -> None:
    f = finding("JobFailed", text="RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB")
    bundle, verdict = builder().build(incident(), [f], [])
    assert verdict.category is Category.GPU_OOM and bundle.windows == []


def test_secrets_in_logs_findings_and_specs_are_redacted() -> None:
    lines = training_log(30, failure="torch.OutOfMemoryError: CUDA out of memory.", at=25)
    lines[24] = f"2026-05-01 11:59:59,000 INFO {SECRET_KEY}"
    lines[26] = f"2026-05-01 12:00:00,100 DEBUG request headers {SECRET_BEARER}"
    f = finding(text=f"job failed; env had {SECRET_KEY}")
    job = {"spec": {"entrypoint": "python train.py", "env": {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef"}}}
    bundle, _ = builder().build(incident(), [f], [LogSource("driver.log", lines)], job=job)
    text = bundle.model_dump_json()
    for secret in ("0123456789abcdef0123456789abcdef", "sk-proj-AbCdEf"):
        assert secret not in text
    assert bundle.redactions >= 3


def test_read_tail_of_a_big_file_reads_only_the_end(tmp_path: Path) -> None:
    path = tmp_path / "driver.log"
    path.write_text("".join(f"line {i}\n" for i in range(400_000)))
    source = read_tail(path, max_bytes=64 * 1024)
    assert source.lines[-1] == "line 399999" and len(source.lines) < 10_000
    assert "last 64 KiB" in source.name
    missing = read_tail(tmp_path / "absent.log")
    assert missing.lines == () and "unreadable" in missing.name


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2024-05-01 12:34:56,789 INFO x", datetime(2024, 5, 1, 12, 34, 56, 789000, tzinfo=timezone.utc)),
        ("[2024-05-01T12:34:56.5Z] x", datetime(2024, 5, 1, 12, 34, 56, 500000, tzinfo=timezone.utc)),
        ("(pid=1) 2024-05-01 12:34:56+08:00 x",
         datetime(2024, 5, 1, 12, 34, 56, tzinfo=timezone(timedelta(hours=8)))),
        ("[2024-05-01 12:34:56,100 I 123 456] raylet", datetime(2024, 5, 1, 12, 34, 56, 100000, tzinfo=timezone.utc)),
        ("I0501 12:34:56.000100 123 x.cc:1] glog", datetime(2024, 5, 1, 12, 34, 56, 100, tzinfo=timezone.utc)),
        ("May  1 12:34:56 host kernel: Out of memory", datetime(2024, 5, 1, 12, 34, 56, tzinfo=timezone.utc)),
        ("2024-13-45 12:00:00 not a date", None),
        ("step 12 loss 0.5", None),
    ],
)
def test_line_times(line: str, expected: datetime | None) -> None:
    assert line_time(line, year=2024) == expected


def test_undated_lines_take_the_time_of_the_line_above() -> None:
    lines = ["no time yet", "2024-05-01 12:00:00 Traceback (most recent call last):", '  File "x.py"', "Error"]
    times = times_of(lines)
    assert times[0] is None and times[1] == times[2] == times[3]
