"""Training logs on shared storage, read incrementally: `<shared_root>/jobs/<submission_id>/logs/**`.

Hostile input is expected, so reading is bounded everywhere:
- Each file is read from its saved offset, in chunks, at most `file_budget_bytes` per poll and
  `poll_budget_bytes` over all files (the start rotates, so one huge file cannot starve the others).
- Only complete lines are committed. An incomplete last line is read again on the next poll (at most
  `max_line_bytes`), so nothing is held between polls and a restart loses nothing.
- A line longer than `max_line_bytes` is cut: its head is emitted with `truncated=True`, the rest is
  skipped up to its newline without being held in memory (a 100 MB line costs one chunk of memory).
- Bytes that are not UTF-8 are replaced (U+FFFD), CR before LF is dropped, ANSI colour codes removed.
- A file's identity is its device and inode plus a hash of its first bytes. Another inode at the same
  path is a rotation: the old file is finished (found by the descriptor kept open, or by its inode in the
  same folder, e.g. `train.log.1`), its last partial line flushed, then the new one is read from 0.
  A file smaller than the offset, or whose first bytes changed, was truncated: read again from 0.
- A file seen for the first time (no saved offset) is read from 0, and what it held then is its backlog:
  those lines are dated and the ones older than the history window marked as history (collectors.history),
  however many polls reading the backlog takes. Lines written later, and files rotated or truncated while
  watched, are news and are not dated.

One module past 400 lines on purpose: the line splitter, the tailer and the job-log collector share the offsets'
state (offset, line count, identity, backlog) and the reading rules above; apart, each would need the others'
internals.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any

from loguru import logger

from collectors.history import HistoryMarker, saved_time
from collectors.offsets import OffsetStore
from core import signal_keys as keys
from core.errors import SourceUnavailable
from core.jobfolder import JobFolders
from core.limits import MAX_LINE_CHARS
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

CHUNK_BYTES = 64 * 1024
HEAD_BYTES = 64  # identity: a hash of this many first bytes
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_ANSI_BYTES = re.compile(_ANSI.pattern.encode("ascii"))


@dataclass(frozen=True)
class LogLine:
    """One line of a log file: `line_no` counts from 1 in that file, across polls and restarts. `backlog`: the
    file held it when first seen; `age`: the signal attrs saying when it was written and whether that is history
    (collectors.history), for backlog lines when the reader dates them."""

    source: str
    line_no: int
    text: str
    truncated: bool = False
    backlog: bool = False
    age: dict[str, Any] | None = None


@dataclass(frozen=True)
class LogBlock:
    """Complete lines of a log file as read, raw bytes (each line ends with a newline, CR and invalid UTF-8 kept):
    `first_line` is the number of its first line. For scanners that gate whole blocks (`LogTailer.read_block`);
    a line taken out of it reads as `decode_line` makes it."""

    source: str
    first_line: int
    data: bytes


def _has_line_over(data: bytes, end: int, cap: int) -> bool:
    """Whether a line of data[:end] is longer than `cap` bytes (split in C, and only where one could be)."""
    return end > cap and max(map(len, data[:end].split(b"\n"))) > cap


def decode_line(raw: bytes) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    text = raw.decode("utf-8", errors="replace")
    return _ANSI.sub("", text) if "\x1b" in text else text


class LineSplitter:
    """Bytes in, complete lines out, in bounded memory; `consumed` counts the bytes it has settled.

    Settled bytes are complete lines, skipped bytes of an over-long line, and the emitted head of one.
    What is not settled (an incomplete last line) is the caller's to read again later.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_CHARS, line_no: int = 0, skipping: bool = False) -> None:
        self.max_line_bytes = max_line_bytes
        self.line_no = line_no
        self.skipping = skipping  # inside an over-long line whose head was already emitted
        self.consumed = 0
        self._pending = bytearray()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def feed(self, data: bytes) -> list[tuple[int, str, bool]]:
        out: list[tuple[int, str, bool]] = []
        start = 0
        n = len(data)
        while start < n:
            if self.skipping:
                nl = data.find(b"\n", start)
                if nl < 0:
                    self.consumed += n - start
                    return out
                self.consumed += nl + 1 - start
                start = nl + 1
                self.skipping = False
                continue
            nl = data.find(b"\n", start)
            end = n if nl < 0 else nl
            room = self.max_line_bytes - len(self._pending)
            if end - start > room:  # the line outgrew the cap: emit its head, skip the rest
                self._pending += data[start : start + room]
                self.line_no += 1
                out.append((self.line_no, decode_line(bytes(self._pending)), True))
                self.consumed += len(self._pending)
                self._pending.clear()
                self.skipping = True
                start += room
                continue
            self._pending += data[start:end]
            if nl < 0:
                return out
            self.line_no += 1
            out.append((self.line_no, decode_line(bytes(self._pending)), False))
            self.consumed += len(self._pending) + 1
            self._pending.clear()
            start = nl + 1
        return out

    def flush(self) -> list[tuple[int, str, bool]]:
        """The incomplete last line as a line of its own: for a file that will never grow again."""
        if not self._pending:
            return []
        self.line_no += 1
        line = (self.line_no, decode_line(bytes(self._pending)), False)
        self.consumed += len(self._pending)
        self._pending.clear()
        return [line]


def _head_hash(fd: int, length: int) -> str:
    return hashlib.sha1(os.pread(fd, length, 0)).hexdigest()


class LogTailer:
    """Reads new complete lines of local files from saved offsets; see the module docstring."""

    def __init__(
        self,
        offsets: OffsetStore,
        *,
        max_line_bytes: int = MAX_LINE_CHARS,
        chunk_bytes: int = CHUNK_BYTES,
        file_budget_bytes: int = 8 * 1024 * 1024,
        max_open_files: int = 128,
        history: HistoryMarker | None = None,
    ) -> None:
        """`history`: dates the backlog of files seen for the first time; None reads every line as news."""
        self.offsets = offsets
        self.history = history
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.file_budget_bytes = file_budget_bytes
        self.max_open_files = max_open_files
        # path -> (fd, dev, ino): kept open so a file rotated away can still be finished
        self._open: OrderedDict[str, tuple[int, int, int]] = OrderedDict()

    def close(self) -> None:
        for fd, _, _ in self._open.values():
            os.close(fd)
        self._open.clear()

    def read(self, path: Path | str, budget: int | None = None) -> tuple[list[LogLine], int]:
        """New lines of `path` and the bytes read; updates the offsets (the caller saves them)."""
        lines, block, used = self._read(path, budget, blocks=False)
        assert block is None
        return lines, used

    def read_block(self, path: Path | str, budget: int | None = None) -> tuple[list[LogLine], LogBlock | None, int]:
        """What `read` reads, for a caller that scans bytes blocks (a node agent): the new complete lines as one
        block of bytes (ANSI colour codes taken out) where that is the same thing, else as lines. Lines come back,
        and no block, for what needs a line at a time: a rotated file's rest, a first sight's backlog (dated), an
        over-long line. Updates the offsets like `read`."""
        return self._read(path, budget, blocks=True)

    def _read(
        self, path: Path | str, budget: int | None, *, blocks: bool
    ) -> tuple[list[LogLine], LogBlock | None, int]:
        key = os.path.abspath(path)
        # at least a whole line's worth: with less, a line longer than the budget is never finished nor cut (the
        # offset would stay before it for good)
        budget = max(self.file_budget_bytes if budget is None else budget, self.max_line_bytes + 1)
        try:
            fd, dev, ino = self._fd(key)
        except FileNotFoundError:
            return [], None, 0
        except OSError as exc:
            logger.warning("cannot open log file {}: {}", key, exc)
            return [], None, 0
        state = self.offsets.get(key)
        first_sight = state is None
        lines: list[LogLine] = []
        spent = 0
        if state is not None and (state.get("dev"), state.get("ino")) != (dev, ino):
            old, spent = self._finish_rotated(key, state, budget)
            lines += old
            state = None
        size = os.fstat(fd).st_size
        if state is not None:
            head_len = int(state.get("head_len", 0))
            if size < int(state["offset"]) or (head_len and _head_hash(fd, head_len) != state.get("head")):
                logger.info("log file {} was truncated or rewritten; reading it again from the start", key)
                state = None
        if state is None:
            state = {"dev": dev, "ino": ino, "offset": 0, "line": 0, "skipping": False, "head": "", "head_len": 0}
            if first_sight and self.history is not None:
                state["backlog"] = size  # what the file held when first seen: dated, maybe history
        if int(state["offset"]) >= size:
            self.offsets.set(key, state)
            return lines, None, spent
        block, used = self._read_raw(fd, key, state, max(0, budget - spent)) if blocks and not lines else (None, 0)
        if block is None:
            new, used = self._read_from(fd, key, state, max(0, budget - spent), final=False)
            lines += new
        if int(state["head_len"]) < HEAD_BYTES:
            state["head_len"] = min(HEAD_BYTES, os.fstat(fd).st_size)
            state["head"] = _head_hash(fd, state["head_len"])
        self.offsets.set(key, state)
        return lines, block, spent + used

    def _read_raw(self, fd: int, source: str, state: dict[str, Any], budget: int) -> tuple[LogBlock | None, int]:
        """The complete lines from the offset as one block and the bytes they took (the state moved past them), or
        None where the line path must read: see `read_block`. A block is at most `budget` bytes and holds no line
        the splitter would cut (a longer one leaves it to the line path); ANSI colour codes are taken out of it."""
        if state.get("skipping") or int(state.get("backlog", 0)) > int(state["offset"]):
            return None, 0
        state.pop("backlog", None)  # read (or empty when first seen): what comes now is news
        state.pop("backlog_at", None)
        offset = int(state["offset"])
        data = os.pread(fd, min(budget, self.file_budget_bytes), offset)
        end = data.rfind(b"\n")
        if end < 0 or _has_line_over(data, end, self.max_line_bytes):
            return None, 0
        data = data[: end + 1]
        first = int(state["line"]) + 1
        state.update(offset=offset + len(data), line=int(state["line"]) + data.count(b"\n"))
        # a colour code holds no newline, so the lines stay where they were
        return LogBlock(source, first, _ANSI_BYTES.sub(b"", data) if b"\x1b" in data else data), len(data)

    def _read_from(
        self, fd: int, source: str, state: dict[str, Any], budget: int, *, final: bool
    ) -> tuple[list[LogLine], int]:
        splitter = LineSplitter(
            max_line_bytes=self.max_line_bytes, line_no=int(state["line"]), skipping=bool(state["skipping"])
        )
        offset = int(state["offset"])
        backlog_end = int(state.get("backlog", 0))
        pos, raw, backlog = offset, [], 0
        while pos - offset < budget:
            chunk = os.pread(fd, min(self.chunk_bytes, budget - (pos - offset)), pos)
            if not chunk:
                break
            # to a chunk's precision: a line that began before the backlog's end and ends in a later chunk is news
            in_backlog = pos < backlog_end
            pos += len(chunk)
            fed = splitter.feed(chunk)
            raw += fed
            backlog += len(fed) if in_backlog else 0  # so backlog lines are a prefix of `raw`
        if final and not chunk_left(fd, pos):
            raw += splitter.flush()
        state.update(offset=offset + splitter.consumed, line=splitter.line_no, skipping=splitter.skipping)
        ages = self._date_backlog(fd, state, [text for _, text, _ in raw[:backlog]])
        if not backlog:  # the live path: nothing to date
            return [LogLine(source, n, text, cut) for n, text, cut in raw], pos - offset
        lines = [LogLine(source, n, text, cut, i < backlog, ages[i] if i < len(ages) else None)
                 for i, (n, text, cut) in enumerate(raw)]
        return lines, pos - offset

    def _date_backlog(self, fd: int, state: dict[str, Any], texts: list[str]) -> list[dict[str, Any]]:
        """The age attrs of a file's backlog lines (none without a history marker); the state carries the last
        dated time to the next part of the backlog, and forgets the backlog once it is read."""
        ages: list[dict[str, Any]] = []
        if texts and self.history is not None:
            modified = datetime.fromtimestamp(os.fstat(fd).st_mtime, tz=timezone.utc)
            ages, last = self.history.mark(texts, modified_at=modified, carried=saved_time(state.get("backlog_at")))
            state["backlog_at"] = last.isoformat() if last else None
        if "backlog" in state and int(state["offset"]) >= int(state["backlog"]):
            state.pop("backlog")
            state.pop("backlog_at", None)
        return ages

    def _finish_rotated(self, key: str, state: dict[str, Any], budget: int) -> tuple[list[LogLine], int]:
        """Read what is left of the file that used to be at `key`, if it can still be found."""
        old = self._find_old(key, int(state.get("dev", -1)), int(state.get("ino", -1)))
        if old is None:
            logger.info("log file {} was rotated and its old file is gone; reading the new one from 0", key)
            return [], 0
        fd, where, close = old
        try:
            lines, used = self._read_from(fd, where, dict(state), budget, final=True)
            if chunk_left(fd, int(state["offset"]) + used):
                logger.warning("rotated log {} has more than this poll's budget left; the rest is skipped", where)
            return lines, used
        finally:
            if close:
                os.close(fd)

    def _find_old(self, key: str, dev: int, ino: int) -> tuple[int, str, bool] | None:
        kept = self._open.get(f"{key}\0old")
        if kept and (kept[1], kept[2]) == (dev, ino):
            self._open.pop(f"{key}\0old")
            return kept[0], key, True
        folder = os.path.dirname(key)
        try:
            with os.scandir(folder) as entries:
                for n, entry in enumerate(entries):
                    if n > 10_000:
                        break
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == (dev, ino) and entry.is_file(follow_symlinks=False):
                        return os.open(entry.path, os.O_RDONLY), entry.path, True
        except OSError:
            return None
        return None

    def _fd(self, key: str) -> tuple[int, int, int]:
        st = os.stat(key)
        kept = self._open.get(key)
        if kept is not None:
            if (kept[1], kept[2]) == (st.st_dev, st.st_ino):
                self._open.move_to_end(key)
                return kept
            # rotated: keep the old descriptor until the old file is finished
            self._open.pop(key)
            previous = self._open.pop(f"{key}\0old", None)
            if previous:
                os.close(previous[0])
            self._open[f"{key}\0old"] = kept
        fd = os.open(key, os.O_RDONLY)
        st = os.fstat(fd)
        self._open[key] = (fd, st.st_dev, st.st_ino)
        while len(self._open) > self.max_open_files:
            _, (old_fd, _, _) = self._open.popitem(last=False)
            os.close(old_fd)
        return self._open[key]

    def forget(self, path: Path | str) -> None:
        key = os.path.abspath(path)
        for k in (key, f"{key}\0old"):
            kept = self._open.pop(k, None)
            if kept:
                os.close(kept[0])
        self.offsets.discard(key)


def chunk_left(fd: int, pos: int) -> bool:
    return os.fstat(fd).st_size > pos


class JobLogsCollector:
    """LOG_LINE signals from `<shared_root>/jobs/<submission_id>/logs/**/*.{log,txt,out,err}`."""

    name = "job_logs"

    def __init__(
        self,
        shared_root: Path,
        offsets: OffsetStore,
        *,
        poll_budget_bytes: int = 32 * 1024 * 1024,
        file_budget_bytes: int = 8 * 1024 * 1024,
        max_line_bytes: int = MAX_LINE_CHARS,
        suffixes: tuple[str, ...] = LOG_SUFFIXES,
        history_window_s: float = 900.0,
        log_zone: tzinfo | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`history_window_s`: a backlog line written longer ago than this is history (Settings.history_window_s);
        `log_zone`: the zone of log stamps that name none, by default this host's."""
        self.shared_root = Path(shared_root)
        self.offsets = offsets
        self.poll_budget_bytes = poll_budget_bytes
        self.suffixes = suffixes
        self._clock = clock
        history = HistoryMarker(history_window_s, clock=clock, tz=log_zone)
        self.tailer = LogTailer(offsets, max_line_bytes=max_line_bytes, file_budget_bytes=file_budget_bytes,
                                history=history)
        self._turn = 0

    def discover(self) -> list[tuple[str, Path]]:
        """(submission_id, file) for every log file under the jobs folder, sorted."""
        folders = JobFolders(self.shared_root)
        jobs = folders.jobs_dir
        if not jobs.is_dir():
            raise SourceUnavailable(
                "shared storage",
                str(jobs),
                "the jobs folder does not exist",
                hint="mount the shared root, or point ARGUS_SHARED_ROOT at the folder that holds jobs/",
            )
        found: list[tuple[str, Path]] = []
        for job in folders.all():
            if not job.logs.is_dir():
                continue
            for folder, _, names in os.walk(job.logs):
                for name in names:
                    if name.endswith(self.suffixes):
                        found.append((job.submission_id, Path(folder) / name))
        found.sort(key=lambda item: str(item[1]))
        return found

    def commit(self) -> None:
        """Save the offsets this collector's reads moved (core.ports.Committing: after the tick's findings are
        filed)."""
        self.offsets.save()

    def collect(self) -> list[Signal]:
        files = self.discover()
        now = self._clock()
        signals: list[Signal] = []
        if files:
            start = self._turn % len(files)
            self._turn += 1
            left = self.poll_budget_bytes
            for submission_id, path in files[start:] + files[:start]:
                if left <= 0:
                    break
                lines, used = self.tailer.read(path, budget=min(left, self.tailer.file_budget_bytes))
                left -= used
                subject = Subject(kind=SubjectKind.JOB, id=submission_id)
                signals += [self._signal(line, subject, now) for line in lines]
        self._prune({os.path.abspath(p) for _, p in files})
        return signals

    def _prune(self, present: set[str]) -> None:
        for key in self.offsets.keys():
            if key not in present and not os.path.exists(key):
                self.tailer.forget(key)

    @staticmethod
    def _signal(line: LogLine, subject: Subject, now: datetime) -> Signal:
        return Signal(
            kind=SignalKind.LOG_LINE,
            source=line.source,
            subject=subject,
            observed_at=now,
            text=line.text,
            line=line.line_no,
            attrs={keys.STREAM: "job-logs", keys.FILE: line.source, keys.TRUNCATED: line.truncated, **(line.age or {})},
        )
