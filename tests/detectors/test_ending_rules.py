"""Ending rules (`tier: ending`): read only on the last non-blank line of a log that has ended, never line by line.

The benchmark lines below are nccl-tests' own output, as posted in https://github.com/NVIDIA/nccl-tests/issues/117
(tests/rca_cases/291_*): all_reduce_perf printed its table header and then nothing.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from core.errors import RuleError
from core.types import Category
from detectors.engine import RuleSet, RuleTier, last_line, load_rules
from rca.analyze import analyze_lines, analyze_stream
from rca.classify import GENERIC_CAP
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.offline import report_logs
from rca.redact import Redactor

RULES = load_rules()

STUCK = [
    "m2@4090-01-R02:~/nccl-tests$ ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 2",
    "# nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 ",
    "#",
    "# Using devices",
    "#   Rank  0 Pid   4479 on 4090-01-R02 device  0 [0x81] NVIDIA GeForce RTX 4090",
    "#   Rank  1 Pid   4479 on 4090-01-R02 device  1 [0xa1] NVIDIA GeForce RTX 4090",
    "#",
    "#                                                       out-of-place                       in-place          ",
    "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
    "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
]
# the rows and the summary nccl-tests prints when the sweep completes
ROW = "           8             2     float     sum    11.28    0.00    0.00  0e+00    10.93    0.00    0.00  0e+00"
DONE = [ROW, "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0.00124 ", "#"]


def analyzed(lines: list[str]) -> dict:
    by_lines = analyze_lines("all_reduce_perf.log", lines, RULES)
    by_stream = analyze_stream("all_reduce_perf.log", io.BytesIO(("\n".join(lines) + "\n").encode()), RULES)
    assert by_stream == by_lines  # the fast path keeps the last line as the line reader does
    return by_lines


def test_a_benchmark_that_stops_after_its_header_is_a_hang_at_a_low_confidence() -> None:
    result = analyzed(STUCK)
    assert result["category"] == "nccl_hang"
    assert result["confidence"] <= GENERIC_CAP
    assert result["evidence"][0] == {"line": len(STUCK), "text": STUCK[-1].strip()}
    assert "Avg bus bandwidth" in result["summary"]


@pytest.mark.parametrize("tail", [[ROW], STUCK[4:5], STUCK[8:9]])
def test_the_log_stopping_after_a_row_or_the_rank_list_is_a_hang_too(tail: list[str]) -> None:
    assert analyzed(STUCK[:4] + tail)["category"] == "nccl_hang"


def test_the_same_lines_mid_log_are_no_failure() -> None:
    assert analyzed(STUCK + DONE)["category"] == "unknown"
    # and no line-by-line reading ever sees an ending rule
    assert list(RULES.scan(STUCK, source="x")) == []


@pytest.mark.parametrize("after", [["", "   ", ""], ["\r"]])
def test_blank_lines_after_the_last_word_do_not_hide_it(after: list[str]) -> None:
    result = analyzed(STUCK + after)
    assert result["category"] == "nccl_hang" and result["evidence"][0]["line"] == len(STUCK)


def test_an_error_earlier_in_the_log_decides_over_where_it_ended() -> None:
    lines = [*STUCK[:4], "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
             "unhandled system error, NCCL version 2.14.3", *STUCK[4:]]
    assert analyzed(lines)["category"] == "nccl_error"


def test_a_stream_whose_last_line_is_longer_than_what_is_kept_is_read_without_failing() -> None:
    lines = [*STUCK, "x" * 300_000]
    assert analyzed(lines)["category"] == "unknown"
    assert analyze_stream("-", io.BytesIO(b""), RULES)["category"] == "unknown"
    assert analyze_stream("-", io.BytesIO(b"\n\n \n"), RULES)["category"] == "unknown"


def test_an_incident_report_reads_where_its_logs_ended() -> None:
    report = report_logs(RcaEngine(RULES, Redactor), "bench", [LogSource(name="all_reduce_perf.log", lines=STUCK)],
                         use_llm=False)
    assert report.category is Category.NCCL_HANG
    assert report.data["rule"] == "LogEndsInCollectiveBenchmark"


def test_last_line_skips_blank_lines_and_counts_from_the_first_line_number() -> None:
    assert last_line(["a", "b", " ", ""], first_line_no=10) == (11, "b")
    assert last_line(["", " "]) is None
    assert last_line([]) is None


def test_the_ending_tier_is_kept_apart_and_carried_by_the_rule_sets_views(tmp_path: Path) -> None:
    path = tmp_path / "end.yaml"
    path.write_text(textwrap.dedent("""\
        source: job-logs
        rules:
          - {reason: EndsWaiting, category: nccl_hang, tier: ending, type: permanent, pattern: 'waiting for peers'}
          - {reason: Boom, category: user_error, type: permanent, pattern: 'boom'}
    """))
    rules = RuleSet.load([path])
    assert [r.reason for r in rules] == ["Boom"] and [r.reason for r in rules.endings] == ["EndsWaiting"]
    assert rules.get("EndsWaiting") is not None and rules.get("EndsWaiting").tier is RuleTier.ENDING
    assert [r.reason for r in rules.for_source("job-logs").endings] == ["EndsWaiting"]
    assert rules.for_source("raylet").endings == ()
    assert rules.signatures().endings == ()  # live detection reads running jobs, which have not ended
    assert [m.rule.reason for m in rules.ending((7, "rank 3 waiting for peers"), "x")] == ["EndsWaiting"]
    assert rules.ending(None, "x") == []
    with pytest.raises(RuleError, match="duplicate rule reason 'EndsWaiting'"):
        RuleSet([*rules.endings, *rules.endings])


# NCCL's own INFO line while a peer refuses its connect (misc/socket.cc prints it every 1000th try), as a failed
# job's log ends on it (tests/rca_cases/432_* ends the same way) and as a job that got through prints it mid-log.
RETRY = "node-3:4024:4055 [0] NCCL INFO Call to connect returned Connection refused, retrying"
SETUP = [
    "node-3:4024:4024 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>",
    "node-3:4024:4024 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.3<0>",
]


def test_a_log_that_ends_retrying_a_refused_connect_is_a_communication_failure() -> None:
    result = analyzed([*SETUP, RETRY, RETRY])
    assert result["category"] == "nccl_error" and result["confidence"] <= GENERIC_CAP
    assert result["evidence"][0] == {"line": 4, "text": RETRY}


def test_a_connect_retried_and_then_made_is_no_failure() -> None:
    assert analyzed([*SETUP, RETRY, "node-3:4024:4055 [0] NCCL INFO Connected all rings", "step 1 loss 2.3"])[
        "category"] == "unknown"
