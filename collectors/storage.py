"""Free space and inodes of the shared storage (the NFS root holding jobs' checkpoints and logs), as Signals.

One METRIC signal `storage_free_bytes` per path per poll: value is the space a non-root user can still
write (statvfs f_bavail, what `df` calls Avail), attrs carry total/free/avail bytes, the used fraction as
`df` computes it, and the inode counts (a full inode table fails writes with ENOSPC too).

statvfs on a hard NFS mount whose server is gone blocks in the kernel, uninterruptibly, for as long as the
server stays away. So every call runs on a daemon thread and is waited for at most `timeout_s`; a call that
has not returned is left behind (it cannot be cancelled) and no second call is started for that path until
it returns, so a hung mount costs one parked thread, not one per poll. Daemon threads, not a
ThreadPoolExecutor: the executor joins its workers at interpreter exit, which would hang Argus's shutdown
on the dead mount.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from loguru import logger

from core import signal_keys as keys
from core.errors import ArgusError, ConfigError, SourceUnavailable
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

METRIC = keys.STORAGE_FREE_BYTES_METRIC
THING = "shared storage"
_HUNG_HINT = (
    "check the NFS server and this host's mount (`mount | grep nfs`, `dmesg | grep 'not responding'`); "
    "a hard mount blocks every reader until the server is back"
)


class _Probe:
    """One statvfs call running on its own daemon thread."""

    def __init__(self, statvfs: Callable[[str], Any], path: Path) -> None:
        self.path = path
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._statvfs = statvfs
        threading.Thread(target=self._run, name=f"statvfs {path}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._statvfs(str(self.path))
        except BaseException as exc:  # handed to the poller, which wraps it into our error
            self.error = exc
        finally:
            self.done.set()


class SharedStorageCollector:
    """statvfs of each path, bounded in time; implements core.ports.Collector.

    A path that is missing, fails or does not answer within `timeout_s` is a SourceUnavailable naming the
    path. When every path fails, `collect()` raises (the pipeline marks the source down); when only some
    fail, it returns the others' signals and keeps the failures in `last_errors`.
    """

    name = "storage"

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        timeout_s: float = 5.0,
        statvfs: Callable[[str], Any] = os.statvfs,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ConfigError("no storage paths given", hint="pass the shared root, e.g. /mnt/shared")
        if timeout_s <= 0:
            raise ConfigError(f"storage timeout_s={timeout_s} must be > 0", hint="e.g. 5")
        self.timeout_s = timeout_s
        self._statvfs = statvfs
        self._clock = clock
        self._hung: dict[Path, _Probe] = {}  # calls that outlived their timeout and have not returned yet
        self.last_errors: dict[Path, ArgusError] = {}

    def collect(self) -> list[Signal]:
        now = self._clock()
        errors: dict[Path, ArgusError] = {}
        probes: dict[Path, _Probe] = {}
        for path in self.paths:
            hung = self._hung.get(path)
            if hung is not None and not hung.done.is_set():
                waited = time.monotonic() - hung.started
                errors[path] = self._not_responding(path, f"statvfs has not returned for {waited:.0f} s")
                continue
            self._hung.pop(path, None)
            probes[path] = _Probe(self._statvfs, path)

        deadline = time.monotonic() + self.timeout_s  # the probes run side by side: one timeout for all
        signals: list[Signal] = []
        for path, probe in probes.items():
            if not probe.done.wait(max(0.0, deadline - time.monotonic())):
                self._hung[path] = probe
                errors[path] = self._not_responding(path, f"statvfs did not return within {self.timeout_s:g} s")
            elif probe.error is not None:
                errors[path] = self._failed(path, probe.error)
            else:
                signals.append(self._signal(path, probe.result, now))

        for path, exc in errors.items():
            if str(self.last_errors.get(path)) != str(exc):  # once per change, not every poll
                logger.warning("storage path {} unavailable: {}", path, exc)
        self.last_errors = errors
        if errors and not signals:
            raise next(iter(errors.values())) if len(errors) == 1 else SourceUnavailable(
                THING, ", ".join(str(p) for p in errors), "; ".join(str(e) for e in errors.values())
            )
        return signals

    def _signal(self, path: Path, st: Any, now: datetime) -> Signal:
        frsize = st.f_frsize or st.f_bsize
        total = st.f_blocks * frsize
        free = st.f_bfree * frsize
        avail = st.f_bavail * frsize
        used = total - free
        # df's Use%: blocks reserved for root count neither as used nor as available to users.
        used_fraction = used / (used + avail) if used + avail > 0 else 0.0
        return Signal(
            kind=SignalKind.METRIC,
            source=f"statvfs:{path}",
            subject=Subject(kind=SubjectKind.CLUSTER, id=str(path), name=THING),
            observed_at=now,
            value=float(avail),
            attrs={
                keys.METRIC: METRIC,
                keys.PATH: str(path),
                keys.TOTAL_BYTES: total,
                "free_bytes": free,
                "avail_bytes": avail,
                "used_bytes": used,
                "used_fraction": used_fraction,
                keys.INODES_TOTAL: st.f_files,
                keys.INODES_FREE: st.f_ffree,
                keys.INODES_AVAIL: st.f_favail,
            },
        )

    def _not_responding(self, path: Path, detail: str) -> SourceUnavailable:
        return SourceUnavailable(THING, str(path), f"NFS mount not responding: {detail}", hint=_HUNG_HINT)

    def _failed(self, path: Path, exc: BaseException) -> SourceUnavailable:
        if isinstance(exc, FileNotFoundError):
            return SourceUnavailable(
                THING, str(path), "the path does not exist",
                hint="mount the shared storage there, or point ARGUS_SHARED_ROOT at where it is mounted",
            )
        if isinstance(exc, OSError):
            cause = exc.strerror or str(exc)  # ESTALE "Stale file handle", EIO, EACCES...
            return SourceUnavailable(
                THING, str(path), f"statvfs failed: {cause}",
                hint="check that the mount is healthy and readable by Argus (`mount`, `ls -ld`, dmesg)",
            )
        return SourceUnavailable(THING, str(path), f"statvfs failed: {type(exc).__name__}: {exc}")
