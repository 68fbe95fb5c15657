"""SharedStorageCollector on real directories of this machine (real statvfs), a missing path, and a
statvfs that never returns (simulated: an injected function blocked on an event, standing in for a
hung hard NFS mount, which cannot be produced here without root)."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from collectors.storage import METRIC, SharedStorageCollector
from core.errors import ConfigError, SourceUnavailable
from core.ports import Collector
from core.types import Category, Severity, SignalKind, SubjectKind
from detectors.disk_space import DiskSpaceDetector

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def test_real_directory_matches_statvfs_and_disk_usage(tmp_path: Path):
    collector = SharedStorageCollector([tmp_path], clock=lambda: NOW)
    assert isinstance(collector, Collector) and collector.name == "storage"
    [signal] = collector.collect()
    usage = shutil.disk_usage(tmp_path)
    st = os.statvfs(tmp_path)
    a = signal.attrs
    assert signal.kind is SignalKind.METRIC and a["metric"] == METRIC
    assert signal.subject.kind is SubjectKind.CLUSTER and signal.subject.id == str(tmp_path) == a["path"]
    assert signal.observed_at == NOW and signal.value == a["avail_bytes"]
    assert a["total_bytes"] == usage.total > 0
    # Other engineers write to this disk at the same time: free space may move a little between the calls.
    slack = 0.01 * usage.total
    assert abs(a["avail_bytes"] - usage.free) <= slack  # shutil's "free" is f_bavail, what users get
    assert abs(a["used_bytes"] - usage.used) <= slack
    assert a["avail_bytes"] <= a["free_bytes"] <= a["total_bytes"]
    assert 0.0 <= a["used_fraction"] <= 1.0
    assert a["inodes_total"] == st.f_files and 0 <= a["inodes_avail"] <= a["inodes_free"] <= a["inodes_total"]


def test_real_signal_feeds_the_detector(tmp_path: Path):
    """The collector's attrs are what the detector reads: a floor above any real disk's free share fires."""
    [signal] = SharedStorageCollector([tmp_path], clock=lambda: NOW).collect()
    [finding] = DiskSpaceDetector(min_free_fraction=0.999999, clock=lambda: NOW).detect([signal])
    assert finding.category is Category.DISK_FULL and finding.severity is Severity.CRITICAL
    assert str(tmp_path) in finding.summary and finding.attrs["total_bytes"] == signal.attrs["total_bytes"]


def test_missing_path_is_a_clear_source_unavailable(tmp_path: Path):
    missing = tmp_path / "not-mounted"
    with pytest.raises(SourceUnavailable) as info:
        SharedStorageCollector([missing]).collect()
    assert info.value.address == str(missing)
    assert "does not exist" in info.value.message and "ARGUS_SHARED_ROOT" in (info.value.hint or "")


def test_other_os_errors_name_the_path_and_cause(tmp_path: Path):
    def stale(path: str):
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path)

    with pytest.raises(SourceUnavailable) as info:
        SharedStorageCollector([tmp_path], statvfs=stale).collect()
    assert str(tmp_path) in str(info.value) and os.strerror(errno.ESTALE) in info.value.message


@pytest.mark.timeout(60)  # the point of the test: a hung mount must not hang collect()
def test_hung_statvfs_times_out_and_is_not_piled_up(tmp_path: Path):
    release = threading.Event()
    calls: list[str] = []

    def hung_then_real(path: str):
        calls.append(path)
        release.wait()  # a hard NFS mount with its server gone: blocks until the server is back
        return os.statvfs(path)

    collector = SharedStorageCollector([tmp_path], timeout_s=0.2, statvfs=hung_then_real)
    try:
        with pytest.raises(SourceUnavailable) as first:
            collector.collect()
        assert "NFS mount not responding" in first.value.message and first.value.address == str(tmp_path)
        assert "did not return within 0.2 s" in first.value.message

        with pytest.raises(SourceUnavailable) as second:
            collector.collect()
        assert "has not returned for" in second.value.message
        assert calls == [str(tmp_path)]  # no second thread parked on the same dead mount
    finally:
        release.set()

    # Once the stuck call returns, the next poll probes afresh. The thread may need a moment to finish.
    for _ in range(200):
        try:
            [signal] = collector.collect()
            break
        except SourceUnavailable:
            time.sleep(0.05)
    else:
        pytest.fail("collector did not recover after the hung statvfs returned")
    assert signal.attrs["path"] == str(tmp_path) and len(calls) >= 2


def test_some_paths_down_returns_the_others(tmp_path: Path):
    missing = tmp_path / "gone"
    collector = SharedStorageCollector([tmp_path, missing])
    [signal] = collector.collect()
    assert signal.subject.id == str(tmp_path)
    assert list(collector.last_errors) == [missing]
    assert "does not exist" in str(collector.last_errors[missing])


def test_every_path_down_names_them_all(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(SourceUnavailable) as info:
        SharedStorageCollector([a, b]).collect()
    assert str(a) in str(info.value) and str(b) in str(info.value)


def test_bad_config_is_refused():
    with pytest.raises(ConfigError):
        SharedStorageCollector([])
    with pytest.raises(ConfigError):
        SharedStorageCollector([Path("/")], timeout_s=0)
