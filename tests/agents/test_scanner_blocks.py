"""The node agent's block scan (whole blocks gated, only candidate lines decoded) against its line-by-line reading:
the same lines picked, with the same numbers, texts and context, on real-looking logs written in pieces across polls
(partial last lines, CRLF, invalid UTF-8, ANSI colour, over-long lines, rotation, truncation, several files)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from argus.agents.scanner import GATE_SAMPLE_BYTES, NodeScanner, _lines_before
from collectors.history import HistoryMarker
from collectors.logs import LogTailer
from collectors.offsets import OffsetStore
from detectors.engine import load_rules

RULES = load_rules()

NOISE = [
    "node{r}:1234:5678 [{r}] NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {q}[{q}] via P2P/CUMEM/read",
    "node{r}:1234:5678 [{r}] NCCL INFO comm 0x55d0c rank {r} nRanks 8 nNodes 1 localRanks 8 localRank {r} MNNVL 0",
    "(WorkerDict pid={c}, ip=10.0.0.{r}) INFO 04-02 15:02:{c:02d} [block_pool.py:321] Successfully reset prefix cache",
    "Epoch 1:  45%|####5     | {c}/100 [00:10<00:12, 4.5it/s]",
    "[2026-11-26 11:00:{c:02d},000 I 1 1] (raylet) worker_pool.cc:{c}: Started worker process",
    "",
    "\x1b[36m(TaskRunner pid=2)\x1b[0m step:{c} - actor/loss:0.5 - timing/step:3.2",  # Ray colours its prefixes
    "loading shard {c} of 64\r",
    "bytes that are not UTF-8: \udcff\udcfe {c}",
]
EVENTS = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU {r}; 79.1 GiB total)",
    "node{r}:1234:5678 [{r}] NCCL WARN NET/Socket : Connection closed by remote peer 10.0.0.{q}<4312>",
    "node{r}:1234:5678 [{r}] NCCL INFO init.cc:1{c} -> 2",
    "step:{c} - actor/entropy:0.5 - critic/score:1.0",
    "{{'loss': 0.52, 'learning_rate': 1e-05, 'epoch': 0.{c}}}",
    "RuntimeError: NCCL error: unhandled system error, NCCL version 2.21.5",
    "OSError: [Errno 28] No space left on device: '/ckpt/global_step_{c}'",
    "global_step={c} loss=0.3",
    # colours inside the words rules read, and a line kept as JSON by Docker's json-file driver (core.line_shapes)
    "\x1b[1m\x1b[31mtorch.OutOfMemoryError\x1b[0m: CUDA \x1b[1mout of memory\x1b[0m. Tried to allocate 1.00 GiB",
    '{{"log":"OSError: [Errno 28] No space left on device: \'/ckpt/{c}\'\\n","stream":"stderr",'
    '"time":"2024-05-01T10:00:0{r}Z"}}',
]


def random_text(rng: random.Random, lines: int) -> bytes:
    out = []
    for _ in range(lines):
        r, q, c = rng.randrange(8), rng.randrange(8), rng.randrange(100)
        pick = rng.choice(EVENTS) if rng.random() < 0.04 else rng.choice(NOISE)
        line = pick.format(r=r, q=q, c=c)
        if rng.random() < 0.002:
            line = "x" * rng.randrange(60_000, 140_000) + " CUDA out of memory"  # past the line cap
        ending = "\r\n" if rng.random() < 0.05 else "\n"
        out.append((line + ending).encode("utf-8", errors="surrogateescape"))
    return b"".join(out)


def scanners(tmp_path: Path, **kw: object) -> tuple[NodeScanner, NodeScanner]:
    logs = tmp_path / "logs"
    return (NodeScanner(logs, OffsetStore(tmp_path / "blocks.json"), RULES, **kw),  # type: ignore[arg-type]
            NodeScanner(logs, OffsetStore(tmp_path / "lines.json"), RULES, gate_blocks=False, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_the_block_scan_picks_what_the_line_scan_picks(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    logs.mkdir()
    names = ["job-driver-raysubmit_1.log", "worker-ab12-01000000-77.err", "raylet.out"]
    for name in names:
        (logs / name).write_bytes(b"")
    blocks, lines = scanners(tmp_path, file_budget_bytes=rng.choice([64 * 1024, 1024 * 1024]))
    assert blocks.poll() == lines.poll() == []  # first sight of empty files
    got_blocks, got_lines = [], []
    pending = {name: random_text(rng, 4000) for name in names}
    while any(pending.values()):
        for name in names:
            cut = min(len(pending[name]), rng.randrange(1, 200_000))
            with open(logs / name, "ab") as out:  # a piece, often ending mid-line
                out.write(pending[name][:cut])
            pending[name] = pending[name][cut:]
        got_blocks += blocks.poll()
        got_lines += lines.poll()
    def offset(scanner: NodeScanner, name: str) -> int:
        return int(scanner.offsets.get(str(logs / name))["offset"])

    for _ in range(1000):  # the budgets may leave bytes for later polls
        if all(offset(s, n) == (logs / n).stat().st_size for s in (blocks, lines) for n in names):
            break
        got_blocks += blocks.poll()
        got_lines += lines.poll()
    assert len(got_lines) > 50
    assert got_blocks == got_lines
    assert blocks.lines_read == lines.lines_read
    assert all(offset(s, n) == (logs / n).stat().st_size for s in (blocks, lines) for n in names)  # read to the end


def test_a_stream_gets_a_gate_of_its_own_once_a_sample_was_read(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    driver = logs / "job-driver-raysubmit_1.log"
    driver.write_bytes(b"")
    rules = load_rules()  # its own: a rule set keeps the first gate built for each kind of stream
    scanner = NodeScanner(logs, OffsetStore(tmp_path / "o.json"), rules)
    scanner.poll()
    noise = b"node0:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    with open(driver, "ab") as out:
        out.write(noise * (GATE_SAMPLE_BYTES // len(noise) + 10) + b"node0:1:1 [0] NCCL INFO init.cc:12 -> 2\n")
    picked = scanner.poll()
    assert [line.text for line in picked][-1] == "node0:1:1 [0] NCCL INFO init.cc:12 -> 2"
    gate = scanner._stream_gates["job-logs"]
    assert list(gate.lines(noise)) == []  # NCCL's set-up lines are no candidates for that stream's gate
    assert list(rules.block_gate().lines(noise))  # they are for the general one
    other = NodeScanner(logs, OffsetStore(tmp_path / "other.json"), rules)
    other.poll()
    assert other._gate_for("job-logs", b"x\n" * GATE_SAMPLE_BYTES) is gate  # built once a rule set and kind


def test_rotation_truncation_and_backlog_go_the_line_path_and_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "raylet.out"
    path.write_bytes(b"old line 1\nold line 2\n")
    tailer = LogTailer(OffsetStore(tmp_path / "o.json"), history=HistoryMarker(900))
    lines, block, _ = tailer.read_block(path)
    assert block is None and [line.text for line in lines] == ["old line 1", "old line 2"]  # first sight's backlog
    with open(path, "ab") as out:
        out.write(b"new 3\nnew 4\npartial")
    lines, block, used = tailer.read_block(path)
    assert lines == [] and block is not None
    assert (block.first_line, block.data, used) == (3, b"new 3\nnew 4\n", 12)
    os.rename(path, tmp_path / "raylet.out.1")
    path.write_bytes(b"fresh 1\n")
    with open(tmp_path / "raylet.out.1", "ab") as out:
        out.write(b" end\n")
    lines, block, _ = tailer.read_block(path)  # the rotated file's rest, then the new one's start, as lines
    assert [line.text for line in lines] == ["partial end", "fresh 1"] and block is None
    with open(path, "ab") as out:
        out.write(b"fresh 2\n")
    lines, block, _ = tailer.read_block(path)
    assert lines == [] and block is not None and block.data == b"fresh 2\n" and block.first_line == 2
    path.write_bytes(b"x\n")  # truncated: read again from the start
    lines, block, _ = tailer.read_block(path)
    assert block is not None and (block.first_line, block.data) == (1, b"x\n")


def test_lines_before_stop_at_the_boundary() -> None:
    data = b"a\nbb\n\nccc\nd\n"
    assert _lines_before(data, data.index(b"d"), 0, 3) == [(2, 4), (5, 5), (6, 9)]
    assert _lines_before(data, data.index(b"d"), 5, 3) == [(5, 5), (6, 9)]
    assert _lines_before(data, len(data), 0, 1) == [(10, 11)]
    assert _lines_before(data, 0, 0, 3) == []


def test_lines_in_colour_or_in_json_are_picked_by_both_scans(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    text = "".join(line + "\n" for line in [
        "step:1 - loss:0.5",
        "\x1b[31mtorch.OutOfMemoryError\x1b[0m: CUDA \x1b[1mout of memory\x1b[0m. Tried to allocate 1.00 GiB",
        '{"log":"OSError: [Errno 28] No space left on device\\n","stream":"stderr","time":"2024-05-01T10:00:00Z"}',
        "step:2 - loss:0.4",
    ])
    (logs / "job-driver-raysubmit_1.log").write_bytes(b"")
    blocks, lines = scanners(tmp_path, context_lines=0)
    assert blocks.poll() == lines.poll() == []
    (logs / "job-driver-raysubmit_1.log").write_text(text)
    picked_blocks, picked_lines = blocks.poll(), lines.poll()
    assert picked_blocks == picked_lines
    assert [p.line for p in picked_blocks if p.line in (2, 3)] == [2, 3]
