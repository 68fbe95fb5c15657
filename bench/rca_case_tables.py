"""Keep the evaluation folds' README tables in step with their case folders.

Each fold's README lists every case (folder, thread, category, flags, why) and the dev README counts the cases of
both folds per category. Those tables were kept by hand and once lost 300 rows in an edit; this writes what is
missing from the cases themselves and says what disagrees:

    .venv/bin/python bench/rca_case_tables.py           # check: exit 1 and name each difference
    .venv/bin/python bench/rca_case_tables.py --write   # add rows for new cases, rewrite the counts table

A row written here takes the case's note as its "why"; a row already in the table is kept as it is (its text
may be a shorter summary of the note written by hand). tests/rca/test_case_tables.py runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.types import Category  # noqa: E402
from rca.cases import Case, load_cases  # noqa: E402

FOLDS = {"dev": ROOT / "tests/rca_cases", "test": ROOT / "tests/rca_test"}
ROW = re.compile(r"^\| `(?P<folder>[^`]+)` \| (?P<rest>.*)\|\s*$")
COUNTED = [c for c in Category if c not in (Category.IDLE_GPU, Category.UNSCHEDULABLE, Category.TRAINING_ANOMALY)]
COUNTS_HEADING = "## Counts per category"


@dataclass
class FoldTable:
    readme: Path
    text: str
    rows: dict[str, str]  # folder -> its whole table line

    @classmethod
    def read(cls, folder: Path) -> FoldTable:
        readme = folder / "README.md"
        text = readme.read_text(encoding="utf-8")
        rows = {m["folder"]: line for line in text.splitlines() if (m := ROW.match(line))}
        return cls(readme, text, rows)


def source_label(source: str) -> str:
    """`owner/repo#N` for a GitHub thread, else the address without its scheme."""
    match = re.match(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)", source)
    return f"{match[1]}#{match[2]}" if match else re.sub(r"^https?://", "", source)


def row_of(case: Case, note: str) -> str:
    why = " ".join(note.split()).replace("|", "\\|")
    flags = "hard negative" if case.hard_negative else ""
    return f"| `{case.name}` | [{source_label(case.source)}]({case.source}) | {case.category.value} | {flags} | {why} |"


def note_of(case: Case) -> str:
    raw = yaml.safe_load((case.path / "case.yaml").read_text(encoding="utf-8")) or {}
    return str(raw.get("note") or "")


def row_category(row: str) -> str:
    return [cell.strip() for cell in row.strip().strip("|").split("|")][2]


def counts_table(folds: dict[str, list[Case]]) -> str:
    lines = [
        "| category | dev cases | dev hard negatives | test-fold cases | test-fold hard negatives |",
        "|---|---:|---:|---:|---:|",
    ]
    totals = Counter[str]()
    for category in COUNTED:
        cells = []
        for fold in ("dev", "test"):
            cases = [c for c in folds[fold] if c.category is category]
            hard = sum(c.hard_negative for c in cases)
            totals[f"{fold} cases"] += len(cases)
            totals[f"{fold} hard"] += hard
            cells += [str(len(cases)), str(hard)]
        lines.append(f"| {category.value} | " + " | ".join(cells) + " |")
    lines.append(
        "| **total** | " + " | ".join(f"**{totals[k]}**" for k in ("dev cases", "dev hard", "test cases", "test hard"))
        + " |"
    )
    return "\n".join(lines)


def differences(folds: dict[str, list[Case]], tables: dict[str, FoldTable]) -> list[str]:
    found = []
    for fold, cases in folds.items():
        table = tables[fold]
        names = {c.name for c in cases}
        for case in cases:
            row = table.rows.get(case.name)
            if row is None:
                found.append(f"{table.readme}: no row for case {case.name}")
            elif row_category(row) != case.category.value:
                found.append(f"{table.readme}: {case.name} is listed as {row_category(row)}, its case.yaml says "
                             f"{case.category.value}")
        found += [f"{table.readme}: a row for {name}, which is not a case folder" for name in table.rows
                  if name not in names]
    if counts_table(folds) not in tables["dev"].text:
        found.append(f"{tables['dev'].readme}: the counts table under '{COUNTS_HEADING}' is not the cases' counts")
    return found


def write(folds: dict[str, list[Case]], tables: dict[str, FoldTable]) -> None:
    for fold, cases in folds.items():
        table = tables[fold]
        lines = table.text.splitlines()
        kept = [line for line in lines if not ROW.match(line)]
        at = next(i for i, line in enumerate(kept) if line.startswith("|---|---|---|")) + 1
        rows = [table.rows.get(c.name) or row_of(c, note_of(c)) for c in cases]
        text = "\n".join([*kept[:at], *rows, *kept[at:]]) + "\n"
        if fold == "dev":
            start = text.index(COUNTS_HEADING)
            header = text.index("| category |", start)
            end = text.index("\n\n", text.index("| **total**", header))
            text = text[:header] + counts_table(folds) + text[end:]
        table.readme.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="add missing rows and rewrite the counts table")
    args = parser.parse_args(argv)
    folds = {fold: load_cases(folder) for fold, folder in FOLDS.items()}
    tables = {fold: FoldTable.read(folder) for fold, folder in FOLDS.items()}
    if args.write:
        write(folds, tables)
        tables = {fold: FoldTable.read(folder) for fold, folder in FOLDS.items()}
    found = differences(folds, tables)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
