"""Does the RCA read a log the same whatever carried it? The evaluation folds, rewritten in the shapes real
collectors and launchers give every line, scored against the folds as they are.

The cases' logs are mostly pasted from issue threads: bare lines, or with the odd prefix. On a cluster the same lines
arrive wrapped or headed (core.line_shapes): a container runtime's or kubectl's timestamp, a journald header, Docker's
JSON, Ray's coloured worker prefix, torchrun's rank, srun's, mpirun's, pdsh's host, kubectl's or docker compose's
pod, or a file and line number where a person grepped a job's logs. This rewrites every line of every case of the
chosen folds in one such shape (into a temporary folder), scores it with the rules of `argus analyze`, and prints
per shape: the accuracy, the share of failure logs called unknown, and how many cases got a different category than
the plain fold. A reader that depends on how a line was carried shows up as a change. Some shapes are a reader's,
not a collector's: a log pasted where people discuss it (quoted with "> ", indented as a markdown code block, copied
out of a page's HTML source with its entities or off a rendered page with its no-break spaces, typed into a chat
that curls the quotes, or with Windows line ends), and every line cut at 120 columns, as a log copied from a
terminal arrives.

    .venv/bin/python bench/rca_line_shapes.py                 # dev and test folds, every shape
    .venv/bin/python bench/rca_line_shapes.py --fold dev --shape docker --json
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectors.engine import load_rules  # noqa: E402
from rca.cases import CASE_FILE, evaluate, load_cases, rule_predictor  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
FOLDS = {"dev": TESTS / "rca_cases", "test": TESTS / "rca_test", "holdout": TESTS / "rca_holdout"}
STAMP = "2024-05-01T10:00:00.123456789Z"


def _docker(line: str) -> str:
    return json.dumps({"log": line + "\n", "stream": "stderr", "time": STAMP})


# shape -> how it writes one line. The facts of a case must be in its logs verbatim: JSON shapes quote them too.
SHAPES: dict[str, Callable[[str], str]] = {
    "cri": lambda line: f"{STAMP} stderr F {line}",  # containerd / CRI-O log files
    "kubectl --timestamps": lambda line: f"{STAMP} {line}",
    "journald": lambda line: f"May 01 10:00:00 gpu-node-3 python[4242]: {line}",
    "docker json-file": _docker,
    "structured json": lambda line: json.dumps({"ts": STAMP, "level": "info", "msg": line}),
    "ray worker": lambda line: f"(RayTrainWorker pid=12345, ip=10.0.0.7) {line}",
    "ray worker, coloured": lambda line: f"\x1b[36m(RayTrainWorker pid=12345, ip=10.0.0.7)\x1b[0m {line}",
    "torchrun rank": lambda line: f"[rank3]:{line}",
    "srun -l": lambda line: f"3: {line}",
    "mpirun --tag-output": lambda line: f"[1,3]<stderr>:{line}",
    "pdsh host": lambda line: f"gpu-node-12: {line}",
    "kubectl logs --prefix": lambda line: f"[pod/trainer-worker-0/pytorch] {line}",
    "docker compose logs": lambda line: f"trainer-1  | {line}",
    "journalctl -o short-iso": lambda line: f"2024-05-01T10:00:00+0000 gpu-node-3 python[4242]: {line}",
    "all of them": lambda line: f"{STAMP} stdout F \x1b[36m(TaskRunner pid=99, ip=10.0.0.8)\x1b[0m [rank0]: {line}",
}
# A log pasted into an issue, a chat or a mail (core.line_shapes: quotes; HTML escapes).
PASTED: dict[str, Callable[[str], str]] = {
    "markdown quote": lambda line: f"> {line}",
    "markdown quote in a quote": lambda line: f"> > {line}",
    "markdown code block (indented)": lambda line: f"    {line}",
    "HTML-escaped": html.escape,
    "no-break spaces (a web page's)": lambda line: line.replace(" ", "\u00a0"),
    "curly quotes (a chat's)": lambda line: line.replace("'", "\u2019").replace('"', "\u201d"),
    "Windows line ends": lambda line: f"{line}\r",
}
SHAPES.update(PASTED)
# Shapes that number a file's lines: a person's grep over a job's logs, or a pager's line numbers.
NUMBERED: dict[str, Callable[[int, str], str]] = {
    "grep -Hn": lambda number, line: f"logs/worker-3.log:{number}:{line}",
    "cat -n": lambda number, line: f"{number:6d}\t{line}",
}
SHAPES.update({shape: lambda line: line for shape in NUMBERED})  # listed with the others; rewrite numbers them
JSON_SHAPES = {"docker json-file", "structured json"}
# The facts of a case are rewritten too: they must be in its logs verbatim.
ESCAPED_SHAPES = {"HTML-escaped", "no-break spaces (a web page's)", "curly quotes (a chat's)"}
# Not a collector's shape but a reader's: a log copied from a terminal or a pager is cut into lines of its width. No
# reader joins such lines today; this shape measures what that costs.
WRAP_COLUMNS = 120
WRAPPED = f"hard-wrapped at {WRAP_COLUMNS} columns"


def _hard_wrapped(line: str) -> str:
    return "\n".join(line[i:i + WRAP_COLUMNS] for i in range(0, len(line), WRAP_COLUMNS)) or line


SHAPES[WRAPPED] = _hard_wrapped


def rewrite(src: Path, dst: Path, shape: str) -> None:
    """Copy the fold at `src` to `dst` with every log line written in `shape`."""
    write = SHAPES[shape]
    for case in sorted(p for p in src.iterdir() if p.is_dir() and p.name[:1].isdigit()):
        out = dst / case.name
        out.mkdir(parents=True)
        for path in case.iterdir():
            if path.suffix == ".log":
                lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                if shape in NUMBERED:
                    lines = [NUMBERED[shape](number, line) for number, line in enumerate(lines, start=1)]
                out.joinpath(path.name).write_text("".join(write(line) + "\n" for line in lines), encoding="utf-8")
            elif path.is_file() and path.name != CASE_FILE:
                shutil.copy(path, out / path.name)
        meta = yaml.safe_load((case / CASE_FILE).read_text(encoding="utf-8"))
        if shape in JSON_SHAPES:
            meta["facts"] = [json.dumps(fact)[1:-1] for fact in meta["facts"]]
        elif shape in ESCAPED_SHAPES:
            meta["facts"] = [write(fact) for fact in meta["facts"]]
        elif shape == WRAPPED:
            # Facts are not scored here, but a case must name at least one that is in its logs: those a wrap cut
            # are dropped, and a failure left with none names its first wrapped line.
            text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(out.iterdir()))
            meta["facts"] = [f for f in meta["facts"] if f in text] or (
                [] if meta["category"] == "unknown" else [next(line for line in text.splitlines() if line.strip())])
        out.joinpath(CASE_FILE).write_text(yaml.safe_dump(meta, allow_unicode=True), encoding="utf-8")


def score(root: Path) -> tuple[dict[str, str], float, float]:
    """Each case's predicted category, the accuracy, and the share of failure logs called unknown."""
    scores = evaluate(load_cases(root), rule_predictor(load_rules()))
    return {r.case.name: r.predicted.value for r in scores.results}, scores.accuracy, scores.unknown_on_failures or 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fold", action="append", choices=sorted(FOLDS),
                        help="fold(s) to rewrite (default: dev, test)")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), help="shape(s) (default: all)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    folds = args.fold or ["dev", "test"]
    shapes = args.shape or list(SHAPES)
    console = Console(stderr=args.json)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="argus-shapes-") as tmp, Progress(console=console, transient=True) as bar:
        task = bar.add_task("rewriting and scoring", total=len(folds) * (len(shapes) + 1))
        for fold in folds:
            plain, accuracy, unknown = score(FOLDS[fold])
            rows.append({"fold": fold, "shape": "as collected", "cases": len(plain), "accuracy": accuracy,
                         "unknown_on_failures": unknown, "changed": 0})
            bar.advance(task)
            for shape in shapes:
                dst = Path(tmp) / fold / shape.replace(" ", "_")
                rewrite(FOLDS[fold], dst, shape)
                got, accuracy, unknown = score(dst)
                rows.append({"fold": fold, "shape": shape, "cases": len(got), "accuracy": accuracy,
                             "unknown_on_failures": unknown,
                             "changed": sum(got[name] != plain[name] for name in plain)})
                shutil.rmtree(dst)
                bar.advance(task)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="RCA (rules) on the folds rewritten line by line")
    for column in ("fold", "shape", "cases", "accuracy", "unknown on failures", "cases changed"):
        table.add_column(column, justify="left" if column in ("fold", "shape") else "right")
    for row in rows:
        table.add_row(str(row["fold"]), str(row["shape"]), str(row["cases"]), f"{row['accuracy']:.3f}",
                      f"{row['unknown_on_failures']:.1%}", str(row["changed"]))
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
