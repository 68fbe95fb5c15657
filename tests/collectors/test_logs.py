"""Incremental reading of training logs on shared storage.

Everything here is real: files in a tmp folder written, renamed and truncated the way training jobs and
logrotate do it, the offsets file on disk, and this process's memory (psutil) while reading a 100 MB line.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import psutil
import pytest
from loguru import logger

from collectors.logs import JobLogsCollector, LineSplitter, LogTailer
from collectors.offsets import OffsetStore
from core.errors import SourceUnavailable
from core.types import SignalKind, SubjectKind
from tests.support import read_as_the_loop_does


def texts(lines) -> list[str]:
    return [line.text for line in lines]


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def store(tmp_path: Path) -> OffsetStore:
    return OffsetStore(tmp_path / "state" / "offsets.json")


@pytest.fixture
def warnings():
    seen: list[str] = []
    handler = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    yield seen
    logger.remove(handler)


def test_appended_lines_are_read_once_with_line_numbers_across_polls(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "train.log"
    append(log, "step 1\nstep 2\n")
    tailer = LogTailer(store)
    first, _ = tailer.read(log)
    assert [(x.line_no, x.text) for x in first] == [(1, "step 1"), (2, "step 2")]
    assert tailer.read(log)[0] == []
    append(log, "step 3\n")
    assert [(x.line_no, x.text, x.source) for x in tailer.read(log)[0]] == [(3, "step 3", str(log))]


def test_partial_line_waits_for_its_newline(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "train.log"
    append(log, "done\nLoading shards")
    tailer = LogTailer(store)
    assert texts(tailer.read(log)[0]) == ["done"]
    assert tailer.read(log)[0] == []
    append(log, " 3/3\n")
    got = tailer.read(log)[0]
    assert [(x.line_no, x.text) for x in got] == [(2, "Loading shards 3/3")]


def test_crlf_invalid_utf8_and_colour_codes(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "train.log"
    append(log, b"windows line\r\nbad \xff\xfe bytes\n\x1b[31mred error\x1b[0m\nhalf \xe2\x82\n")
    got = texts(LogTailer(store).read(log)[0])
    assert got == ["windows line", "bad \ufffd\ufffd bytes", "red error", "half \ufffd"]


def test_rotation_by_rename_finishes_the_old_file_then_reads_the_new_from_zero(
    tmp_path: Path, store: OffsetStore
) -> None:
    log = tmp_path / "train.log"
    append(log, "old 1\n")
    tailer = LogTailer(store)
    assert texts(tailer.read(log)[0]) == ["old 1"]
    append(log, "old 2\nold partial")  # written after the last poll, then rotated away
    os.rename(log, tmp_path / "train.log.1")
    append(log, "new 1\n")
    got = tailer.read(log)[0]
    assert [(x.text, x.line_no, Path(x.source).name) for x in got] == [
        ("old 2", 2, "train.log"),
        ("old partial", 3, "train.log"),
        ("new 1", 1, "train.log"),
    ]
    append(log, "new 2\n")
    assert [(x.text, x.line_no) for x in tailer.read(log)[0]] == [("new 2", 2)]


def test_rotation_while_argus_was_down_finds_the_old_file_by_inode(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "old 1\n")
    first = OffsetStore(tmp_path / "offsets.json")
    LogTailer(first).read(log)
    first.save()
    append(log, "old 2\n")
    os.rename(log, tmp_path / "train.log.1")
    append(log, "new 1\n")
    got = LogTailer(OffsetStore(tmp_path / "offsets.json")).read(log)[0]
    assert [(x.text, Path(x.source).name) for x in got] == [("old 2", "train.log.1"), ("new 1", "train.log")]


def test_truncation_restarts_at_zero(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "train.log"
    append(log, "a long first line of the old content\nsecond\n")
    tailer = LogTailer(store)
    tailer.read(log)
    with open(log, "wb") as f:  # copytruncate: same inode, shorter
        f.write(b"fresh\n")
    assert [(x.text, x.line_no) for x in tailer.read(log)[0]] == [("fresh", 1)]


def test_rewritten_in_place_beyond_the_offset_is_read_again(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "train.log"
    append(log, "epoch 1 begins\n")
    tailer = LogTailer(store)
    tailer.read(log)
    with open(log, "r+b") as f:  # same inode, different first bytes, longer than before
        f.write(b"restarted job, rank 0\nstep 1\n")
    assert texts(tailer.read(log)[0]) == ["restarted job, rank 0", "step 1"]


def test_a_100_mb_line_costs_bounded_memory_and_the_next_line_is_read(tmp_path: Path, store: OffsetStore) -> None:
    log = tmp_path / "huge.log"
    block = b"x" * (1024 * 1024)
    with open(log, "wb") as f:
        f.write(b"before\n")
        for _ in range(100):
            f.write(block)
        f.write(b"\nafter: torch.OutOfMemoryError: CUDA out of memory\n")
    tailer = LogTailer(store, file_budget_bytes=16 * 1024 * 1024)
    gc.collect()
    proc = psutil.Process()
    rss0, peak = proc.memory_info().rss, 0
    got = []
    for _ in range(20):  # 100 MB at 16 MB a poll
        lines, _ = tailer.read(log)
        got += lines
        peak = max(peak, proc.memory_info().rss - rss0)
        if any(x.text.startswith("after") for x in got):
            break
    assert [(x.line_no, x.truncated, len(x.text)) for x in got] == [
        (1, False, 6),
        (2, True, tailer.max_line_bytes),
        (3, False, len("after: torch.OutOfMemoryError: CUDA out of memory")),
    ]
    assert peak < 40 * 1024 * 1024, f"reading a 100 MB line grew RSS by {peak / 2**20:.0f} MiB"


def test_over_long_line_cut_across_polls_and_restart_keeps_skipping(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "y" * 300)
    offsets = OffsetStore(tmp_path / "offsets.json")
    got = LogTailer(offsets, max_line_bytes=100).read(log)[0]
    assert [(x.line_no, x.truncated, len(x.text)) for x in got] == [(1, True, 100)]
    offsets.save()
    append(log, "y" * 300 + "\nnext\n")
    again = LogTailer(OffsetStore(tmp_path / "offsets.json"), max_line_bytes=100).read(log)[0]
    assert [(x.line_no, x.text) for x in again] == [(2, "next")]


def test_a_budget_below_the_line_cap_still_gets_past_a_long_line(tmp_path: Path) -> None:
    # a poll's budget may be smaller than the line cap (what a poll has left); a line longer than the budget must
    # still be cut and passed, or the offset would stay before it for good
    log = tmp_path / "train.log"
    append(log, "a\n" + "z" * 250 + "\nafter\n")
    tailer = LogTailer(OffsetStore(tmp_path / "offsets.json"), max_line_bytes=200)
    got = []
    for _ in range(5):
        got += tailer.read(log, budget=50)[0]
    assert [(x.line_no, x.truncated, len(x.text)) for x in got] == [(1, False, 1), (2, True, 200), (3, False, 5)]


def test_splitter_accounts_every_byte() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    out = splitter.feed(b"ab\ncdefghijklmn")
    out += splitter.feed(b"op\nqr")
    assert out == [(1, "ab", False), (2, "cdefghij", True)]
    assert splitter.consumed == len(b"ab\ncdefghijklmnop\n") and splitter.pending == 2


def job_file(root: Path, submission_id: str, rel: str) -> Path:
    path = root / "jobs" / submission_id / "logs" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_collector_emits_log_line_signals_per_job(tmp_path: Path, store: OffsetStore) -> None:
    root = tmp_path / "shared"
    a = job_file(root, "raysubmit_A", "rank0/train.log")
    b = job_file(root, "raysubmit_B", "stderr.err")
    skipped = job_file(root, "raysubmit_B", "model.bin")
    append(a, "step 1\n")
    append(b, "Traceback (most recent call last):\n")
    append(skipped, "step 99\n")
    signals = JobLogsCollector(root, store).collect()
    got = sorted((s.subject.id, s.line, s.text, s.attrs["stream"], s.attrs["truncated"]) for s in signals)
    assert got == [
        ("raysubmit_A", 1, "step 1", "job-logs", False),
        ("raysubmit_B", 1, "Traceback (most recent call last):", "job-logs", False),
    ]
    assert all(s.kind is SignalKind.LOG_LINE and s.subject.kind is SubjectKind.JOB for s in signals)
    assert {s.source for s in signals} == {str(a), str(b)}


def test_restart_reads_nothing_twice_and_misses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    log = job_file(root, "raysubmit_A", "train.log")
    offsets_path = tmp_path / "data" / "offsets" / "job_logs.json"
    append(log, "1\n2\n3")  # "3" is still being written when Argus stops
    first = read_as_the_loop_does(JobLogsCollector(root, OffsetStore(offsets_path)))
    append(log, "\n4\n")
    second = JobLogsCollector(root, OffsetStore(offsets_path)).collect()  # a new process
    seen = [(s.line, s.text) for s in first + second]
    assert seen == [(1, "1"), (2, "2"), (3, "3"), (4, "4")]


def test_corrupt_offsets_file_warns_and_starts_safely(tmp_path: Path, warnings: list[str]) -> None:
    root = tmp_path / "shared"
    log = job_file(root, "raysubmit_A", "train.log")
    append(log, "step 1\n")
    offsets_path = tmp_path / "offsets.json"
    offsets_path.write_bytes(b'{"version": 1, "files": {"/x": {"offset": 1')  # a write cut short
    store = OffsetStore(offsets_path)
    assert store.recovered_from is not None and store.recovered_from.exists()
    assert any("unreadable" in w and str(offsets_path) in w for w in warnings)
    assert [s.text for s in read_as_the_loop_does(JobLogsCollector(root, store))] == ["step 1"]
    saved = json.loads(offsets_path.read_text())
    assert saved["files"][str(log)]["offset"] == len("step 1\n")


def test_one_huge_file_does_not_stall_the_others(tmp_path: Path, store: OffsetStore) -> None:
    root = tmp_path / "shared"
    big = job_file(root, "raysubmit_A", "a.log")
    small = job_file(root, "raysubmit_B", "b.log")
    with open(big, "wb") as f:
        f.write(b"step\n" * (2 * 1024 * 1024))  # 10 MB
    append(small, "NCCL error\n")
    collector = JobLogsCollector(root, store, poll_budget_bytes=3 * 1024 * 1024, file_budget_bytes=1024 * 1024)
    signals = collector.collect()
    assert any(s.text == "NCCL error" for s in signals)
    assert sum(len(s.text or "") + 1 for s in signals) <= 3 * 1024 * 1024


def test_vanished_files_leave_the_offsets(tmp_path: Path, store: OffsetStore) -> None:
    root = tmp_path / "shared"
    log = job_file(root, "raysubmit_A", "train.log")
    append(log, "x\n")
    collector = JobLogsCollector(root, store)
    collector.collect()
    assert len(store) == 1
    log.unlink()
    collector.collect()
    assert len(store) == 0


def test_missing_jobs_folder_names_it(tmp_path: Path, store: OffsetStore) -> None:
    with pytest.raises(SourceUnavailable) as info:
        JobLogsCollector(tmp_path / "not-mounted", store).collect()
    assert str(tmp_path / "not-mounted" / "jobs") in str(info.value)
    assert "ARGUS_SHARED_ROOT" in (info.value.hint or "")
