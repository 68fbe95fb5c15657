"""The log-line timestamp parser (core.line_time): the prefixes real training and Ray logs write, hostile lines, and
the dating of a file's lines that tells history from news (`written_times`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from core.line_time import line_time, times_of, written_times
from tests.cost import assert_bounded

UTC = timezone.utc
CST = timezone(timedelta(hours=8))
WEST_0530 = timezone(-timedelta(hours=5, minutes=30))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # ISO 8601 with a zone, as loguru, vLLM and JSON loggers write it
        ("2026-11-23T10:00:01.123Z train step 3", datetime(2026, 11, 23, 10, 0, 1, 123000, tzinfo=UTC)),
        ("[2026-11-23T10:00:01.123456789+08:00] x", datetime(2026, 11, 23, 10, 0, 1, 123456, tzinfo=CST)),
        ("2026-11-23T10:00:01-0530 x", datetime(2026, 11, 23, 10, 0, 1, tzinfo=WEST_0530)),
        # Python logging's default asctime, with a comma
        ("2026-11-23 10:00:01,123 - trainer - ERROR - boom", datetime(2026, 11, 23, 10, 0, 1, 123000, tzinfo=CST)),
        # Ray's Python loggers: tab after the stamp
        ("2026-11-23 10:00:01,123\tINFO worker.py:1821 -- Connecting", datetime(2026, 11, 23, 10, 0, 1, 123000,
                                                                                 tzinfo=CST)),
        # Ray's C++ (raylet, gcs_server): glog-like, with the date
        ("[2026-11-23 10:00:01,123 I 123 456] (raylet) node_manager.cc:1:", datetime(2026, 11, 23, 10, 0, 1, 123000,
                                                                                      tzinfo=CST)),
        # a worker's stdout line as the driver log shows it, the stamp after Ray's prefix
        ("(TaskRunner pid=4242) 2026-11-23 10:00:01 step:12 - loss:0.5", datetime(2026, 11, 23, 10, 0, 1, tzinfo=CST)),
        # glog without a year (PyTorch c10, NCCL's ProcessGroup): the year comes from the caller
        ("I1123 10:00:01.123456 1234 ProcessGroupNCCL.cpp:1] x", datetime(2026, 11, 23, 10, 0, 1, 123456, tzinfo=CST)),
        ("[rank3]:[E1123 10:00:01.000000001 ProcessGroupNCCL.cpp:616] Watchdog", datetime(2026, 11, 23, 10, 0, 1,
                                                                                          tzinfo=CST)),
        # syslog / dmesg -T
        ("Nov 23 10:00:01 gpu-7 kernel: NVRM: Xid 79", datetime(2026, 11, 23, 10, 0, 1, tzinfo=CST)),
        # looks like a date and is not one
        ("2026-02-30 10:00:01 no such day", None),
        ("2026-11-23 25:61:00 no such time", None),
        ("I1332 10:00:01.1 month 13", None),
        # no stamp at all
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None),
        ("step 12 loss 0.5 lr 1e-5", None),
        ("", None),
        ("1999-01-01 00:00:00 a year this parser does not take as a log stamp", None),
    ],
)
def test_common_prefixes(line: str, expected: datetime | None) -> None:
    assert line_time(line, year=2026, tz=CST) == expected


def test_a_stamp_without_a_zone_is_read_in_the_given_zone_and_utc_by_default() -> None:
    assert line_time("2026-11-23 10:00:01 x") == datetime(2026, 11, 23, 10, 0, 1, tzinfo=UTC)
    assert line_time("2026-11-23 10:00:01 x", tz=CST) == datetime(2026, 11, 23, 2, 0, 1, tzinfo=UTC)


def test_year_less_formats_need_a_year() -> None:
    assert line_time("I1123 10:00:01.5 x") is None
    assert line_time("Nov 23 10:00:01 host kernel: x") is None


@pytest.mark.parametrize(
    "line",
    [
        "x" * 10_000_000 + " 2026-11-23 10:00:01",  # 10 MB, the stamp far past the head
        "\x00\xff\ufffd" * 1000,
        "2026-11-23" * 5000,
        "I" * 200 + "1123 10:00:01",
        "[" * 100_000,
        "9" * 1_000_000,
        "2026-11-23 10:00:" + "1" * 1_000_000,
    ],
)
def test_hostile_lines_give_no_time_and_cost_no_more_than_their_head(line: str) -> None:
    # a head of 120 characters costs microseconds; reading 10 MB would cost far more than the bound
    assert assert_bounded(lambda given: line_time(given, year=2026), line, most_cpu_s=0.05) is None


def test_a_stamp_after_the_first_120_characters_is_not_read() -> None:
    assert line_time("x" * 200 + " 2026-11-23 10:00:01") is None
    assert line_time("x" * 80 + " 2026-11-23 10:00:01") is not None


def test_undated_lines_belong_to_the_dated_line_above() -> None:
    lines = ["no time yet", "2026-11-23 10:00:01 Traceback (most recent call last):", '  File "train.py"', "OOM"]
    assert times_of(lines)[0] is None
    assert times_of(lines)[1] == times_of(lines)[3] == datetime(2026, 11, 23, 10, 0, 1, tzinfo=UTC)


# -- written_times: how old each line of a file is -------------------------------------------------------------

MODIFIED = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def test_lines_without_a_stamp_take_the_line_above_else_the_file_mtime() -> None:
    lines = ["loading shards", "2026-11-21 09:00:00 ERROR Traceback", "torch.OutOfMemoryError: CUDA out of memory"]
    times, last = written_times(lines, modified_at=MODIFIED, tz=UTC)
    old = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
    assert times == [MODIFIED, old, old] and last == old


def test_the_carried_time_dates_the_head_of_the_next_part_of_a_file() -> None:
    carried = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
    times, last = written_times(["  File \"train.py\", line 3", "OOM"], modified_at=MODIFIED, carried=carried)
    assert times == [carried, carried] and last == carried
    assert written_times([], modified_at=MODIFIED, carried=carried) == ([], carried)


def test_no_line_is_newer_than_the_file() -> None:
    # a node whose stamps are in another zone than assumed: its lines land hours "in the future"
    times, last = written_times(["2026-11-23 19:59:00 step 3"], modified_at=MODIFIED, tz=UTC)
    assert times == [MODIFIED] and last == MODIFIED


def test_a_year_less_stamp_after_the_file_belongs_to_the_year_before() -> None:
    new_year = datetime(2027, 1, 1, 0, 5, tzinfo=UTC)
    times, _ = written_times(["I1231 23:59:58.000000 1 x.cc:1] last step of the year", "I0101 00:04:00.0 1 x] y"],
                             modified_at=new_year, tz=UTC)
    assert times == [datetime(2026, 12, 31, 23, 59, 58, tzinfo=UTC), datetime(2027, 1, 1, 0, 4, tzinfo=UTC)]


def test_a_year_less_stamp_takes_the_year_of_the_file_in_its_zone() -> None:
    # 23:30 UTC on Dec 31 is already Jan 1 in UTC+8: the stamps there are written in 2027
    modified = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)
    times, _ = written_times(["I0101 07:00:00.0 1 x] y"], modified_at=modified, tz=CST)
    assert times == [datetime(2027, 1, 1, 7, 0, tzinfo=CST)]
