"""History is not news, at the collectors: what a log file held when it was first seen is dated, and the lines
written longer than the history window ago are marked as history; what is written later is news.

Real files in a tmp folder, their mtimes set with os.utime, the offsets file on disk, and the real clock: the
window is judged against the time the lines and files really carry.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path

import pytest

from collectors.history import HistoryMarker, saved_time
from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.errors import ConfigError
from core.types import Signal
from tests.support import read_as_the_loop_does

UTC = timezone.utc
CST = timezone(timedelta(hours=8))
SID = "raysubmit_old"


def stamp(ago_s: float, zone: tzinfo = UTC) -> str:
    """Python logging's asctime for a moment `ago_s` seconds ago, on a wall clock in `zone`."""
    return f"{(datetime.now(UTC) - timedelta(seconds=ago_s)).astimezone(zone):%Y-%m-%d %H:%M:%S},123"


def make_log(root: Path, text: str, *, mtime_ago_s: float | None = None, name: str = "train.log") -> Path:
    logs = root / "jobs" / SID / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / name
    path.write_text(text)
    if mtime_ago_s is not None:
        when = datetime.now(UTC).timestamp() - mtime_ago_s
        os.utime(path, (when, when))
    return path


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def collector(root: Path, **kwargs) -> JobLogsCollector:
    return JobLogsCollector(root, OffsetStore(root / "state" / "offsets.json"), log_zone=UTC, **kwargs)


def marks(signals: list[Signal]) -> list[tuple[str | None, bool | None]]:
    return [(s.text, s.attrs.get(keys.HISTORY)) for s in signals]


TWO_DAYS = 2 * 86400


def test_old_lines_of_a_file_seen_first_are_history_and_lines_written_later_are_news(tmp_path: Path) -> None:
    log = make_log(tmp_path, f"{stamp(TWO_DAYS + 60)} INFO step 1\n"
                             f"{stamp(TWO_DAYS)} ERROR torch.OutOfMemoryError: CUDA out of memory.\n",
                   mtime_ago_s=TWO_DAYS)
    reader = collector(tmp_path)
    first = reader.collect()
    assert [h for _, h in marks(first)] == [True, True]
    written = datetime.fromisoformat(first[1].attrs[keys.LINE_TIME])
    assert abs((datetime.now(UTC) - written).total_seconds() - TWO_DAYS) < 60

    append(log, f"{stamp(0)} ERROR torch.OutOfMemoryError: CUDA out of memory.\n")
    [new] = reader.collect()
    assert keys.HISTORY not in new.attrs and keys.LINE_TIME not in new.attrs  # news is not dated: it costs nothing


def test_recent_lines_of_a_file_seen_first_are_dated_but_news(tmp_path: Path) -> None:
    make_log(tmp_path, f"{stamp(20 * 60)} old enough\n{stamp(60)} a minute ago\n")
    signals = collector(tmp_path, history_window_s=900).collect()
    assert marks(signals) == [(signals[0].text, True), (signals[1].text, False)]
    assert all(keys.LINE_TIME in s.attrs for s in signals)


def test_lines_without_a_stamp_are_as_old_as_the_file(tmp_path: Path) -> None:
    make_log(tmp_path, "torch.OutOfMemoryError: CUDA out of memory.\n", mtime_ago_s=TWO_DAYS, name="old.log")
    make_log(tmp_path, "torch.OutOfMemoryError: CUDA out of memory.\n", name="live.log")
    by_file = {Path(s.source).name: s.attrs[keys.HISTORY] for s in collector(tmp_path).collect()}
    assert by_file == {"old.log": True, "live.log": False}


def test_a_traceback_is_as_old_as_its_stamped_header_even_in_a_file_written_now(tmp_path: Path) -> None:
    make_log(tmp_path, f"{stamp(TWO_DAYS)} ERROR Traceback (most recent call last):\n"
                       '  File "train.py", line 3, in <module>\n'
                       "torch.OutOfMemoryError: CUDA out of memory.\n"
                       f"{stamp(5)} INFO resumed from checkpoint\n")
    assert [h for _, h in marks(collector(tmp_path).collect())] == [True, True, True, False]


def test_a_stamp_later_than_the_file_is_capped_at_its_mtime(tmp_path: Path) -> None:
    # the file was last written two days ago, its stamps (another zone, a wrong clock) say an hour from now
    make_log(tmp_path, f"{stamp(-3600)} ERROR CUDA out of memory\n", mtime_ago_s=TWO_DAYS)
    [signal] = collector(tmp_path).collect()
    assert signal.attrs[keys.HISTORY] is True


def test_stamps_without_a_zone_are_read_in_the_zone_the_cluster_writes_them(tmp_path: Path) -> None:
    # written 20 minutes ago in UTC+8 wall-clock time: history when read as UTC+8
    make_log(tmp_path, f"{stamp(20 * 60, CST)} ERROR CUDA out of memory\n")
    reader = JobLogsCollector(tmp_path, OffsetStore(tmp_path / "o.json"), log_zone=CST)
    assert reader.collect()[0].attrs[keys.HISTORY] is True
    # read as UTC the same line looks 7 h 40 min in the future: capped at the file's mtime (now), news
    other = JobLogsCollector(tmp_path, OffsetStore(tmp_path / "o2.json"), log_zone=UTC)
    assert other.collect()[0].attrs[keys.HISTORY] is False


def test_a_backlog_read_over_several_polls_is_dated_to_its_end_and_carries_the_last_stamp(tmp_path: Path) -> None:
    header = f"{stamp(TWO_DAYS)} ERROR Traceback (most recent call last):\n"
    body = "".join(f'  File "layer{i}.py", line {i}, in forward\n' for i in range(4000))  # ~140 KB, no stamps
    log = make_log(tmp_path, header + body + "torch.OutOfMemoryError: CUDA out of memory.\n")
    reader = collector(tmp_path, poll_budget_bytes=64 * 1024, file_budget_bytes=64 * 1024)
    seen: list[Signal] = []
    for _ in range(5):
        seen += reader.collect()
    assert len(seen) == 4002
    assert all(s.attrs[keys.HISTORY] is True for s in seen)  # the last line: two polls after its stamped header
    state = reader.offsets.get(os.path.abspath(log))
    assert state is not None and "backlog" not in state and "backlog_at" not in state  # done: nothing kept

    append(log, "torch.OutOfMemoryError: CUDA out of memory.\n")
    [new] = reader.collect()
    assert keys.HISTORY not in new.attrs


def test_after_a_restart_lines_written_while_argus_was_down_are_news(tmp_path: Path) -> None:
    log = make_log(tmp_path, f"{stamp(TWO_DAYS)} step 1\n", mtime_ago_s=TWO_DAYS)
    assert read_as_the_loop_does(collector(tmp_path))[0].attrs[keys.HISTORY] is True
    append(log, f"{stamp(3600)} ERROR CUDA out of memory (an hour ago, while Argus was down)\n")
    [line] = collector(tmp_path).collect()  # a new process, the offsets read back from disk
    assert keys.HISTORY not in line.attrs


def test_a_file_empty_at_first_sight_holds_only_news(tmp_path: Path) -> None:
    log = make_log(tmp_path, "")
    reader = collector(tmp_path)
    assert reader.collect() == []
    append(log, f"{stamp(TWO_DAYS)} a stale stamp printed now\n")
    [line] = reader.collect()
    assert keys.HISTORY not in line.attrs


def test_a_file_rotated_while_watched_is_news(tmp_path: Path) -> None:
    log = make_log(tmp_path, f"{stamp(10)} step 1\n")
    reader = collector(tmp_path)
    reader.collect()
    os.rename(log, log.with_suffix(".log.1"))
    make_log(tmp_path, f"{stamp(TWO_DAYS)} step 2 with an odd stamp\n", mtime_ago_s=TWO_DAYS)
    signals = [s for s in reader.collect() if Path(s.source).name == "train.log"]
    assert [keys.HISTORY in s.attrs for s in signals] == [False]


def test_a_hand_edited_carry_in_the_offsets_file_is_ignored() -> None:
    assert saved_time("not a time") is None and saved_time(None) is None and saved_time(12) is None
    assert saved_time("2026-11-23T10:00:00+00:00") == datetime(2026, 11, 23, 10, tzinfo=UTC)


@pytest.mark.parametrize("window", [0, -1.0])
def test_the_window_must_be_positive(window: float) -> None:
    with pytest.raises(ConfigError, match="history window"):
        HistoryMarker(window)
