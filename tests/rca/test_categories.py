"""Every fault class on real logs: each fixture under tests/fixtures/logs/ gets the verdict recorded in
tests/fixtures/logs/expected.yaml (category, winning rule, first evidence line).

Real: the log text (copied from public GitHub issues, see SOURCES.md), the built-in rule files and the
classifier. Nothing is simulated; the fast stream scanner and the line-by-line scanner must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.types import Category
from detectors.engine import RuleSet, load_rules, rule_text
from rca.analyze import analyze_lines, analyze_stream, iter_lines
from rca.classify import clip_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
EXPECTED: dict[str, dict] = yaml.safe_load((FIXTURES / "expected.yaml").read_text(encoding="utf-8"))
ROOT_CAUSE_FOLDERS = ("gpu_oom", "host_oom", "nccl_error", "nccl_hang", "gpu_hardware", "disk_full", "user_error")


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules()


def test_expectations_cover_every_fixture_and_nothing_else() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("*/*.log")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("folder", ROOT_CAUSE_FOLDERS)
def test_each_category_has_three_real_positives(folder: str) -> None:
    names = [n for n in EXPECTED if n.startswith(f"{folder}/")]
    assert len(names) >= 3
    assert all(EXPECTED[n]["category"] == folder for n in names)


def test_negatives_and_mixed_logs_are_there() -> None:
    assert sum(n.startswith("negative/") for n in EXPECTED) >= 3
    assert all(EXPECTED[n]["category"] == "unknown" for n in EXPECTED if n.startswith("negative/"))
    mixed = {EXPECTED[n]["category"] for n in EXPECTED if n.startswith("mixed/")}
    assert {"gpu_oom", "node_lost", "gpu_hardware"} <= mixed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verdict(name: str, rules: RuleSet) -> None:
    want = EXPECTED[name]
    path = FIXTURES / name
    with path.open("rb") as stream:
        result = analyze_stream(str(path), stream, rules)
    assert result["category"] == want["category"]
    assert Category(result["category"])
    if want["category"] == "unknown":
        assert result["evidence"] == [] and result["confidence"] <= 0.2
        return
    rule = rules.get(want["reason"])
    assert rule is not None and rule.category.value == want["category"]
    first = result["evidence"][0]
    assert first["line"] == want["line"]
    text = path.read_text(encoding="utf-8").splitlines()[want["line"] - 1]
    assert first["text"] == clip_text(text)
    assert rule.finds(rule_text(text))
    assert rule.description in result["summary"]
    assert result["recommended_action"] == rule.action
    assert 0.2 < result["confidence"] <= 0.99


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stream_and_line_scanners_agree(name: str, rules: RuleSet) -> None:
    path = FIXTURES / name
    with path.open("rb") as stream:
        fast = analyze_stream(str(path), stream, rules)
    with path.open("rb") as stream:
        slow = analyze_lines(str(path), iter_lines(stream), rules)
    assert fast == slow


def test_cause_named_in_summary_with_its_echoes(rules: RuleSet) -> None:
    path = FIXTURES / "mixed" / "composed_cuda_oom_then_watchdog_timeouts.log"
    with path.open("rb") as stream:
        result = analyze_stream(str(path), stream, rules)
    assert result["category"] == "gpu_oom"
    assert "Treated as consequences of it: nccl_hang." in result["summary"]
    # the echoes stay visible as evidence after the cause
    assert any("Watchdog caught collective operation timeout" in row["text"] for row in result["evidence"][1:])
