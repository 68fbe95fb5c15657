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

How it stays cheap on a node writing NCCL_DEBUG=INFO: new lines are read as raw blocks (LogTailer.read_block), and
the rules' literal gate (hyperscan where installed) and the progress patterns' prefilter find the few candidate lines
in each block; only those, their context and a block's last lines are decoded. Line by line (`gate_blocks=False`,
and for a first sight's backlog, a rotated file's rest, an over-long line) it picks exactly the same lines.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from collectors.history import HistoryMarker
from collectors.kernel_log import STREAM as KERNEL_STREAM
from collectors.kernel_log import KernelLogSource
from collectors.logs import LogBlock, LogTailer, decode_line
from collectors.offsets import OffsetStore
from collectors.ray_logs import KERNEL_FILE, AgentLineRecord, stream_of
from core import signal_keys as keys
from core.line_shapes import unwrap_block
from core.literal_gate import LiteralGate, PrefilterLines, alternatives
from detectors.engine import RuleSet, clip_line
from detectors.stall import DEFAULT_PATTERNS, ProgressPattern

GATE_SAMPLE_BYTES = 64 * 1024  # enough text to know which literals are common in it
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
    line instead of one per pattern (core.literal_gate.alternatives keeps each pattern's meaning)."""
    return re.compile(alternatives([p.pattern for p in patterns])) if patterns else None


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
        gate_blocks: bool = True,
    ) -> None:
        """`gate_blocks`: find the lines to send by gating whole blocks (see `_pick_block`); False reads every line
        on its own, the reference the block path is tested against."""
        self.logs_dir = Path(logs_dir)
        self.offsets = offsets
        self.rules = rules
        self.kernel = kernel
        self.progress = combined(patterns)
        # Whole blocks are gated where every rule and pattern can be (what the gates miss, nothing would catch).
        # Each stream (raylet, a job's driver, workers ...) gets a gate of its own once GATE_SAMPLE_BYTES of it were
        # read: a gate picks each rule's literals by how rarely they occur in that text (in NCCL's set-up flood
        # "NCCL INFO " is everywhere and ".cc:" nowhere); until then, the gate for a general sample.
        self._rule_gate = rules.block_gate(kind="")
        self._stream_gates: dict[str, LiteralGate] = {}
        self._samples: dict[str, bytes] = {}
        self._progress_lines = PrefilterLines([p.pattern for p in patterns]) if patterns else None
        self._blocks = gate_blocks and self._rule_gate.gated and not self._rule_gate.ungated
        self.context_lines = context_lines
        self.poll_budget_bytes = poll_budget_bytes
        self.tailer = LogTailer(offsets, file_budget_bytes=file_budget_bytes,
                                history=HistoryMarker(history_window_s))
        self._context: dict[str, deque[AgentLineRecord]] = {}
        self._turn = 0
        self.behind = False  # the last poll left bytes unread for its budgets (a burst): poll again soon
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
        self.behind = False
        files = self.files()
        if files:
            start = self._turn % len(files)
            self._turn += 1
            left = self.poll_budget_bytes
            for path in files[start:] + files[:start]:
                if left <= 0:
                    break
                budget = min(left, self.tailer.file_budget_bytes)
                if self._blocks:
                    lines, block, used = self.tailer.read_block(path, budget=budget)
                else:
                    (lines, used), block = self.tailer.read(path, budget=budget), None
                left -= used
                self.bytes_read += used
                # a read that (nearly) filled its budget stopped for it: the file has more
                self.behind = self.behind or used >= budget - self.tailer.max_line_bytes
                stream = stream_of(path.name) or ""
                picked += self._pick(path.name, stream, [
                    AgentLineRecord(path.name, line.line_no, line.text, line.truncated,
                              (line.age or {}).get(keys.LINE_TIME), bool((line.age or {}).get(keys.HISTORY)))
                    for line in lines
                ])
                if block is not None:
                    picked += self._pick_block(path.name, stream, block)
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

    def _pick_block(self, name: str, stream: str, block: LogBlock) -> list[AgentLineRecord]:
        """What `_pick` picks from the block's lines, found by the gates instead of a search per line: only the
        candidate lines, their context and the block's last lines (the next block's context) are decoded."""
        data = block.data
        count = data.count(b"\n")
        self.lines_read += count
        found: dict[int, tuple[int, bool]] = {}  # line start -> (its newline, matched a rule)
        # The gate reads the lines unwrapped (colours inside a word, JSON quoting: core.line_shapes), the same lines;
        # what is picked and sent is each line as written.
        plain = unwrap_block(data)
        written = data.split(b"\n") if plain is not data else []
        offsets = [0, *accumulate(map(len, written))]  # bytes of the lines before line i, newlines not counted
        counted, index = 0, 0
        for start, end, _ in self._gate_for(stream, plain).lines(plain):
            if written:
                index += plain.count(b"\n", counted, start)
                counted = start
                start = offsets[index] + index
                end = start + len(written[index])
            if self.rules.match(decode_line(data[start:end])):
                found[start] = (end, True)
        if stream in PROGRESS_STREAMS and self._progress_lines is not None and self.progress is not None:
            for start, end in self._progress_lines.lines(data):
                if start not in found and self.progress.search(decode_line(data[start:end])):
                    found[start] = (end, False)
        context = self._context.setdefault(name, deque(maxlen=self.context_lines))
        picked: list[AgentLineRecord] = []
        counted, line_no, boundary = 0, block.first_line, 0  # boundary: where lines not yet picked begin
        for start in sorted(found):
            end, rule = found[start]
            line_no += data.count(b"\n", counted, start)
            counted = start
            if rule:
                before = _lines_before(data, start, boundary, self.context_lines)
                room = self.context_lines - len(before)
                if boundary == 0 and room > 0 and context:  # no pick yet in this block: the last read's lines too
                    picked += list(context)[-room:]
                picked += [self._record(name, line_no - len(before) + i, data, s, e) for i, (s, e) in enumerate(before)]
            context.clear()
            picked.append(self._record(name, line_no, data, start, end))
            boundary = end + 1
        last = _lines_before(data, len(data), boundary, self.context_lines)
        total = block.first_line + count - 1  # the block's last line number
        context.extend(self._record(name, total - len(last) + 1 + i, data, s, e) for i, (s, e) in enumerate(last))
        return picked

    def _gate_for(self, stream: str, data: bytes) -> LiteralGate:
        gate = self._stream_gates.get(stream) or self.rules.known_block_gate(stream)
        if gate is not None:  # this scanner's, or one another agent sharing the rule set built from its sample
            self._stream_gates[stream] = gate
            return gate
        sample = self._samples.get(stream, b"") + data[: GATE_SAMPLE_BYTES]
        if len(sample) < GATE_SAMPLE_BYTES:
            self._samples[stream] = sample
            return self._rule_gate
        self._samples.pop(stream, None)
        gate = self._stream_gates[stream] = self.rules.block_gate(sample, kind=stream)
        return gate

    @staticmethod
    def _record(name: str, line_no: int, data: bytes, start: int, end: int) -> AgentLineRecord:
        text, truncated = clip_line(decode_line(data[start:end]))
        return AgentLineRecord(name, line_no, text, truncated, None, False)

    def save(self) -> None:
        self.offsets.save()


def _lines_before(data: bytes, pos: int, boundary: int, count: int) -> list[tuple[int, int]]:
    """(start, newline) of up to `count` lines of `data` that end right before offset `pos` (a line's start, or
    the end), none starting before `boundary` (a line's start), in order."""
    out: list[tuple[int, int]] = []
    end = pos - 1
    while len(out) < count and end >= boundary:
        start = data.rfind(b"\n", 0, end) + 1
        out.append((start, end))
        end = start - 1
    out.reverse()
    return out
