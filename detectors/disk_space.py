"""Shared storage running out: nearly full now (critical), or free space trending to zero (warning).

Input: METRIC `storage_free_bytes` signals (collectors/storage.py): value the bytes a non-root user can
still write, attrs total_bytes and inode counts; subject the path.

Two claims per path, one incident: both carry the fingerprint of (disk_full, path), so a trend warning that
becomes a threshold breach is the same incident whose severity rises to critical (the store raises it on a
repeat), each claim kept as a finding with its own reason and evidence, and an Argus restart folds a repeat
into the same incident:
- threshold (critical): avail / total under `min_free_fraction`, or available inodes under the same
  fraction of the inode table (a full inode table fails writes with ENOSPC as surely as full blocks);
- trend (warning): a least-squares line through the avail samples of the last `window_s` reaches zero
  within `horizon_s`. Only a clearly negative trend counts: at least `min_points` samples spanning at least
  `min_span_s`, and a slope at least `min_trend_t` standard errors below zero, so a flat disk with jitter
  from other writers, or a growing one, gives nothing. The rate is the fitted slope; the time left is the
  space available now divided by it.

One finding per episode: while a claim holds nothing more is reported. A change of the path's total size
(volume grown, another file system mounted there) restarts its history. After a restart the trend needs a new
window of samples: the detector only claims a trend it has watched.

Recovery (`recoveries()`, read by the loop after each `detect()`): a path's open episodes (either kind) end
together, told once with their one fingerprint, when a sample of the path shows it clear, which is more than
"no claim holds" so that a path hovering at a line does not open and close an incident every poll:
- free space at or over `min_free_fraction + clear_margin` (5% + 2% by default), and inodes too when the file
  system has an inode table (an episode set off by inodes needs an inode count to end);
- no trend to full: a fit over the window that is judgeable (`min_points` over `min_span_s`) and does not show
  even half the evidence that opens a trend (t under `min_trend_t / 2`) of a disk full within twice the horizon.
A trend warning is not ended by the disk filling up: the path is not clear. Nothing ends without a fresh sample
of the path (a missing, repeated or out-of-order sample, or too short a history after a resize, ends nothing),
and once an episode has ended a new claim is reported again under the same fingerprint, a new incident.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from core import signal_keys as keys
from core.errors import ConfigError
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    Subject,
    fingerprint_of,
    utcnow,
)

METRIC = keys.STORAGE_FREE_BYTES_METRIC
THRESHOLD = "threshold"
TREND = "trend"
_GB = 1e9
_MAX_POINTS = 4096  # per path; at one poll every 15 s this is 17 hours, far more than any sane window
# An open episode stays open on weaker evidence of a trend than opens one (hysteresis, see the docstring).
_KEEP_T_FACTOR = 0.5
_KEEP_HORIZON_FACTOR = 2.0


@dataclass(frozen=True)
class _Point:
    at: datetime
    avail: float
    total: float
    source: str


@dataclass(frozen=True)
class _Fit:
    slope: float  # bytes per second, of avail
    t_stat: float  # slope / its standard error; -inf for a perfectly straight decline
    points: int
    span_s: float
    first: _Point
    last: _Point


@dataclass
class _PathState:
    history: deque[_Point] = field(default_factory=lambda: deque(maxlen=_MAX_POINTS))
    active: dict[str, Finding] = field(default_factory=dict)  # kind -> the finding that opened its episode


def _gb(n: float) -> str:
    return f"{n / _GB:.2f} GB"


def _inodes(signal: Signal) -> tuple[float, float, float | None]:
    """(inodes available, inode table size, their fraction); the fraction is None without an inode table."""
    inodes_total = float(signal.attrs.get(keys.INODES_TOTAL) or 0)
    reported_avail = signal.attrs.get(keys.INODES_AVAIL, signal.attrs.get(keys.INODES_FREE))
    inodes_avail = float(reported_avail) if reported_avail is not None else 0.0
    # Some file systems (btrfs, some NFS servers) report no inode table (0): they cannot run out of inodes.
    inode_fraction = inodes_avail / inodes_total if inodes_total > 0 and reported_avail is not None else None
    return inodes_avail, inodes_total, inode_fraction


def _fit(points: Sequence[_Point]) -> _Fit:
    """Ordinary least squares of avail on time, centred so epoch seconds and petabytes stay exact enough."""
    t0 = points[0].at
    xs = [(p.at - t0).total_seconds() for p in points]
    ys = [p.avail for p in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    sse = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    se = math.sqrt(sse / (n - 2) / sxx) if n > 2 else math.inf
    if se == 0.0:
        t_stat = math.copysign(math.inf, slope) if slope else 0.0
    else:
        t_stat = slope / se
    return _Fit(slope, t_stat, n, xs[-1] - xs[0], points[0], points[-1])


class DiskSpaceDetector:
    name = "disk_space"

    def __init__(
        self,
        *,
        min_free_fraction: float = 0.05,
        horizon_s: float = 4 * 3600.0,
        window_s: float = 1800.0,
        min_points: int = 5,
        min_span_s: float = 300.0,
        min_trend_t: float = 4.0,
        clear_margin: float = 0.02,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if not 0 < min_free_fraction < 1:
            raise ConfigError(f"disk_space min_free_fraction={min_free_fraction} must be in (0, 1)", hint="e.g. 0.05")
        if horizon_s <= 0 or window_s <= 0 or min_span_s < 0 or min_span_s > window_s:
            raise ConfigError(
                f"disk_space horizon_s={horizon_s}, window_s={window_s}, min_span_s={min_span_s}: need horizon_s > 0 "
                "and 0 <= min_span_s <= window_s",
                hint="e.g. horizon_s=14400, window_s=1800, min_span_s=300",
            )
        if min_points < 3:
            raise ConfigError(f"disk_space min_points={min_points} must be >= 3 to judge a fit", hint="e.g. 5")
        if min_trend_t <= 0:
            raise ConfigError(f"disk_space min_trend_t={min_trend_t} must be > 0", hint="e.g. 4")
        if clear_margin < 0:
            raise ConfigError(
                f"disk_space clear_margin={clear_margin} must be >= 0",
                hint="e.g. 0.02: an episode at a 5% floor ends at 7% free",
            )
        self.min_free_fraction = min_free_fraction
        self.horizon = timedelta(seconds=horizon_s)
        self.window = timedelta(seconds=window_s)
        self.min_points = min_points
        self.min_span_s = min_span_s
        self.min_trend_t = min_trend_t
        self.clear_margin = clear_margin
        self._clock = clock
        self._paths: dict[str, _PathState] = {}
        self._recovered: list[Recovery] = []

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        now = self._clock()
        latest: dict[str, Signal] = {}
        for signal in signals:
            if (signal.kind is SignalKind.METRIC and signal.attrs.get(keys.METRIC) == METRIC
                    and signal.value is not None):
                latest[signal.subject.id] = signal  # several samples of one path in one poll: the last counts
        findings: list[Finding] = []
        for path, signal in latest.items():
            state = self._paths.setdefault(path, _PathState())
            total = float(signal.attrs.get(keys.TOTAL_BYTES) or 0)
            if total <= 0:
                continue  # a pseudo file system without a size: nothing to run out of
            point = _Point(signal.observed_at, float(signal.value or 0.0), total, signal.source)
            history = state.history
            if history and (history[-1].total != total or point.at <= history[-1].at):
                if history[-1].total != total:
                    history.clear()  # resized or a different file system: the old trend says nothing now
                else:
                    continue  # a repeated or out-of-order sample would skew the fit
            history.append(point)
            while history and now - history[0].at > self.window:
                history.popleft()

            claims = {THRESHOLD: self._threshold(signal, point, now), TREND: self._trend(signal, state, now)}
            for kind, finding in claims.items():
                if finding is not None and kind not in state.active:
                    state.active[kind] = finding
                    findings.append(finding)
            if state.active and not any(claims.values()):
                self._end_if_clear(signal, point, state, now)
        return findings

    def recoveries(self) -> list[Recovery]:
        """The reported episodes that ended since the last call (the second verb: see core.ports)."""
        done, self._recovered = self._recovered, []
        return done

    # -- recovery --------------------------------------------------------------------------------------

    def _end_if_clear(self, signal: Signal, point: _Point, state: _PathState, now: datetime) -> None:
        """End every open episode of the path when this sample shows it clear (see the module docstring)."""
        line = min(1.0, self.min_free_fraction + self.clear_margin)  # an extreme floor: ends only when empty
        fraction = point.avail / point.total
        if fraction < line:
            return
        inodes_avail, inodes_total, inode_fraction = _inodes(signal)
        if inode_fraction is None:
            opened = state.active.get(THRESHOLD)
            if opened is not None and opened.attrs.get("low_inodes"):
                return  # inodes set it off and this sample does not count them
        elif inode_fraction < line:
            return
        trend = self._no_trend(state)
        if trend is None:
            return
        space = f"{_gb(point.avail)} of {_gb(point.total)} free ({fraction:.1%})"
        if inode_fraction is not None:
            space += f" and {int(inodes_avail):,} of {int(inodes_total):,} inodes ({inode_fraction:.1%})"
        reason = f"shared storage {signal.subject.id} has {space} again, over the {line:.0%} line; {trend}"
        for fingerprint in dict.fromkeys(f.fingerprint for f in state.active.values()):  # one: the path's
            self._recovered.append(Recovery(fingerprint=fingerprint, reason=reason, detector=self.name,
                                            observed_at=now))
        state.active.clear()

    def _no_trend(self, state: _PathState) -> str | None:
        """Words for "no trend to full" when the path's history shows none even on weaker evidence; None when it
        does, or when the history is too short to tell."""
        fit = self._judgeable_fit(state)
        if fit is None:
            return None
        over = f"over the last {fit.span_s / 60:.0f} min"
        if fit.slope >= 0:
            return f"free space not falling {over}"
        if fit.t_stat > -self.min_trend_t * _KEEP_T_FACTOR:
            return f"no clear decline of free space {over}"
        eta_s = fit.last.avail / -fit.slope
        if eta_s <= self.horizon.total_seconds() * _KEEP_HORIZON_FACTOR:
            return None
        return (f"falling {-fit.slope * 3600.0 / _GB:.2f} GB/hour {over}, full in about {eta_s / 3600:.1f} h, well "
                f"beyond the {self.horizon.total_seconds() / 3600:.1f} h horizon")

    def _judgeable_fit(self, state: _PathState) -> _Fit | None:
        """The fit of the path's window, or None when too few points or too short a span to judge."""
        points = list(state.history)
        if len(points) < self.min_points:
            return None
        fit = _fit(points)
        return fit if fit.span_s >= self.min_span_s else None

    # -- the two claims --------------------------------------------------------------------------------

    def _threshold(self, signal: Signal, point: _Point, now: datetime) -> Finding | None:
        path = signal.subject.id
        fraction = point.avail / point.total
        inodes_avail, inodes_total, inode_fraction = _inodes(signal)
        low_space = fraction < self.min_free_fraction
        low_inodes = inode_fraction is not None and inode_fraction < self.min_free_fraction
        if not (low_space or low_inodes):
            return None
        what = []
        if low_space:
            what.append(f"{_gb(point.avail)} of {_gb(point.total)} free ({fraction:.1%})")
        if low_inodes:
            what.append(f"{int(inodes_avail):,} of {int(inodes_total):,} inodes free ({inode_fraction:.1%})")
        evidence = [
            Evidence(
                source=point.source,
                text=f"{path}: {point.avail:.0f} bytes available to users of {point.total:.0f} ({fraction:.2%})",
                at=point.at,
                value=point.avail,
            )
        ]
        if inode_fraction is not None:
            evidence.append(
                Evidence(
                    source=point.source,
                    text=f"{path}: {int(inodes_avail)} inodes available of {int(inodes_total)} ({inode_fraction:.2%})",
                    at=point.at,
                    value=inodes_avail,
                )
            )
        summary = (
            f"shared storage {path} is nearly full: {' and '.join(what)}, under the "
            f"{self.min_free_fraction:.0%} floor; writes of checkpoints and logs there will fail with ENOSPC"
        )
        return self._finding(
            signal, THRESHOLD, Severity.CRITICAL, "StorageNearlyFull", summary, evidence, point.at, now,
            attrs={
                "free_fraction": round(fraction, 6),
                "inodes_total": int(inodes_total),
                "inodes_avail": int(inodes_avail) if inodes_avail is not None else None,
                "inode_free_fraction": round(inode_fraction, 6) if inode_fraction is not None else None,
                "low_space": low_space,
                "low_inodes": low_inodes,
                "min_free_fraction": self.min_free_fraction,
            },
            action=(
                f"Free space on {path} now (old checkpoints under jobs/*/checkpoints, stale logs and caches"
                f"{', and many small files: the inode table is nearly full' if low_inodes else ''}) or grow the "
                "volume; jobs that fail to write a checkpoint must resume from the last complete one."
            ),
        )

    def _trend(self, signal: Signal, state: _PathState, now: datetime) -> Finding | None:
        fit = self._judgeable_fit(state)
        if fit is None or fit.slope >= 0 or fit.t_stat > -self.min_trend_t:
            return None  # too little to judge, flat, growing, or a slope the jitter could explain
        last = fit.last
        eta_s = max(0.0, last.avail / -fit.slope)
        if eta_s > self.horizon.total_seconds():
            return None
        eta = last.at + timedelta(seconds=eta_s)
        rate_gb_h = -fit.slope * 3600.0 / _GB
        path = signal.subject.id
        evidence = [
            Evidence(
                source=p.source,
                text=f"{path}: {p.avail:.0f} bytes available to users of {p.total:.0f} ({p.avail / p.total:.2%})",
                at=p.at,
                value=p.avail,
            )
            for p in (fit.first, last)
        ]
        summary = (
            f"shared storage {path} is filling up: {_gb(last.avail)} free of {_gb(last.total)} "
            f"({last.avail / last.total:.1%}), falling {rate_gb_h:.2f} GB/hour over the last "
            f"{fit.span_s / 60:.0f} min; full in about {eta_s / 3600:.1f} h (around "
            f"{eta.isoformat(timespec='minutes')})"
        )
        return self._finding(
            signal, TREND, Severity.WARNING, "StorageFillingUp", summary, evidence, fit.first.at, now,
            attrs={
                "rate_bytes_per_s": -fit.slope,
                "rate_gb_per_hour": round(rate_gb_h, 4),
                "eta": eta.isoformat(),
                "eta_s": round(eta_s, 1),
                "fit_points": fit.points,
                "fit_span_s": round(fit.span_s, 1),
                "fit_t_stat": fit.t_stat if math.isfinite(fit.t_stat) else None,
                "horizon_s": self.horizon.total_seconds(),
            },
            action=(
                f"Find what is writing to {path} (checkpoints saved too often or never pruned, runaway logs) and "
                "free space or grow the volume before it fills; at exhaustion every job writing there fails with "
                "ENOSPC."
            ),
        )

    def _finding(
        self,
        signal: Signal,
        kind: str,
        severity: Severity,
        reason: str,
        summary: str,
        evidence: list[Evidence],
        first_seen: datetime,
        now: datetime,
        *,
        attrs: dict,
        action: str,
    ) -> Finding:
        subject = Subject(kind=signal.subject.kind, id=signal.subject.id, name=signal.subject.name)
        a = signal.attrs
        return Finding(
            category=Category.DISK_FULL,
            reason=reason,
            subject=subject,
            summary=summary,
            severity=severity,
            confidence=1.0 if kind == THRESHOLD else 0.7,
            evidence=tuple(evidence),
            first_seen=first_seen,
            detected_at=now,
            recommended_action=action,
            fingerprint=fingerprint_of(Category.DISK_FULL, subject),  # one incident per path, both kinds
            attrs={
                "path": subject.id,
                "kind": kind,
                "avail_bytes": a.get("avail_bytes", signal.value),
                "total_bytes": a.get("total_bytes"),
                "free_bytes": a.get("free_bytes"),
                "used_fraction": a.get("used_fraction"),
                **attrs,
            },
        )
