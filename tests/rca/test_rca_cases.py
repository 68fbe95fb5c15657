"""The RCA evaluation sets: the dev fold (tests/rca_cases/) and the test fold (tests/rca_test/). Every case is well
formed and in the fold its thread hashes to, no thread is used twice across them and tests/rca_holdout/, the dev
fold is large and covers every category a log can show, and the deterministic classifier gets at least 90% of the
dev fold right. The test fold and the hold-out set are measured by bench/rca_eval.py, never held to a bar here.

Real: the log lines were copied from public issue threads (each case.yaml cites its thread), the built-in rule
files and `argus analyze`'s classifier. The accuracy test is the bar the rules must reach; it reports the
misses with the rule that won, so a failing run says what to fix.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import pytest

from core.errors import InputError
from core.types import Category
from detectors.engine import RuleSet, load_rules
from rca.cases import (
    FOLDER_NAME,
    SOURCE_URL,
    Case,
    check_numbering,
    evaluate,
    fold_of,
    load_case,
    load_cases,
    rule_predictor,
    thread_of,
)

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS / "rca_cases"  # the dev fold
TEST_FOLD = TESTS / "rca_test"
HOLDOUT = TESTS / "rca_holdout"
BEFORE_THE_SPLIT = 63  # dev cases 01-63 predate fold_of
FOLDERS = sorted(p for p in ROOT.iterdir() if p.is_dir())
TEST_FOLDERS = sorted(p for p in TEST_FOLD.iterdir() if p.is_dir())
MIN_CASES = 60
MIN_ACCURACY = 0.9
# idle_gpu is found from GPU metrics (utilisation held at zero by a job), unschedulable from Ray's job and
# placement-group state, training_anomaly from a job's step metrics judged as series (detectors/training_health.py,
# tested on real excerpts in tests/detectors/test_training_health_real_logs.py), never from a log line alone.
NOT_FROM_LOGS = {Category.IDLE_GPU, Category.UNSCHEDULABLE, Category.TRAINING_ANOMALY}
LOG_CATEGORIES = {c for c in Category if c not in NOT_FROM_LOGS}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases(ROOT)


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules([])


@pytest.mark.parametrize("folders", [FOLDERS, TEST_FOLDERS], ids=["dev", "test"])
def test_folder_names_are_numbered_and_unique(folders: list[Path]) -> None:
    names = [p.name for p in folders]
    assert all(FOLDER_NAME.match(n) for n in names), [n for n in names if not FOLDER_NAME.match(n)]
    check_numbering(names)  # raises on a gap or a repeated number
    assert len({n.split("_", 1)[1] for n in names}) == len(names), "two cases share a slug"


def test_every_new_case_is_in_the_fold_its_thread_hashes_to_and_no_thread_is_used_twice() -> None:
    dev, test = load_cases(ROOT), load_cases(TEST_FOLD)
    assert len(test) >= 60
    assert [c.name for c in dev[BEFORE_THE_SPLIT:] if fold_of(c.source) != "dev"] == []
    assert [c.name for c in test if fold_of(c.source) != "test"] == []
    threads = [thread_of(c.source) for c in [*dev, *test, *load_cases(HOLDOUT)]]
    assert sorted({t for t in threads if threads.count(t) > 1}) == []


def test_no_case_comes_from_a_thread_the_rules_were_tuned_on_as_a_probe() -> None:
    # bench/rca_probe/ holds single lines from threads the rules were changed for: a case from one of them is not blind
    probe = Path(__file__).resolve().parents[2] / "bench" / "rca_probe"
    probed = {thread_of(m.group(1))
              for path in probe.glob("*.txt") for m in re.finditer(r"^url: *(\S+)", path.read_text(), re.MULTILINE)}
    assert len(probed) > 700
    cases = [*load_cases(ROOT), *load_cases(TEST_FOLD), *load_cases(HOLDOUT)]
    assert sorted(c.name for c in cases if thread_of(c.source) in probed) == []


def test_the_fold_of_a_thread_is_fixed_by_its_url_alone() -> None:
    url = "https://github.com/ray-project/ray/issues/12345"
    assert fold_of(url) == fold_of(url + "  # comment by someone") == fold_of(url + "/")
    assert {fold_of(f"https://github.com/o/r/issues/{n}") for n in range(40)} == {"dev", "test"}


@pytest.mark.parametrize("folder", FOLDERS + TEST_FOLDERS,
                         ids=[f"{p.parent.name}/{p.name}" for p in FOLDERS + TEST_FOLDERS])
def test_case_is_valid(folder: Path) -> None:
    case = load_case(folder)
    assert SOURCE_URL.match(case.source)
    assert case.category in Category
    assert case.logs and all(log.is_file() and log.parent == folder for log in case.logs)
    text = case.text()
    for fact in case.facts:
        assert fact in text, f"fact {fact!r} is not a verbatim substring of {folder.name}'s logs"
    assert 1 <= len(case.facts) <= 5 or (case.category is Category.UNKNOWN and not case.facts)


def test_a_fact_missing_from_the_logs_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "01_made_up"
    folder.mkdir()
    (folder / "job.log").write_text("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    (folder / "case.yaml").write_text(
        "source: https://github.com/o/r/issues/1\ncategory: gpu_oom\nfacts: ['Tried to allocate 4.00 GiB']\n"
        "note: a fact that is not in the log\n"
    )
    with pytest.raises(InputError, match="not in its logs"):
        load_case(folder)


def test_a_category_outside_the_closed_list_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "01_made_up"
    folder.mkdir()
    (folder / "job.log").write_text("anything\n")
    (folder / "case.yaml").write_text(
        "source: https://github.com/o/r/issues/1\ncategory: cosmic_ray\nfacts: ['anything']\nnote: bad category\n"
    )
    with pytest.raises(InputError, match="closed list"):
        load_case(folder)


def test_the_set_is_large_and_covers_every_log_category(cases: list[Case]) -> None:
    assert len(cases) >= MIN_CASES
    covered = {c.category for c in cases}
    assert LOG_CATEGORIES <= covered, f"no case for {sorted(c.value for c in LOG_CATEGORIES - covered)}"
    assert not NOT_FROM_LOGS & covered  # a log-only idle_gpu case would test nothing the detector reads


def test_several_logs_are_read_in_the_listed_order(cases: list[Case]) -> None:
    # a case whose `logs:` order is not the sorted order, so reading sorted files would show here
    reordered = [c for c in cases if len(c.logs) > 1 and list(c.logs) != sorted(c.logs)]
    assert reordered, "the set should hold a case whose logs are listed out of name order"
    for case in reordered:
        with ExitStack() as stack:
            streamed = list(case.lines(stack))
        expected = [line for log in case.logs for line in log.read_text(encoding="utf-8").splitlines()]
        assert streamed == expected


def test_scores_count_facts_only_in_the_report_text(cases: list[Case]) -> None:
    case = next(c for c in cases if len(c.facts) >= 2)
    scores = evaluate([case], lambda c: (c.category, c.facts[0]))
    assert scores.accuracy == 1.0
    assert scores.results[0].facts_found == (case.facts[0],)
    assert scores.facts_covered == pytest.approx(1 / len(case.facts))
    wrong = next(c for c in Category if c is not case.category)
    assert evaluate([case], lambda c: (wrong.value, "")).misses[0].predicted is wrong


def test_the_unknown_profile_counts_failure_words_in_the_logs_called_unknown(tmp_path: Path) -> None:
    logs = {
        "01_failure_with_a_word": ("host_oom", "worker 3 was killed\n"),
        "02_failure_without_one": ("node_lost", "step 10 loss=1.2\n"),
        "03_healthy_with_a_word": ("unknown", "retrying after a timeout\n"),
        "04_healthy_without_one": ("unknown", "step 11 loss=1.1\n"),
        "05_failure_named": ("gpu_oom", "CUDA out of memory\n"),
    }
    for name, (category, text) in logs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.log").write_text(text)
        facts = [] if category == "unknown" else [text.split()[0]]
        (tmp_path / name / "case.yaml").write_text(
            f"source: https://github.com/o/r/issues/{name[:2]}\ncategory: {category}\nfacts: {facts}\nnote: made up\n"
        )
    # every case called unknown except the last, which is called what it is
    scores = evaluate(load_cases(tmp_path), lambda c: ("gpu_oom" if c.name.startswith("05") else "unknown", ""))
    assert scores.unknown_profile() == {
        "failures_called_unknown": 2, "of_them_with_a_failure_word": 1,
        "healthy_called_unknown": 2, "of_those_with_a_failure_word": 1,
    }


def test_deterministic_accuracy(cases: list[Case], rules: RuleSet) -> None:
    scores = evaluate(cases, rule_predictor(rules))
    misses = "\n".join(
        f"  {m.case.name}: expected {m.case.category.value}, got {m.predicted.value} ({m.reason or 'no rule'})"
        for m in scores.misses
    )
    accuracy = scores.accuracy
    assert accuracy >= MIN_ACCURACY, f"accuracy {accuracy:.1%} < {MIN_ACCURACY:.0%}; misses:\n{misses}"
