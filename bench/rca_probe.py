"""How well the rules read single real log lines: the vocabulary probe under bench/rca_probe/.

The probe is about 790 entries, each a line (or two or three that belong together) copied verbatim from a log pasted
in a public thread, with the thread's address and what the thread shows the line meant: a category, `ambiguous`
where the thread settles nothing, `unknown` for a harmless line (format in bench/rca_probe/README.md). It is not a
case set: a line is not a whole log, and its category is a reader's judgment of the thread, so it is scored here, apart
from bench/rca_eval.py's folds. It measures vocabulary: how often the rules of `argus analyze` give a line the category
its thread settled (entries marked ambiguous are left out).

    .venv/bin/python bench/rca_probe.py            # per file and per category, with the disagreements
    .venv/bin/python bench/rca_probe.py --json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectors.engine import load_rules  # noqa: E402
from rca.analyze import analyze_lines  # noqa: E402
from rca.cases import thread_of  # noqa: E402

PROBE = Path(__file__).resolve().parent / "rca_probe"
_FIELD = re.compile(r"^(url|meaning|line): ?(.*)$")


@dataclass(frozen=True)
class Entry:
    file: str
    url: str
    expected: str  # a category, "ambiguous" or "unknown"
    meaning: str
    lines: tuple[str, ...]


def load_entries(root: Path = PROBE) -> list[Entry]:
    """Every entry of every probe file, in file order. An entry without a url, a meaning or a line is an error."""
    entries = []
    for path in sorted(root.glob("*.txt")):
        for number, block in enumerate(path.read_text(encoding="utf-8").split("\n---\n"), start=1):
            fields: dict[str, list[str]] = {"url": [], "meaning": [], "line": []}
            for raw in block.strip("\n").split("\n"):
                match = _FIELD.match(raw)
                if match:
                    fields[match.group(1)].append(match.group(2))
                elif raw.startswith(" ") and fields["meaning"] and not fields["line"]:
                    fields["meaning"][-1] += " " + raw.strip()  # a meaning wrapped over lines
            if not (fields["url"] and fields["meaning"] and fields["line"]):
                raise ValueError(f"{path.name} entry {number}: needs url:, meaning: and at least one line:")
            meaning = fields["meaning"][0]
            entries.append(Entry(path.name, fields["url"][0].strip(), meaning.split()[0].strip("-:,"), meaning,
                                 tuple(fields["line"])))
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rules = load_rules([])
    entries = load_entries()
    scored = []
    for entry in entries:
        if entry.expected == "ambiguous":
            continue
        got = analyze_lines(entry.url, list(entry.lines), rules)["category"]
        scored.append((entry, got))
    per_file: dict[str, list[int]] = {}
    per_category: dict[str, list[int]] = {}
    for entry, got in scored:
        for key, table in ((entry.file, per_file), (entry.expected, per_category)):
            counts = table.setdefault(key, [0, 0])
            counts[0] += got == entry.expected
            counts[1] += 1
    right = sum(counts[0] for counts in per_category.values())
    report = {
        "entries": len(entries),
        "threads": len({thread_of(e.url) for e in entries}),
        "scored": len(scored),
        "agreement": round(right / len(scored), 4) if scored else None,
        "per_file": {k: {"right": v[0], "scored": v[1]} for k, v in sorted(per_file.items())},
        "per_category": {k: {"right": v[0], "scored": v[1]} for k, v in sorted(per_category.items())},
        "disagreements": [{"file": e.file, "url": e.url, "expected": e.expected, "got": got}
                          for e, got in scored if got != e.expected],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    console = Console()
    console.print(f"{report['entries']} entries from {report['threads']} threads; {report['scored']} with a settled "
                  f"category; the rules agree on {right} ({report['agreement']:.3f})")
    for title, rows in (("per file", report["per_file"]), ("per category", report["per_category"])):
        table = Table(title=title)
        table.add_column("")
        table.add_column("right / scored", justify="right")
        for key, value in rows.items():
            table.add_row(key, f"{value['right']} / {value['scored']}")
        console.print(table)


if __name__ == "__main__":
    main()
