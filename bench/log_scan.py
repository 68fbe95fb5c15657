"""Log-scan throughput: the rule engine next to `grep -E` with the same patterns, on the same file.

Generates (or takes, --file) a large training-job log: verl / Ray / NCCL / vLLM lines as they appear in
real jobs, with rare failure lines copied from the real fixtures (tests/fixtures/logs), from a fixed
seed. Then times, on the same file:

- `RuleSet.scan_stream`, the path `argus analyze` takes (rca.analyze.analyze_stream), with hyperscan
  finding the gate's literals when it is installed, and again with `native=False` (the regex gate),
- `RuleSet.scan` over `iter_lines`, the line-by-line API (on a slice: it is much slower),
- `grep -E -c -f PATTERNS` with every rule pattern translated to POSIX ERE (LC_ALL=C); patterns ERE
  cannot express (lookarounds, backreferences) are listed and left out of grep's set.
- `JobLogsCollector.collect` turning the file into signals (on a slice): as live lines appended to a file
  already watched, and as the backlog of a file seen for the first time, whose lines are dated to tell
  history from news (collectors.history). The live path must not pay for the dating.

Goal: scan_stream at >= 50% of grep's MB/s. Prints a table; not a test (timings vary with load).

One file past 400 lines on purpose: a benchmark is run as one script, and the log generator, the grep
translation and the timing table only make sense together.

    .venv/bin/python bench/log_scan.py                 # 200 MB generated log
    .venv/bin/python bench/log_scan.py --mb 50 --runs 3
    .venv/bin/python bench/log_scan.py --file /path/to/job.log
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.logs import JobLogsCollector  # noqa: E402
from collectors.offsets import OffsetStore  # noqa: E402
from core.literal_gate import native_search_available  # noqa: E402
from detectors.engine import RuleSet, ScanStats, load_rules  # noqa: E402
from rca.analyze import iter_lines  # noqa: E402

try:
    import re._parser as _sp  # type: ignore[import-not-found]
    from re import _constants as _sc  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sc
    import sre_parse as _sp

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
FAILURE_RATE = 1e-4  # one failure line in ten thousand

# --- translating rule patterns to POSIX ERE ---------------------------------------------------------
# Works on the parsed pattern (re's own parser), so escapes, classes and inline flags are read the way
# `re` reads them. Lazy repeats become greedy: for "does this line match" they are the same.

_SPECIAL = set(".[]()*+?{}|^$\\")
_CATEGORIES = {
    _sc.CATEGORY_DIGIT: "[0-9]",
    _sc.CATEGORY_NOT_DIGIT: "[^0-9]",
    _sc.CATEGORY_SPACE: "[[:space:]]",
    _sc.CATEGORY_NOT_SPACE: "[^[:space:]]",
    _sc.CATEGORY_WORD: "[[:alnum:]_]",
    _sc.CATEGORY_NOT_WORD: "[^[:alnum:]_]",
}
_IN_CATEGORIES = {
    _sc.CATEGORY_DIGIT: "0-9",
    _sc.CATEGORY_SPACE: "[:space:]",
    _sc.CATEGORY_WORD: "[:alnum:]_",
}


class Untranslatable(Exception):
    """The pattern uses a construct ERE does not have."""


def to_ere(pattern: str) -> str:
    parsed = _sp.parse(pattern)
    return _seq(list(parsed), bool(parsed.state.flags & re.IGNORECASE))


def _seq(items: list, icase: bool) -> str:
    return "".join(_item(op, av, icase) for op, av in items)


def _lit(code: int, icase: bool) -> str:
    ch = chr(code)
    if code > 127:
        raise Untranslatable("non-ASCII literal")
    if icase and ch.isalpha():
        return f"[{ch.lower()}{ch.upper()}]"
    return "\\" + ch if ch in _SPECIAL else ch


def _item(op, av, icase: bool) -> str:  # noqa: C901 - one branch per regex construct
    if op is _sc.LITERAL:
        return _lit(av, icase)
    if op is _sc.NOT_LITERAL:
        return _bracket([(_sc.NEGATE, None), (_sc.LITERAL, av)], icase)
    if op is _sc.ANY:
        return "."
    if op is _sc.IN:
        return _bracket(av, icase)
    if op is _sc.SUBPATTERN:
        _group, add, delete, body = av
        sub_icase = (icase or bool(add & re.IGNORECASE)) and not bool(delete & re.IGNORECASE)
        return "(" + _seq(list(body), sub_icase) + ")"
    if op is _sc.BRANCH:
        return "(" + "|".join(_seq(list(b), icase) for b in av[1]) + ")"
    if op in (_sc.MAX_REPEAT, _sc.MIN_REPEAT):
        lo, hi, body = av
        inner = _seq(list(body), icase)
        if len(list(body)) != 1 or list(body)[0][0] in (_sc.BRANCH,):
            inner = "(" + inner + ")"
        if (lo, hi) == (0, _sc.MAXREPEAT):
            q = "*"
        elif (lo, hi) == (1, _sc.MAXREPEAT):
            q = "+"
        elif (lo, hi) == (0, 1):
            q = "?"
        elif hi == _sc.MAXREPEAT:
            q = f"{{{lo},}}"
        elif lo == hi:
            q = f"{{{lo}}}"
        else:
            q = f"{{{lo},{hi}}}"
        return inner + q
    if op is _sc.AT:
        return {
            _sc.AT_BEGINNING: "^",
            _sc.AT_BEGINNING_STRING: "^",
            _sc.AT_END: "$",
            _sc.AT_END_STRING: "$",
            _sc.AT_BOUNDARY: "\\b",
            _sc.AT_NON_BOUNDARY: "\\B",
        }[av]
    if op is _sc.CATEGORY:
        return _CATEGORIES[av]
    raise Untranslatable(f"{str(op).lower()} has no ERE form")


def _bracket(items, icase: bool) -> str:
    negate, parts, close, dash = False, [], False, False
    for op, av in items:
        if op is _sc.NEGATE:
            negate = True
        elif op is _sc.LITERAL:
            chars = {chr(av)}
            if icase and chr(av).isalpha():
                chars = {chr(av).lower(), chr(av).upper()}
            for ch in chars:
                if ch == "\n":
                    continue  # grep matches line by line: no line holds a newline
                if ord(ch) > 127:
                    raise Untranslatable("non-ASCII literal")
                if ch == "]":
                    close = True
                elif ch == "-":
                    dash = True
                else:
                    parts.append(ch)
        elif op is _sc.RANGE:
            lo, hi = av
            if hi > 127:
                raise Untranslatable("non-ASCII range")
            parts.append(f"{chr(lo)}-{chr(hi)}")
            if icase and chr(lo).isalpha() and chr(hi).isalpha():
                parts.append(f"{chr(lo).swapcase()}-{chr(hi).swapcase()}")
        elif op is _sc.CATEGORY:
            if av in _IN_CATEGORIES:
                parts.append(_IN_CATEGORIES[av])
            else:
                raise Untranslatable("negated class inside a bracket")
        else:
            raise Untranslatable(f"{op} inside a bracket")
    body = "".join(sorted(parts, key=lambda p: p == "^"))  # a leading ^ would negate
    if negate and not (body or close or dash):
        return "."
    return "[" + ("^" if negate else "") + ("]" if close else "") + body + ("-" if dash else "") + "]"


# --- the log ---------------------------------------------------------------------------------------

_NOISE = [
    "(TaskRunner pid={p}) step:{s} - actor/entropy:{f:.3f} - actor/pg_loss:{g:.4f} - actor/pg_clipfrac:0.001 - "
    "actor/ppo_kl:-0.000 - actor/grad_norm:{h:.3f} - perf/mfu/actor:0.343 - perf/max_memory_allocated_gb:62.447 - "
    "perf/cpu_memory_used_gb:102.490 - critic/score/mean:0.558 - response_length/mean:288.698 - "
    "response_length/clip_ratio:0.000 - timing_s/gen:{t:.2f} - timing_s/update_actor:{t:.2f}",
    "worker-{n}:3018453:3024011 [{c}] NCCL INFO Channel {c:02d}/0 : 2[1040] -> 0[1020] via P2P/IPC/read",
    "worker-{n}:3018453:3024011 [{c}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "[2025-04-02 15:02:{c:02d},117 I 135782 135782] core_worker.cc:4134: Number of alive nodes:{n}",
    "[2025-04-02 15:02:{c:02d},117 I 135782 135790] task_receiver.cc:142: Actor creation task finished, task_id: "
    "ffffffffffffffff{p}01000000, actor_id: {p}ab01000000",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) INFO 04-02 15:02:{c:02d} [gpu_model_runner.py:1067] Model loading took "
    "{f:.4f} GB and {t:.2f} seconds",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) INFO 04-02 15:02:{c:02d} [block_pool.py:321] Successfully reset prefix "
    "cache",
    "Training Progress:  {c}%|██████▍         | {s}/3200 [08:56<02:05,  {t:.2f}s/it]",
    "(WorkerDict pid={p}) /usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the "
    "inputs have requires_grad=True. Gradients will be None",
    "(TaskRunner pid={p}) validation generation end",
    "(raylet) [2025-04-02 15:02:{c:02d},241 I 1111013 1111013] (raylet) local_object_manager.cc:490: Spilled {s} "
    "MiB, {c} objects, write throughput {n} MiB/s.",
    "(WorkerDict pid={p}, ip=10.95.143.{n}) [rank{c}]:[W402 15:02:{c:02d}.776885251 ProcessGroupNCCL.cpp:4561] "
    "[PG ID 0 PG GUID 0 Rank {c}] using GPU {c} to perform barrier as devices used by this process are currently "
    "unknown.",
]


def failure_lines() -> list[str]:
    """Real failure lines: every fixture line that some built-in rule matches."""
    rules = load_rules()
    lines = []
    for path in sorted(FIXTURES.glob("*/*.log")):
        if path.parent.name == "negative":
            continue
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if rules.match(line)]
    return lines


def generate(path: Path, megabytes: int, seed: int) -> None:
    rng = random.Random(seed)
    failures = failure_lines()
    target = megabytes * 1024 * 1024
    size = 0
    with path.open("w", encoding="utf-8") as out:
        while size < target:
            batch = []
            for _ in range(10_000):
                if rng.random() < FAILURE_RATE:
                    batch.append(rng.choice(failures))
                else:
                    batch.append(
                        rng.choice(_NOISE).format(
                            p=rng.randint(1000, 3_999_999),
                            s=rng.randint(0, 99_999),
                            f=rng.random(),
                            g=rng.random(),
                            h=rng.random() * 10,
                            t=rng.random() * 100,
                            n=rng.randint(1, 254),
                            c=rng.randint(0, 7),
                        )
                    )
            text = "\n".join(batch) + "\n"
            out.write(text)
            size += len(text.encode("utf-8"))


# --- timing ----------------------------------------------------------------------------------------


def best_of(runs: int, fn):
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def engine_stream(rules: RuleSet, path: Path, native: bool = True) -> tuple[int, int]:
    stats = ScanStats()
    with path.open("rb") as stream:
        lines = {m.line_no for m in rules.scan_stream(stream, str(path), stats=stats, native=native)}
    return len(lines), stats.lines


def engine_lines(rules: RuleSet, path: Path) -> int:
    with path.open("rb") as stream:
        return len({m.line_no for m in rules.scan(iter_lines(stream), str(path))})


def collector_read(slice_path: Path, workdir: Path, *, backlog: bool) -> tuple[int, float]:
    """Signals from one job log through JobLogsCollector: its backlog at first sight, or the same bytes appended
    to a file already watched (the copy is not timed: only the collects are)."""
    root = Path(tempfile.mkdtemp(prefix="collect-", dir=workdir))
    logs = root / "jobs" / "raysubmit_bench" / "logs"
    logs.mkdir(parents=True)
    target = logs / "train.log"
    reader = JobLogsCollector(root, OffsetStore(root / "offsets.json"))
    if backlog:
        shutil.copyfile(slice_path, target)
    else:
        target.touch()
        reader.collect()  # watched from empty: what comes next is live
        shutil.copyfile(slice_path, target)  # same inode, grown: appended lines
    started = time.perf_counter()
    total = 0
    while batch := reader.collect():
        total += len(batch)
    elapsed = time.perf_counter() - started
    reader.tailer.close()
    shutil.rmtree(root, ignore_errors=True)
    return total, elapsed


def grep_count(pattern_file: Path, path: Path, locale: str = "C") -> int:
    done = subprocess.run(
        ["grep", "-E", "-c", "-f", str(pattern_file), str(path)],
        capture_output=True,
        env={**os.environ, "LC_ALL": locale},
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"grep failed: {done.stderr.decode().strip()}")
    return int(done.stdout.decode().strip() or 0)


def translate(rules: RuleSet) -> tuple[list[str], list[tuple[str, str]]]:
    patterns, skipped = [], []
    for rule in rules:
        if rule.unless is not None:  # grep -E cannot say "this, unless the line also says that"
            skipped.append((rule.reason, "has `unless`, which one grep -E pattern cannot express"))
            continue
        try:
            ere = to_ere(rule.pattern)
        except Untranslatable as exc:
            skipped.append((rule.reason, str(exc)))
            continue
        check = subprocess.run(["grep", "-E", "-e", ere], input=b"", capture_output=True, check=False)
        if check.returncode == 2:
            skipped.append((rule.reason, f"grep refused the translation: {check.stderr.decode().strip()}"))
            continue
        patterns.append(ere)
    return patterns, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="size of the generated log (default 200)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--file", type=Path, help="scan this log instead of generating one")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per tool; the best counts")
    parser.add_argument("--line-slice-mb", type=int, default=10, help="size of the slice for the line-by-line API")
    args = parser.parse_args()
    console = Console(width=130)
    if shutil.which("grep") is None:
        raise SystemExit("grep is not on PATH; install it (GNU grep) to compare")

    workdir = Path(tempfile.mkdtemp(prefix="argus-logscan-"))
    try:
        log = args.file or workdir / "job.log"
        if args.file is None:
            with console.status(f"generating {args.mb} MB log (seed {args.seed})"):
                generate(log, args.mb, args.seed)
        size_mb = log.stat().st_size / 1e6
        rules = load_rules()
        patterns, skipped = translate(rules)
        pattern_file = workdir / "patterns.ere"
        pattern_file.write_text("\n".join(patterns) + "\n", encoding="utf-8")

        native = native_search_available()
        with console.status("timing RuleSet.scan_stream"):
            t_stream, (stream_hits, total_lines) = best_of(args.runs, lambda: engine_stream(rules, log))
        t_plain, plain_hits = t_stream, stream_hits
        if native:
            with console.status("timing RuleSet.scan_stream without hyperscan"):
                t_plain, (plain_hits, _) = best_of(args.runs, lambda: engine_stream(rules, log, native=False))
        with console.status("timing grep -E"):
            t_grep, grep_hits = best_of(args.runs, lambda: grep_count(pattern_file, log))
            t_grep_utf8, _ = best_of(args.runs, lambda: grep_count(pattern_file, log, "C.UTF-8"))
        slice_path = workdir / "slice.log"
        with log.open("rb") as src, slice_path.open("wb") as dst:
            dst.write(src.read(args.line_slice_mb * 1024 * 1024))
            dst.write(src.readline())
        slice_mb = slice_path.stat().st_size / 1e6
        with console.status("timing RuleSet.scan (line by line)"):
            t_lines, _ = best_of(1, lambda: engine_lines(rules, slice_path))

        with console.status("timing JobLogsCollector.collect (live and first-read backlog)"):
            live = min((collector_read(slice_path, workdir, backlog=False) for _ in range(args.runs)),
                       key=lambda r: r[1])
            first = min((collector_read(slice_path, workdir, backlog=True) for _ in range(args.runs)),
                        key=lambda r: r[1])

        stream_rate, grep_rate, line_rate = size_mb / t_stream, size_mb / t_grep, slice_mb / t_lines
        table = Table(title=f"log scan: {size_mb:.0f} MB, {total_lines:,} lines, {len(rules)} rules")
        for col in ("scanner", "MB scanned", "seconds (best)", "MB/s", "matching lines", "vs grep"):
            table.add_column(col, justify="right" if col != "scanner" else "left")
        table.add_row(
            "argus RuleSet.scan_stream" + (" (hyperscan gate)" if native else " (regex gate)"),
            f"{size_mb:.0f}",
            f"{t_stream:.2f}",
            f"{stream_rate:.1f}",
            f"{stream_hits:,}",
            f"{stream_rate / grep_rate:.0%}",
        )
        if native:
            table.add_row(
                "argus RuleSet.scan_stream, native=False (regex gate)",
                f"{size_mb:.0f}",
                f"{t_plain:.2f}",
                f"{size_mb / t_plain:.1f}",
                f"{plain_hits:,}",
                f"{size_mb / t_plain / grep_rate:.0%}",
            )
        table.add_row(
            f"grep -E ({len(patterns)} patterns, LC_ALL=C)",
            f"{size_mb:.0f}",
            f"{t_grep:.2f}",
            f"{grep_rate:.1f}",
            f"{grep_hits:,}",
            "100%",
        )
        table.add_row(
            "grep -E, same patterns, LC_ALL=C.UTF-8",
            f"{size_mb:.0f}",
            f"{t_grep_utf8:.2f}",
            f"{size_mb / t_grep_utf8:.1f}",
            "-",
            f"{t_grep / t_grep_utf8:.0%}",
        )
        table.add_row(
            "argus RuleSet.scan (line API)",
            f"{slice_mb:.0f}",
            f"{t_lines:.2f}",
            f"{line_rate:.1f}",
            "-",
            f"{line_rate / grep_rate:.0%}",
        )
        for label, (lines_read, seconds) in (("JobLogsCollector.collect, live lines", live),
                                             ("JobLogsCollector.collect, first-read backlog (dated)", first)):
            table.add_row(label, f"{slice_mb:.0f}", f"{seconds:.2f}", f"{slice_mb / seconds:.1f}",
                          f"{lines_read:,} read", f"{slice_mb / seconds / grep_rate:.0%}")
        console.print(table)
        console.print(f"dating a first read's backlog costs {first[1] / live[1] - 1:+.0%} over the live path")
        goal = "met" if stream_rate >= 0.5 * grep_rate else "NOT met"
        console.print(f"goal scan_stream >= 50% of grep: {goal} ({stream_rate / grep_rate:.0%})")
        if plain_hits != stream_hits:
            console.print(f"MISMATCH: the regex gate found {plain_hits} matching lines, hyperscan {stream_hits}")
        if not native:
            console.print("hyperscan is not installed (or cannot run here): the regex gate did the scan")
        if skipped:
            console.print("patterns grep cannot run (left out of its set; grep's count is a lower bound):")
            for reason, why in skipped:
                console.print(f"  {reason}: {why}", highlight=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
