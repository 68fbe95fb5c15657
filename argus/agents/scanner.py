"""What a node agent reads on its own node, and which of it is worth sending to the central Argus.

It reads local files directly (no HTTP): the node's Ray log folder (raylet, GCS, job drivers, workers: the files
the central poller reads over HTTP, named by collectors.ray_logs.stream_of) tailed by collectors.logs.LogTailer
(saved offsets, rotation, bounded lines, a first sight's backlog dated and old lines marked history), and the
kernel log (collectors.kernel_log). Of every line it keeps only what the central needs:
- a line any log rule matches (the same rules as the central, so the central's detectors decide, not the agent),
  with up to `context_lines` lines before it from the same file (the report's evidence shows them);
- a progress line (the stall detector's patterns) of a job's driver or worker log: the stall detector learns each
  job's rhythm from them.
NCCL INFO floods, tqdm bars between steps and everything else stay on the node. A file's budget per poll bounds
what one burst costs a poll; what is left is read on the next poll (the file keeps it, nothing is lost).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectors.history import HistoryMarker
from collectors.kernel_log import STREAM as KERNEL_STREAM
from collectors.kernel_log import KernelLogSource
from collectors.logs import LogTailer
from collectors.offsets import OffsetStore
from collectors.ray_logs import KERNEL_FILE, AgentLineRecord, stream_of
from core import signal_keys as keys
from detectors.engine import RuleSet
from detectors.stall import DEFAULT_PATTERNS, ProgressPattern

PROGRESS_STREAMS = frozenset({"job-logs", "worker"})


def line_json(line: AgentLineRecord) -> dict[str, Any]:
    """A line as the batch route takes it (argus/api/agents.py), defaults left out."""
    out: dict[str, Any] = {"file": line.file, "line": line.line, "text": line.text}
    if line.truncated:
        out["truncated"] = True
    if line.line_time:
        out["line_time"] = line.line_time
    if line.history:
        out["history"] = True
    return out


def combined(patterns: Sequence[ProgressPattern]) -> re.Pattern[str] | None:
    """One regex for "is this a progress line" (the agent sends it; the stall detector reads the step): one search a
    line instead of one per pattern. Named groups become plain ones and a leading (?i) a scoped flag, so the
    alternatives keep their meaning side by side."""
    parts = []
    for p in patterns:
        body = re.sub(r"\(\?P<\w+>", "(?:", p.pattern)
        parts.append(f"(?i:{body[4:]})" if body.startswith("(?i)") else f"(?:{body})")
    return re.compile("|".join(parts)) if parts else None


class NodeScanner:
    """Reads the node's logs from saved offsets and picks the lines to send; see the module docstring."""

    def __init__(
        self,
        logs_dir: Path,
        offsets: OffsetStore,
        rules: RuleSet,
        *,
        kernel: KernelLogSource | None = None,
        patterns: Sequence[ProgressPattern] = DEFAULT_PATTERNS,
        context_lines: int = 3,
        file_budget_bytes: int = 8 * 1024 * 1024,
        poll_budget_bytes: int = 64 * 1024 * 1024,
        history_window_s: float = 900.0,
    ) -> None:
        self.logs_dir = Path(logs_dir)
        self.offsets = offsets
        self.rules = rules
        self.kernel = kernel
        self.progress = combined(patterns)
        self.context_lines = context_lines
        self.poll_budget_bytes = poll_budget_bytes
        self.tailer = LogTailer(offsets, file_budget_bytes=file_budget_bytes,
                                history=HistoryMarker(history_window_s))
        self._context: dict[str, deque[AgentLineRecord]] = {}
        self._turn = 0
        self.lines_read = 0
        self.bytes_read = 0

    def close(self) -> None:
        self.tailer.close()
        if self.kernel is not None:
            self.kernel.close()

    def files(self) -> list[Path]:
        try:
            names = os.listdir(self.logs_dir)
        except OSError:
            return []
        return sorted(self.logs_dir / name for name in names if stream_of(name) is not None)

    def poll(self) -> list[AgentLineRecord]:
        """The lines worth sending that were written since the last poll (offsets advance; save them after)."""
        picked: list[AgentLineRecord] = []
        files = self.files()
        if files:
            start = self._turn % len(files)
            self._turn += 1
            left = self.poll_budget_bytes
            for path in files[start:] + files[:start]:
                if left <= 0:
                    break
                lines, used = self.tailer.read(path, budget=min(left, self.tailer.file_budget_bytes))
                left -= used
                self.bytes_read += used
                stream = stream_of(path.name) or ""
                picked += self._pick(path.name, stream, [
                    AgentLineRecord(path.name, line.line_no, line.text, line.truncated,
                              (line.age or {}).get(keys.LINE_TIME), bool((line.age or {}).get(keys.HISTORY)))
                    for line in lines
                ])
        if self.kernel is not None:
            picked += self._pick(KERNEL_FILE, KERNEL_STREAM, [
                AgentLineRecord(KERNEL_FILE, k.seq, k.text, False, (k.attrs or {}).get(keys.LINE_TIME),
                          bool((k.attrs or {}).get(keys.HISTORY)))
                for k in self.kernel.read()
            ])
        return picked

    def _pick(self, name: str, stream: str, lines: list[AgentLineRecord]) -> list[AgentLineRecord]:
        self.lines_read += len(lines)
        context = self._context.setdefault(name, deque(maxlen=self.context_lines))
        picked: list[AgentLineRecord] = []
        for line in lines:
            if self.rules.match(line.text):
                picked += context  # the lines before it, for the evidence
                context.clear()
                picked.append(line)
            elif stream in PROGRESS_STREAMS and self.progress is not None and self.progress.search(line.text):
                context.clear()
                picked.append(line)
            else:
                context.append(line)
        return picked

    def save(self) -> None:
        self.offsets.save()
