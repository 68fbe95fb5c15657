"""The kernel log reader (collectors/kernel_log.py) and the kernel rules (detectors/rules/kernel.yaml): a kernel
line in a file the test writes, or in the real /dev/kmsg where this process may read it, becomes a node's
finding through the real log rules."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from collectors.kernel_log import (
    FileSource,
    JournalSource,
    KernelLogCollector,
    KmsgSource,
    parse_kmsg_record,
    pick_source,
)
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.errors import ConfigError, SourceUnavailable
from core.types import Category, SubjectKind
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector
from tests.support import read_as_the_loop_does

RULES = load_rules()
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def collector_for(path: Path, tmp_path: Path) -> KernelLogCollector:
    offsets = OffsetStore(tmp_path / "kernel_log.json")
    source = FileSource(path, offsets, history_window_s=900, clock=lambda: NOW)
    return KernelLogCollector(source, offsets, node_id="node-7", node_ip="10.0.0.7", clock=lambda: NOW)


@pytest.mark.parametrize(("line", "category"), [
    ("[Thu Nov 26 11:59:58 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.", "gpu_hardware"),
    ("[Thu Nov 26 11:59:58 2026] Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234kB",
     "host_oom"),
    ("[Thu Nov 26 11:59:58 2026] pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
     "gpu_hardware"),
    ("[Thu Nov 26 11:59:58 2026] NVRM: GPU at PCI:0000:3b:00: GPU-5f1c: RmInitAdapter failed! (0x26:0xffff:1601)",
     "gpu_hardware"),
    ("[Thu Nov 26 11:59:58 2026] mlx5_core 0000:b5:00.0 ibp181s0: Link down", "nccl_error"),
])
def test_a_kernel_line_written_to_the_file_becomes_a_finding_about_the_node(tmp_path: Path, line: str,
                                                                            category: str) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("[Thu Nov 26 11:59:50 2026] eth0: link up\n")
    collector = collector_for(kern, tmp_path)
    detector = LogRuleDetector(RULES)
    assert detector.detect(collector.collect()) == []  # the backlog: nothing wrong in it
    with kern.open("a") as f:
        f.write(line + "\n")
    signals = collector.collect()
    assert [s.text for s in signals] == [line]
    assert signals[0].attrs[keys.STREAM] == "kernel" and signals[0].subject.kind is SubjectKind.NODE
    findings = detector.detect(signals)
    assert [f.category for f in findings] == [Category(category)]
    assert findings[0].subject.id == "node-7"


def test_an_old_kernel_line_read_at_first_sight_is_history_not_news(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("[Thu Nov 26 08:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n")
    os.utime(kern, (NOW.timestamp() - 4 * 3600,) * 2)
    signals = collector_for(kern, tmp_path).collect()
    assert signals[0].attrs[keys.HISTORY] is True
    assert LogRuleDetector(RULES).detect(signals) == []


def test_a_restart_reads_on_from_where_it_stopped(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("a\nb\n")
    assert [s.text for s in read_as_the_loop_does(collector_for(kern, tmp_path))] == ["a", "b"]
    with kern.open("a") as f:
        f.write("c\n")
    assert [s.text for s in collector_for(kern, tmp_path).collect()] == ["c"]


@pytest.mark.parametrize(("raw", "expected"), [
    (b"6,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
     (6, 1234, 5000000, "NVRM: Xid (PCI:0000:3b:00): 79")),
    (b"3,7,12,c,extra;msg with \xff byte\n", (3, 7, 12, "msg with \ufffd byte")),
    (b"no semicolon here", None),
    (b"x,y,z;not numbers", None),
    (b"6,1;too few fields", None),
    (b"", None),
])
def test_kmsg_records_are_parsed_and_anything_else_is_skipped(raw: bytes, expected: object) -> None:
    assert parse_kmsg_record(raw) == expected


def test_a_huge_kmsg_record_is_cut() -> None:
    parsed = parse_kmsg_record(b"6,1,1,-;" + b"x" * 1_000_000)
    assert parsed is not None and len(parsed[3]) < 100_000


def _kmsg_readable() -> bool:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.skipif(not _kmsg_readable(), reason="this process may not read /dev/kmsg (needs root or CAP_SYSLOG)")
def test_the_real_kmsg_is_read_once_and_a_restart_goes_on_after_the_last_record(tmp_path: Path) -> None:
    offsets = OffsetStore(tmp_path / "kernel_log.json")
    first = KmsgSource(offsets, history_window_s=900)
    try:
        lines = first.read()
    finally:
        first.close()
    assert lines, "the kernel buffer holds at least its boot messages"
    seqs = [line.seq for line in lines]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(line.attrs and keys.HISTORY in line.attrs for line in lines)  # a first sight is dated
    offsets.save()
    again = KmsgSource(OffsetStore(tmp_path / "kernel_log.json"), history_window_s=900)
    try:
        later = again.read()
    finally:
        again.close()
    assert all(line.seq > seqs[-1] for line in later)  # nothing read twice across a restart
    assert all(line.attrs is None for line in later)  # and what comes after is news, not backlog


def test_a_reboot_starts_the_sequence_over(tmp_path: Path) -> None:
    offsets = OffsetStore(tmp_path / "kernel_log.json")
    offsets.set("/dev/kmsg", {"seq": 10**12, "boot_id": "an-earlier-boot"})
    if not _kmsg_readable():
        pytest.skip("this process may not read /dev/kmsg")
    source = KmsgSource(offsets, boot_id="this-boot", boot_time=NOW - timedelta(days=1))
    try:
        assert source.read(), "a saved seq of another boot does not hide this boot's records"
    finally:
        source.close()


def test_journal_lines_go_on_after_the_saved_cursor_and_number_on_across_restarts(tmp_path: Path) -> None:
    # a journalctl that answers like the real one: JSON records, the ones after --after-cursor when given
    fake = tmp_path / "journalctl"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"--after-cursor c2"*) echo \'{"MESSAGE":"NVRM: Xid (PCI:0000:3b:00): 79, pid=0","__CURSOR":"c3",'
        '"__REALTIME_TIMESTAMP":"1790000002000000"}\' ;;\n'
        '  *) echo \'{"MESSAGE":"booted","__CURSOR":"c1","__REALTIME_TIMESTAMP":"1790000000000000"}\'\n'
        '     echo \'{"MESSAGE":[78,86,82,77,255],"__CURSOR":"c2","__REALTIME_TIMESTAMP":"1790000001000000"}\' ;;\n'
        "esac\n")
    fake.chmod(0o755)
    offsets = OffsetStore(tmp_path / "offsets.json")
    first = JournalSource(offsets, journalctl=str(fake)).read()
    assert [(k.seq, k.text) for k in first] == [(1, "booted"), (2, "NVRM\ufffd")]
    offsets.save()
    again = JournalSource(OffsetStore(tmp_path / "offsets.json"), journalctl=str(fake)).read()  # a restart
    assert [(k.seq, k.text[:9]) for k in again] == [(3, "NVRM: Xid")]


def test_pick_source_takes_a_path_refuses_a_folder_and_says_why_it_found_none(tmp_path: Path) -> None:
    offsets = OffsetStore(tmp_path / "o.json")
    assert pick_source("off", offsets).source is None
    assert isinstance(pick_source(str(tmp_path / "kern.log"), offsets).source, FileSource)
    with pytest.raises(ConfigError, match="is a folder"):
        pick_source(str(tmp_path), offsets)
    none = pick_source("auto", offsets, kmsg=str(tmp_path / "no-kmsg"), journalctl="/bin/false",
                       log_files=(str(tmp_path / "no-kern.log"),))
    assert none.source is None
    assert any("no-kmsg" in why for why in none.tried) and any("no-kern.log" in why for why in none.tried)


def test_a_source_that_fails_is_unavailable_with_what_to_do(tmp_path: Path) -> None:
    offsets = OffsetStore(tmp_path / "o.json")
    collector = KernelLogCollector(KmsgSource(offsets, path=str(tmp_path / "missing")), offsets, node_id="n",
                                   node_ip="10.0.0.1")
    with pytest.raises(SourceUnavailable, match="kernel log") as err:
        collector.collect()
    assert "CAP_SYSLOG" in str(err.value.hint)
