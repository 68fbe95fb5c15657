"""DiskSpaceDetector on hand-built storage_free_bytes signals (the shape collectors/storage.py emits) with a
fake clock: a steady decline, a nearly full disk, full inode tables, and the flat, noisy, growing and
too-short series that must stay quiet."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from core.errors import ConfigError
from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind
from detectors.disk_space import DiskSpaceDetector
from tests.support import Clock

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
GB = 1e9
TB = 1e12
PATH = "/mnt/shared"


def sample(
    at: datetime, avail: float, *, total: float = TB, path: str = PATH, inodes=(10_000_000, 5_000_000)
) -> Signal:
    return Signal(
        kind=SignalKind.METRIC,
        source=f"statvfs:{path}",
        subject=Subject(kind=SubjectKind.CLUSTER, id=path, name="shared storage"),
        observed_at=at,
        value=avail,
        attrs={
            "metric": "storage_free_bytes",
            "path": path,
            "total_bytes": total,
            "free_bytes": avail,
            "avail_bytes": avail,
            "used_fraction": 1 - avail / total,
            "inodes_total": inodes[0],
            "inodes_free": inodes[1],
            "inodes_avail": inodes[1],
        },
    )


def run(detector: DiskSpaceDetector, clock: Clock, values, *, every_s: float = 60.0, **kw) -> list:
    """Feed one sample per poll, advancing the clock; returns (poll index, finding) for every finding."""
    out = []
    for i, avail in enumerate(values):
        clock.now = T0 + timedelta(seconds=i * every_s)
        out += [(i, f) for f in detector.detect([sample(clock.now, avail, **kw)])]
    return out


def test_steady_decline_warns_with_rate_and_eta():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    # 120 GB free of 1 TB, losing 40 GB/hour (checkpoints every minute), with a little jitter.
    values = [120 * GB - i * (40 * GB / 60) + (0.2 * GB if i % 2 else -0.2 * GB) for i in range(31)]
    findings = run(d, clock, values)
    assert len(findings) == 1, "one finding per episode, not one per poll"
    i, f = findings[0]
    assert i == 5  # the first poll with 6 samples spanning 5 minutes: min_points and min_span_s both met
    assert f.category is Category.DISK_FULL and f.severity is Severity.WARNING and f.reason == "StorageFillingUp"
    assert f.subject.id == PATH and PATH in f.summary and "GB/hour" in f.summary
    # Six jittery points fit the true 40 GB/hour to within a few percent.
    assert f.attrs["rate_gb_per_hour"] == pytest.approx(40, rel=0.1)
    free_now = values[5]
    assert f.attrs["eta_s"] == pytest.approx(free_now / (f.attrs["rate_gb_per_hour"] * GB / 3600), rel=0.01)
    assert 2.5 * 3600 < f.attrs["eta_s"] < 3.5 * 3600  # about 2.9 hours at 40 GB/hour
    assert datetime.fromisoformat(f.attrs["eta"]) == pytest.approx(
        T0 + timedelta(minutes=5, seconds=f.attrs["eta_s"]), abs=timedelta(seconds=1)
    )
    assert f.attrs["eta"][:16] in f.summary
    first, last = f.evidence
    assert (first.at, first.value) == (T0, values[0])
    assert (last.at, last.value) == (T0 + timedelta(minutes=5), values[5])
    assert f.first_seen == T0


def test_trend_and_threshold_of_one_path_share_one_fingerprint_that_survives_restarts():
    def trend_finding():
        clock = Clock(T0)
        [(_, f)] = run(DiskSpaceDetector(clock=clock), clock, [120 * GB - i * GB for i in range(10)])
        return f

    def threshold_finding(path=PATH):
        clock = Clock(T0)
        return DiskSpaceDetector(clock=clock).detect([sample(T0, 10 * GB, path=path)])[0]

    a, b = trend_finding(), trend_finding()
    c, d = threshold_finding(), threshold_finding()
    assert a.fingerprint == b.fingerprint and c.fingerprint == d.fingerprint
    # one fault, one incident: the trend warning and the threshold breach of a path are the same incident
    assert a.fingerprint == c.fingerprint and a.reason != c.reason
    assert threshold_finding("/private").fingerprint != c.fingerprint


def test_below_the_floor_is_critical_once_per_episode():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    [f] = d.detect([sample(T0, 30 * GB)])  # 3% of 1 TB
    assert f.severity is Severity.CRITICAL and f.reason == "StorageNearlyFull" and f.category is Category.DISK_FULL
    assert "30.00 GB of 1000.00 GB free (3.0%)" in f.summary and PATH in f.summary
    assert f.evidence[0].value == 30 * GB and f.evidence[0].at == T0
    assert f.attrs["low_space"] and not f.attrs["low_inodes"]

    clock.now += timedelta(minutes=1)
    assert d.detect([sample(clock.now, 29 * GB)]) == []  # still full: same episode
    for _ in range(4):  # cleaned up: the episode ends once the history can tell there is no trend (5 min)
        clock.now += timedelta(minutes=1)
        assert d.detect([sample(clock.now, 300 * GB)]) == []
    assert [r.fingerprint for r in d.recoveries()] == [f.fingerprint]
    clock.now += timedelta(minutes=1)
    [again] = d.detect([sample(clock.now, 20 * GB)])
    assert again.fingerprint == f.fingerprint


def test_inode_table_nearly_full_is_critical_even_with_space_left():
    clock = Clock(T0)
    [f] = DiskSpaceDetector(clock=clock).detect([sample(T0, 500 * GB, inodes=(10_000_000, 100_000))])
    assert f.severity is Severity.CRITICAL and f.attrs["low_inodes"] and not f.attrs["low_space"]
    assert "inodes free (1.0%)" in f.summary
    # A file system without an inode table (btrfs reports 0) cannot run out of inodes.
    assert DiskSpaceDetector(clock=clock).detect([sample(T0, 500 * GB, inodes=(0, 0))]) == []


def test_flat_disk_with_noise_is_quiet():
    for seed in range(20):
        rng = random.Random(seed)
        clock = Clock(T0)
        # 65 GB free (6.5%) with +-5 GB of jitter from other writers: above the floor and no trend, though
        # short stretches of jitter fitted naively would predict a full disk within the hour.
        values = [65 * GB + rng.uniform(-5, 5) * GB for _ in range(60)]
        assert run(DiskSpaceDetector(clock=clock), clock, values) == [], f"seed {seed}"


def test_growing_disk_is_quiet():
    clock = Clock(T0)
    assert run(DiskSpaceDetector(clock=clock), clock, [100 * GB + i * GB for i in range(40)]) == []


def test_slow_decline_far_beyond_the_horizon_is_quiet():
    clock = Clock(T0)
    # 500 GB free, losing 1 GB/hour: full in three weeks, not within four hours.
    assert run(DiskSpaceDetector(clock=clock), clock, [500 * GB - i * GB / 60 for i in range(40)]) == []


def test_too_few_points_or_too_short_a_span_is_quiet():
    clock = Clock(T0)
    steep = [500 * GB - i * 50 * GB for i in range(4)]  # 4 samples: under min_points
    assert run(DiskSpaceDetector(clock=clock), clock, steep) == []
    clock = Clock(T0)
    # 20 samples 10 s apart: enough points, but only 190 s of history, under min_span_s.
    burst = [80 * GB - i * 0.5 * GB for i in range(20)]
    assert run(DiskSpaceDetector(clock=clock), clock, burst, every_s=10) == []


def test_a_trend_ends_when_old_samples_leave_the_window_and_can_come_back():
    clock = Clock(T0)
    d = DiskSpaceDetector(window_s=600, clock=clock)
    decline = [120 * GB - i * GB for i in range(10)]
    flat = [111 * GB + (0.1 * GB if i % 2 else 0) for i in range(20)]
    again = [111 * GB - i * GB for i in range(10)]
    found = run(d, clock, decline + flat + again)
    assert [i for i, _ in found] == [5, 35]  # the flat stretch ended the first episode; the second is new
    first, second = found[0][1], found[1][1]
    assert second.fingerprint == first.fingerprint
    assert second.evidence[0].at >= T0 + timedelta(minutes=35 - 10)  # fitted only on the last 10 minutes


def test_a_resize_restarts_the_history():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    assert run(d, clock, [120 * GB - i * GB for i in range(4)]) == []
    # Another file system (2 TB) is mounted there: the old points are its predecessor's story, so two more
    # polls continuing the decline are not yet a trend (with the old points kept they would be one).
    for minute, avail in ((4, 116 * GB), (5, 115 * GB)):
        clock.now = T0 + timedelta(minutes=minute)
        assert d.detect([sample(clock.now, avail, total=2 * TB)]) == []


def test_paths_are_tracked_separately():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    found = []
    for i in range(10):
        clock.now = T0 + timedelta(minutes=i)
        found += d.detect([
            sample(clock.now, 120 * GB - i * GB, path="/mnt/shared"),
            sample(clock.now, 400 * GB, path="/private"),
        ])
    assert [f.subject.id for f in found] == ["/mnt/shared"]


def test_bad_config_is_refused():
    for kw in ({"min_free_fraction": 0}, {"min_free_fraction": 1.5}, {"horizon_s": 0}, {"window_s": 100},
               {"min_points": 2}, {"min_trend_t": 0}, {"clear_margin": -0.01}):
        with pytest.raises(ConfigError):
            DiskSpaceDetector(**kw)


# -- recovery ------------------------------------------------------------------------------------------------


def feed(d: DiskSpaceDetector, clock: Clock, values, *, start: int = 0, every_s: float = 60.0, **kw):
    """Like `run`, from poll `start` on; returns (findings, recoveries) as (poll index, value) pairs."""
    found, recovered = [], []
    for i, avail in enumerate(values, start=start):
        clock.now = T0 + timedelta(seconds=i * every_s)
        found += [(i, f) for f in d.detect([sample(clock.now, avail, **kw)])]
        recovered += [(i, r) for r in d.recoveries()]
    return found, recovered


def test_a_cleaned_up_disk_recovers_once_with_the_fingerprint_it_was_reported_under():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    found, recovered = feed(d, clock, [30 * GB, 29 * GB] + [300 * GB] * 10)
    [(_, full)] = found
    # not before poll 5: until then the history (5 points over 5 minutes) is too short to say "no trend"
    [(i, recovery)] = recovered
    assert i == 5 and recovery.fingerprint == full.fingerprint and recovery.detector == "disk_space"
    assert recovery.observed_at == T0 + timedelta(minutes=5)
    assert recovery.reason.startswith(f"shared storage {PATH} has 300.00 GB of 1000.00 GB free (30.0%) and ")
    assert "inodes (50.0%) again, over the 7% line; free space not falling over the last 5 min" in recovery.reason


def test_hovering_at_the_floor_is_one_episode_without_recoveries_until_past_the_margin():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    # 4.9% / 6.9%, every other minute, for 20 minutes: under the floor, then over it but under floor + margin
    hovering = [49 * GB if i % 2 else 69 * GB for i in range(20)]
    found, recovered = feed(d, clock, hovering)
    assert [i for i, _ in found] == [1] and recovered == []
    found, recovered = feed(d, clock, [71 * GB] * 3, start=20)  # over 7% and flat around it: now it ends
    assert found == [] and [i for i, _ in recovered] == [20]
    # a wider margin would have kept it open
    clock = Clock(T0)
    wide = DiskSpaceDetector(clock=clock, clear_margin=0.03)
    assert feed(wide, clock, hovering + [71 * GB] * 3)[1] == []


def test_an_inode_episode_ends_only_on_inodes_counted_and_back_over_the_line():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    found, recovered = feed(d, clock, [500 * GB] * 6, inodes=(10_000_000, 100_000))
    [(_, opened)] = found
    assert opened.attrs["low_inodes"] and recovered == []
    # inodes over the floor but under floor + margin: not yet
    assert feed(d, clock, [500 * GB] * 2, start=6, inodes=(10_000_000, 600_000)) == ([], [])
    # the file system stopped reporting its inode table: what set the episode off is not seen, so not "fine"
    assert feed(d, clock, [500 * GB] * 2, start=8, inodes=(0, 0)) == ([], [])
    _, recovered = feed(d, clock, [500 * GB], start=10, inodes=(10_000_000, 4_000_000))
    [(_, recovery)] = recovered
    assert recovery.fingerprint == opened.fingerprint and "4,000,000 of 10,000,000 inodes (40.0%)" in recovery.reason


def test_a_trend_recovers_when_the_writer_stops_not_while_it_still_fills_slower():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    # 120 GB losing 40 GB/hour for 10 min (reported), then 20 GB/hour for an hour: full in about 5 h, past the
    # 4 h horizon (no claim) but within twice it, so the episode stays open
    fast = [120 * GB - i * (40 * GB / 60) for i in range(10)]
    slow = [fast[-1] - i * (20 * GB / 60) for i in range(1, 61)]
    found, recovered = feed(d, clock, fast + slow)
    [(i, trend)] = found
    assert i == 5 and trend.reason == "StorageFillingUp" and recovered == []
    found, recovered = feed(d, clock, [slow[-1]] * 40, start=70)  # the writer stopped: flat from here
    [(i, recovery)] = recovered
    assert found == [] and recovery.fingerprint == trend.fingerprint
    assert 70 < i < 100 and "94.00 GB of 1000.00 GB free (9.4%)" in recovery.reason
    # the window still holds some of the decline: the fit ends the episode once it says full beyond twice the horizon
    assert "over the last 30 min, full in about" in recovery.reason and "beyond the 4.0 h horizon" in recovery.reason


def test_a_trend_that_fills_the_disk_is_not_recovered_until_it_is_cleaned_up_then_both_end():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    # 80 GB free losing 2 GB a minute down to 20 GB, then full and flat at 20 GB (2%)
    values = [80 * GB - i * 2 * GB for i in range(31)] + [20 * GB] * 40
    found, recovered = feed(d, clock, values)
    assert [f.attrs["kind"] for _, f in found] == ["trend", "threshold"] and recovered == []
    _, recovered = feed(d, clock, [400 * GB] * 10, start=71)
    [(_, recovery)] = recovered  # both episodes were one incident: it is closed once
    assert {recovery.fingerprint} == {f.fingerprint for _, f in found}
    assert "not falling" in recovery.reason


def test_no_recovery_without_a_fresh_sample_of_the_path():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    feed(d, clock, [30 * GB] + [31 * GB] * 5)
    for minute in range(6, 16):  # only another path is sampled: /mnt/shared is not seen, so not "fine"
        clock.now = T0 + timedelta(minutes=minute)
        d.detect([sample(clock.now, 900 * GB, path="/private")])
        assert d.recoveries() == []
    clock.now = T0 + timedelta(minutes=16)
    # a repeat of the last sample (same time) says nothing new, even with other numbers
    d.detect([sample(T0 + timedelta(minutes=5), 900 * GB)])
    assert d.recoveries() == []
    # the volume was grown to 2 TB: its history starts again, too short to judge a trend until 5 points span
    # 5 minutes (16 .. 21)
    _, recovered = feed(d, clock, [1500 * GB] * 8, start=16, total=2 * TB)
    assert [i for i, _ in recovered] == [21]


def test_a_fresh_detector_claims_nothing_it_did_not_report():
    clock = Clock(T0)
    d = DiskSpaceDetector(clock=clock)
    assert feed(d, clock, [900 * GB] * 20) == ([], [])
