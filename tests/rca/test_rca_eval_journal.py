"""bench/rca_eval.py --journal: a long run done in pieces. Each case's result is written as it is scored and taken back
on the next run while the rules, the code and the case's logs are unchanged; a record cut short by a killed run is
dropped and that case scored again; a damaged record elsewhere is an error that names the file and line.

Real: three hold-out cases copied to a temporary folder, scored by the rules (the LLM mode journals the same way).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import rca_eval  # noqa: E402


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    root = tmp_path / "cases"
    for folder in sorted(p for p in (ROOT / "tests" / "rca_holdout").iterdir() if p.is_dir())[:3]:
        shutil.copytree(folder, root / folder.name)
    return root


def run(cases: Path, journal: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    assert rca_eval.main(["--root", str(cases), "--journal", str(journal), "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out)["folds"]["cases"], out.err


def test_a_second_run_takes_every_case_from_the_journal(cases: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "journal.jsonl"
    first, err = run(cases, journal, capsys)
    assert "0 case(s) taken" in err and len(journal.read_text().splitlines()) == 3
    second, err = run(cases, journal, capsys)
    assert "3 case(s) taken" in err and second["accuracy"] == first["accuracy"]
    assert second["per_category"] == first["per_category"]


def test_a_changed_log_is_scored_again(cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "journal.jsonl"
    run(cases, journal, capsys)
    log = next(next(p for p in sorted(cases.iterdir())).glob("*.log"))
    log.write_text(log.read_text() + "one more line\n")
    _, err = run(cases, journal, capsys)
    assert "2 case(s) taken" in err


def test_a_record_cut_short_is_dropped_and_a_damaged_one_is_named(cases: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "journal.jsonl"
    run(cases, journal, capsys)
    kept = journal.read_text().splitlines()
    journal.write_text("\n".join(kept[:2]) + "\n" + kept[2][:40])  # killed while writing the third
    _, err = run(cases, journal, capsys)
    assert "2 case(s) taken" in err and len(journal.read_text().splitlines()) == 3
    journal.write_text("\n".join([kept[0], "not json", kept[2]]) + "\n")
    with pytest.raises(SystemExit, match=r"journal.jsonl:2: not a journal record"):
        rca_eval.main(["--root", str(cases), "--journal", str(journal), "--json"])
