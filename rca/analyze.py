"""`argus analyze`'s logic: read one log in bounded memory, match the rules, classify.

Works on any file: binary bytes are decoded as UTF-8 with replacement, CRLF and a missing final newline
are fine, and a single huge line is cut while it is read, so memory stays bounded by the longest kept
line, not the file. Lines as a cluster keeps them read like bare ones: colours, Docker's JSON, a container
runtime's timestamp, journald's header, Ray's worker prefix or a launcher's rank are looked past by the rules
(core.line_shapes; bench/rca_line_shapes.py measures it on the folds).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from core.limits import MAX_LINE_BYTES
from detectors.engine import RuleMatch, RuleSet, ScanStats
from rca.classify import classify

READ_CHUNK = 64 * 1024
__all__ = ["MAX_LINE_BYTES", "analyze_lines", "analyze_stream", "iter_lines"]
# Matches kept per rule: the earliest ones decide the cause; the rest would only cost memory.
KEEP_PER_RULE = 20
# What a stream's reader keeps of its end: a long last line (cut at MAX_LINE_BYTES) and blank lines after it.
TAIL_BYTES = 2 * MAX_LINE_BYTES


def iter_lines(stream: IO[bytes] | IO[str]) -> Iterator[str]:
    """Lines of a binary (or text) stream without line endings, each at most MAX_LINE_BYTES long."""
    pending = bytearray()
    dropping = False  # inside a line already cut: skip to its end
    while True:
        chunk = stream.read(READ_CHUNK)
        if not chunk:
            break
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", errors="surrogateescape")
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not dropping:
                room = MAX_LINE_BYTES - len(pending)
                pending += piece[:room]
                if len(piece) > room:
                    dropping = True
            if end < 0:
                break
            yield _decode(pending)
            pending.clear()
            dropping = False
            start = end + 1
    if pending or dropping:
        yield _decode(pending)


def _decode(raw: bytes | bytearray) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return bytes(raw).decode("utf-8", errors="replace")


def _as_text(lines: Iterable[bytes | str]) -> Iterator[str]:
    for line in lines:
        yield _decode(line) if isinstance(line, bytes | bytearray) else line


def analyze_stream(name: str, stream: IO[bytes], rules: RuleSet) -> dict[str, Any]:
    """Classify one log read from a binary stream; the fast path of `argus analyze` (same verdicts as
    `analyze_lines` over `iter_lines(stream)`). `name` is how the log is reported."""
    stats = ScanStats()
    kept = _TailKept(stream)
    return _verdict(name, rules.scan_stream(kept, source=name, stats=stats), lambda: stats.lines,
                    lambda: kept.last_line(stats.lines), rules)


def analyze_lines(name: str, lines: Iterable[bytes | str], rules: RuleSet) -> dict[str, Any]:
    """Classify one log given as lines. `name` is how the log is reported (its path, or "-" for stdin)."""
    counter = _Counter(_as_text(lines))
    return _verdict(name, rules.scan(counter, source=name), lambda: counter.count, lambda: counter.last, rules)


def _verdict(name: str, found: Iterable[RuleMatch], lines_scanned: Callable[[], int],
             last: Callable[[], tuple[int, str] | None], rules: RuleSet) -> dict[str, Any]:
    kept: dict[str, list[RuleMatch]] = defaultdict(list)
    for match in found:
        bucket = kept[match.rule.reason]
        if len(bucket) < KEEP_PER_RULE:
            bucket.append(match)
    matches = sorted((m for bucket in kept.values() for m in bucket), key=lambda m: m.line_no)
    matches += rules.ending(last(), name)  # the whole log was read: its last line is where it ended
    result = classify(matches, lines_scanned=lines_scanned())
    return {
        "path": name,
        "category": result.category.value,
        "summary": result.summary,
        "evidence": [{"line": line, "text": text} for _, line, text in result.evidence],
        "confidence": result.confidence,
        "recommended_action": result.recommended_action,
    }


class _Counter:
    """Passes lines through and counts them, for the summary of a log where nothing matched, and keeps the last
    non-blank one (RuleSet.ending)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = lines
        self.count = 0
        self.last: tuple[int, str] | None = None

    def __iter__(self) -> Iterator[str]:
        for line in self._lines:
            self.count += 1
            if line.strip():
                self.last = (self.count, line)
            yield line


class _TailKept:
    """A binary stream read through, keeping its last bytes: enough for its last non-blank line (cut as the scan
    cuts a long line) after any blank lines."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._tail = b""

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", errors="surrogateescape")
        if chunk:
            self._tail = (self._tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]  # never a copy of the whole block
        return chunk

    def last_line(self, lines_total: int) -> tuple[int, str] | None:
        """The last non-blank line and its number, given how many lines the scan counted."""
        pieces = self._tail.split(b"\n")
        if self._tail.endswith(b"\n"):
            pieces.pop()
        for back, piece in enumerate(reversed(pieces)):
            if piece.strip():
                return lines_total - back, _decode(piece[:MAX_LINE_BYTES])
        return None
