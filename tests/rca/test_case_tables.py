"""The folds' README tables list every case with its category, and the dev README's counts are the cases' counts
(bench/rca_case_tables.py keeps them; an edit once dropped 300 rows without a test noticing).

Real: the committed case folders and READMEs. A synthetic copy checks that the check finds each kind of drift.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import rca_case_tables as tables  # noqa: E402


def test_committed_tables_match_the_cases() -> None:
    assert tables.main([]) == 0


@pytest.fixture
def copied_folds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    folds = {}
    for fold, folder in tables.FOLDS.items():
        shutil.copytree(folder, tmp_path / fold)
        folds[fold] = tmp_path / fold
    monkeypatch.setattr(tables, "FOLDS", folds)
    return folds


def test_a_missing_row_a_wrong_category_and_stale_counts_are_named(
        copied_folds: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    readme = copied_folds["dev"] / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| `01_"))
    second = lines[first + 1]
    del lines[first]
    lines[first] = second.replace("| gpu_oom |", "| host_oom |", 1)
    readme.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (copied_folds["test"] / "README.md").write_text(
        (copied_folds["test"] / "README.md").read_text(encoding="utf-8") + "| `999_gone` | x | unknown |  | x |\n",
        encoding="utf-8")

    assert tables.main([]) == 1
    said = capsys.readouterr().out
    assert "no row for case 01_" in said
    assert "is listed as host_oom, its case.yaml says gpu_oom" in said
    assert "a row for 999_gone, which is not a case folder" in said


def test_write_adds_rows_for_new_cases_and_recounts(copied_folds: dict[str, Path]) -> None:
    dev = copied_folds["dev"]
    last = max((p.name for p in dev.iterdir() if p.is_dir()), key=lambda name: int(name.split("_", 1)[0]))
    number = int(last.split("_", 1)[0]) + 1
    new = dev / f"{number}_copied_healthy_case"
    shutil.copytree(dev / last, new)
    (new / "case.yaml").write_text(
        (new / "case.yaml").read_text(encoding="utf-8").replace(
            "source: ", "source: https://github.com/example/never/issues/1 # ", 1), encoding="utf-8")
    assert tables.main([]) == 1

    assert tables.main(["--write"]) == 0
    text = (dev / "README.md").read_text(encoding="utf-8")
    assert f"| `{new.name}` | [example/never#1](https://github.com/example/never/issues/1) |" in text
    assert tables.main([]) == 0
