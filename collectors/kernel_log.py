"""The kernel log of the node this process runs on, read incrementally: Xid, NVRM, ECC, PCIe AER, InfiniBand link
and OOM-killer lines appear there first, often before any job log says anything.

Where from (`Settings.kernel_log`):
- a path (a kern.log, or a file a sidecar or a test writes): tailed like any log file (collectors.logs.LogTailer:
  saved offsets, rotation, bounded lines, the backlog of a first sight dated and old lines marked history);
- "auto": the first source this process may read: /dev/kmsg (the kernel's own record buffer), then
  `journalctl -k`, then /var/log/kern.log and /var/log/messages (`pick_source` says which and why not the others);
- "off": nothing.

/dev/kmsg gives one record per read(): `<prio>,<seq>,<usec since boot>,<flags>[,...];<message>`, then continuation
lines ` KEY=value` (dropped). The descriptor is kept open between polls, so each poll reads only what is new; the
last sequence number is saved with the boot id, so a restart goes on after it (and a reboot, which restarts the
numbers, starts over). Records the ring buffer overwrote before they were read make read() fail with EPIPE; they
are counted (`lost`) and reading goes on. A record's time is boot time + its microseconds; on a first start the
buffer's backlog older than the history window is history (no news, as with any log's backlog).

`journalctl -k -o json` is read after the saved cursor (`--after-cursor`), at most `max_records` entries a poll.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from collectors.history import HistoryMarker
from collectors.logs import LogTailer
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.errors import ConfigError, SourceUnavailable
from core.limits import MAX_LINE_CHARS
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

STREAM = "kernel"  # detectors/rules/*.yaml `source` for rules that only the kernel prints
KMSG = "/dev/kmsg"
LOG_FILES = ("/var/log/kern.log", "/var/log/messages")
RECORD_BYTES = 8192  # the kernel's own limit for one /dev/kmsg record (CONSOLE_EXT_LOG_MAX)


@dataclass(frozen=True)
class KernelLine:
    """One kernel log line: `seq` counts within its source (a kmsg sequence number, a journal entry, a file's line
    number); `written_at` where the source dates it."""

    seq: int
    text: str
    written_at: datetime | None = None
    attrs: dict[str, Any] | None = None  # LINE_TIME / HISTORY where the reader dated a backlog


class KernelLogSource(Protocol):
    name: str

    def read(self) -> list[KernelLine]: ...

    def close(self) -> None: ...


def read_boot_time(stat_path: str = "/proc/stat") -> datetime | None:
    """When the machine booted (`btime` of /proc/stat), to date kmsg records; None where it cannot be read."""
    try:
        for line in Path(stat_path).read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), tz=timezone.utc)
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def parse_kmsg_record(raw: bytes) -> tuple[int, int, int, str] | None:
    """(priority, seq, usec since boot, message) of one /dev/kmsg record; None for anything else."""
    head, sep, rest = raw.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    if len(fields) < 3:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    message = rest.split(b"\n", 1)[0]  # continuation lines (" KEY=value") follow the first newline
    text = message[:MAX_LINE_CHARS].decode("utf-8", "replace")
    # the kernel escapes non-printable bytes as \xNN; a NUL or CR left would only confuse the rules
    return prio, seq, usec, text.replace("\r", "").replace("\x00", "")


class KmsgSource:
    """New records of /dev/kmsg after the saved (boot id, seq); see the module docstring."""

    def __init__(
        self,
        offsets: OffsetStore,
        *,
        path: str = KMSG,
        history_window_s: float = 900.0,
        max_records: int = 20000,
        boot_time: datetime | None = None,
        boot_id: str | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.name = path
        self.path = path
        self.offsets = offsets
        self.max_records = max_records
        self.window = timedelta(seconds=history_window_s)
        self.boot_time = boot_time if boot_time is not None else read_boot_time()
        self.boot_id = boot_id if boot_id is not None else read_boot_id()
        self._clock = clock
        self._fd: int | None = None
        self.lost = 0  # records the ring overwrote before they were read

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> list[KernelLine]:
        saved = self.offsets.get(self.path) or {}
        after = saved.get("seq") if saved.get("boot_id") == self.boot_id else None
        first_sight = after is None
        fd = self._open()
        now = self._clock()
        lines: list[KernelLine] = []
        last = after
        while len(lines) < self.max_records:
            try:
                raw = os.read(fd, RECORD_BYTES)
            except BlockingIOError:
                break  # nothing more for now
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring overwrote records before we read them
                    self.lost += 1
                    continue
                raise
            if not raw:
                break
            record = parse_kmsg_record(raw)
            if record is None:
                continue
            _, seq, usec, text = record
            if after is not None and seq <= after:
                continue  # read before a restart (the descriptor starts at the oldest record kept)
            written = self.boot_time + timedelta(microseconds=usec) if self.boot_time else None
            attrs = None
            if first_sight and written is not None:
                attrs = {keys.LINE_TIME: written.isoformat(), keys.HISTORY: written < now - self.window}
            lines.append(KernelLine(seq=seq, text=text, written_at=written, attrs=attrs))
            last = seq
        if last is not None:
            self.offsets.set(self.path, {"seq": last, "boot_id": self.boot_id})
        return lines


class JournalSource:
    """`journalctl -k` entries after the saved cursor; see the module docstring."""

    def __init__(
        self,
        offsets: OffsetStore,
        *,
        journalctl: str = "journalctl",
        history_window_s: float = 900.0,
        max_records: int = 20000,
        timeout_s: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.name = "journalctl -k"
        self.journalctl = journalctl
        self.offsets = offsets
        self.max_records = max_records
        self.timeout_s = timeout_s
        self.window = timedelta(seconds=history_window_s)
        self._clock = clock
        self._seq = 0

    def close(self) -> None:
        return None

    def read(self) -> list[KernelLine]:
        saved = self.offsets.get(self.name) or {}
        cursor = saved.get("cursor")
        # line numbers go on across restarts, as a file's do (the central tells lines apart by them)
        self._seq = max(self._seq, int(saved.get("seq") or 0))
        args = [self.journalctl, "-k", "-o", "json", "--no-pager", "-n", str(self.max_records)]
        args += ["--after-cursor", cursor] if cursor else ["-b"]
        done = subprocess.run(args, capture_output=True, timeout=self.timeout_s, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(args[:3])} exited {done.returncode}: "
                          f"{done.stderr.decode('utf-8', 'replace').strip()[:300]}")
        now = self._clock()
        lines: list[KernelLine] = []
        for raw in done.stdout.splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald gives non-UTF-8 messages as byte arrays
                message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
            if not isinstance(message, str):
                continue
            written = None
            try:
                written = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, tz=timezone.utc)
            except (KeyError, ValueError, TypeError):
                pass
            attrs = None
            if cursor is None and written is not None:
                attrs = {keys.LINE_TIME: written.isoformat(), keys.HISTORY: written < now - self.window}
            self._seq += 1
            lines.append(KernelLine(seq=self._seq, text=message[:MAX_LINE_CHARS], written_at=written, attrs=attrs))
            cursor = entry.get("__CURSOR") or cursor
        if cursor:
            self.offsets.set(self.name, {"cursor": cursor, "seq": self._seq})
        return lines


class FileSource:
    """A kernel log written to a file (kern.log, a sidecar's copy, a test's file), tailed like any log."""

    def __init__(self, path: str | Path, offsets: OffsetStore, *, history_window_s: float = 900.0,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.name = str(path)
        self.path = Path(path)
        self.tailer = LogTailer(offsets, history=HistoryMarker(history_window_s, clock=clock))

    def close(self) -> None:
        self.tailer.close()

    def read(self) -> list[KernelLine]:
        if not self.path.exists():
            return []
        lines, _ = self.tailer.read(self.path)
        return [KernelLine(seq=line.line_no, text=line.text, attrs=line.age) for line in lines]


@dataclass(frozen=True)
class SourceChoice:
    """The kernel log source picked, or None with why each candidate was passed over."""

    source: KernelLogSource | None
    tried: tuple[str, ...]


def _kmsg_readable(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    try:
        os.read(fd, RECORD_BYTES)
    except BlockingIOError:
        pass  # readable, just empty now
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            return f"{path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def pick_source(setting: str, offsets: OffsetStore, *, history_window_s: float = 900.0,
                kmsg: str = KMSG, log_files: tuple[str, ...] = LOG_FILES,
                journalctl: str | None = None) -> SourceChoice:
    """The source `setting` names ("off", "auto" or a path); see the module docstring."""
    setting = (setting or "off").strip()
    if setting == "off":
        return SourceChoice(None, ("kernel_log is off",))
    if setting != "auto":
        path = Path(setting)
        if path.is_dir():
            raise ConfigError(f"kernel_log {setting} is a folder", hint="give the kernel log file, 'auto' or 'off'")
        return SourceChoice(FileSource(path, offsets, history_window_s=history_window_s), ())
    tried: list[str] = []
    why = _kmsg_readable(kmsg)
    if why is None:
        return SourceChoice(KmsgSource(offsets, path=kmsg, history_window_s=history_window_s), tuple(tried))
    tried.append(why)
    journal = journalctl if journalctl is not None else shutil.which("journalctl")
    if journal:
        probe = subprocess.run([journal, "-k", "-n", "1", "-o", "json", "--no-pager"], capture_output=True,
                               timeout=10, check=False)
        if probe.returncode == 0 and probe.stdout.strip():
            return SourceChoice(JournalSource(offsets, journalctl=journal, history_window_s=history_window_s),
                                tuple(tried))
        tried.append(f"journalctl -k: {probe.stderr.decode('utf-8', 'replace').strip()[:200] or 'no entries'}")
    else:
        tried.append("journalctl: not installed")
    for name in log_files:
        if os.access(name, os.R_OK):
            return SourceChoice(FileSource(name, offsets, history_window_s=history_window_s), tuple(tried))
        tried.append(f"{name}: not readable")
    return SourceChoice(None, tuple(tried))


def primary_ip() -> str:
    """This host's address on its default route (what Ray advertises by default); 127.0.0.1 where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # UDP: no packet is sent, the kernel only picks a route
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class KernelLogCollector:
    """The node's kernel log lines as LOG_LINE signals of stream "kernel", about the node (subject: its Ray node
    id, named by its IP), so the log rules file Xid, ECC, AER and OOM-killer lines under the node."""

    name = "kernel_log"

    def __init__(self, source: KernelLogSource, offsets: OffsetStore, *, node_id: str, node_ip: str,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.source = source
        self.offsets = offsets
        self.node_id = node_id
        self.node_ip = node_ip
        self._clock = clock

    def close(self) -> None:
        self.source.close()

    def commit(self) -> None:
        """Save the offsets this collector's reads moved (core.ports.Committing: after the tick's findings are
        filed)."""
        self.offsets.save()

    def collect(self) -> list[Signal]:
        try:
            lines = self.source.read()
        except (OSError, subprocess.SubprocessError) as exc:
            raise SourceUnavailable("the kernel log", self.source.name, str(exc),
                                    hint="check this process may read it (root or CAP_SYSLOG for /dev/kmsg, the "
                                    "systemd-journal group for journalctl), or set kernel_log to a file") from None
        now = self._clock()
        subject = Subject(kind=SubjectKind.NODE, id=self.node_id, name=self.node_ip)
        return [
            Signal(
                kind=SignalKind.LOG_LINE,
                source=f"kernel:{self.source.name}",
                subject=subject,
                observed_at=now,
                text=line.text,
                line=line.seq,
                attrs={keys.STREAM: STREAM, keys.FILE: self.source.name, keys.NODE_ID: self.node_id,
                       keys.NODE_IP: self.node_ip, **(line.attrs or {})},
            )
            for line in lines
        ]
