"""Classification of real failure logs, the ordering of causes, and reading awkward files."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from core.types import Category
from detectors.engine import MAX_LINE_CHARS, RuleSet, load_rules
from rca.analyze import MAX_LINE_BYTES, analyze_lines, iter_lines
from rca.classify import MAX_EVIDENCE, MAX_EVIDENCE_CHARS, classify, clip_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# file -> (winning rule, line of the first evidence row, other lines that must be in the evidence)
NODE_LOST = {
    "ray-2019_rllib_monitor_marked_dead.log": ("NodeMarkedDeadMissedHeartbeats", 3, {13}),
    "ray-2022_train_node_marked_dead.log": ("NodeMarkedDeadMissedHeartbeats", 6, set()),
    "ray-2022_dask_marked_dead_lost_objects.log": ("NodeMarkedDeadMissedHeartbeats", 1, {3}),
    "ray-2022_raylet_heartbeat_lag_marked_dead.log": ("RayletMarkedDeadByGcs", 3, {1}),
    "ray-2022_raylet_terminated_unexpectedly.log": ("RayletTerminatedUnexpectedly", 1, set()),
    "ray-2023_stress_actor_node_died.log": ("ActorDiedNodeDied", 18, set()),
    "ray-2023_gcs_health_check_failing.log": ("GcsHealthCheckFailing", 1, set()),
    "ray-2024_train_actor_node_died.log": ("ActorDiedNodeDied", 15, set()),
    "ray-2025_event_gcs_node_removed.log": ("NodeMarkedDeadMissedHeartbeats", 1, set()),
    "ray-2025_event_raylet_marked_dead.log": ("RayletMarkedDeadByGcs", 1, set()),
    "ray-2026_train_controller_node_preempted.log": ("ActorDiedNodeDied", 10, {11}),
    "easyr1-2025_owner_node_crashed.log": ("OwnerNodeCrashed", 15, set()),
}
OTHER = sorted(p.name for p in (FIXTURES / "other").glob("*.log"))


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules()


def analyze_file(path: Path, rules: RuleSet) -> dict:
    with path.open("rb") as stream:
        return analyze_lines(str(path), iter_lines(stream), rules)


def test_every_fixture_is_listed_in_sources() -> None:
    sources = (FIXTURES / "SOURCES.md").read_text(encoding="utf-8")
    files = sorted(FIXTURES.glob("*/*.log"))
    assert len(files) >= len(NODE_LOST) + 2
    for path in files:
        assert f"`{path.name}`" in sources, f"{path.name} has no entry in SOURCES.md"
    assert {p.name for p in (FIXTURES / "node_lost").glob("*.log")} == set(NODE_LOST)


@pytest.mark.parametrize("name", sorted(NODE_LOST))
def test_real_node_lost_logs(name: str, rules: RuleSet) -> None:
    reason, first_line, also = NODE_LOST[name]
    path = FIXTURES / "node_lost" / name
    result = analyze_file(path, rules)
    assert result["category"] == "node_lost"
    lines = [row["line"] for row in result["evidence"]]
    assert lines[0] == first_line
    assert also <= set(lines)
    text = path.read_text(encoding="utf-8").splitlines()[first_line - 1]
    assert result["evidence"][0]["text"] == clip_text(text)
    assert rules.get(reason).description in result["summary"]
    assert result["recommended_action"] == rules.get(reason).action
    if rules.get(reason).permanent:
        assert result["confidence"] >= 0.8
    else:
        assert 0 < result["confidence"] <= 0.5


@pytest.mark.parametrize("name", OTHER)
def test_real_other_failures_and_healthy_runs_are_not_node_lost(name: str, rules: RuleSet) -> None:
    """Their exact verdicts are in tests/fixtures/logs/expected.yaml (tests/rca/test_categories.py)."""
    result = analyze_file(FIXTURES / "other" / name, rules)
    assert result["category"] != "node_lost"


def test_result_has_exactly_the_documented_keys(rules: RuleSet) -> None:
    result = analyze_file(FIXTURES / "node_lost" / "ray-2022_train_node_marked_dead.log", rules)
    assert set(result) == {"path", "category", "summary", "evidence", "confidence", "recommended_action"}
    assert all(set(row) == {"line", "text"} for row in result["evidence"])


# --- ordering -------------------------------------------------------------------------------------


ORDERING_RULES = """\
source: job-logs
rules:
  - {reason: LostNode, category: node_lost, type: permanent, priority: 90, confidence: 0.9, pattern: 'NODE LOST'}
  - {reason: OtherNodeSign, category: node_lost, type: permanent, priority: 90, confidence: 0.8, pattern: 'NODE GONE'}
  - {reason: HostOom, category: host_oom, type: permanent, priority: 88, confidence: 0.9, pattern: 'HOST OOM'}
  - {reason: BadGpu, category: gpu_hardware, type: permanent, priority: 95, confidence: 0.9, pattern: 'XID 79'}
  - {reason: NcclBroke, category: nccl_error, type: permanent, priority: 40, confidence: 0.9, pattern: 'NCCL ERROR'}
  - {reason: NcclTimeout, category: nccl_hang, type: permanent, priority: 35, confidence: 0.9, pattern: 'NCCL TIMEOUT'}
  - {reason: UserBug, category: user_error, type: permanent, priority: 30, confidence: 0.6, pattern: 'KeyError: '}
  - {reason: NcclSlow, category: nccl_hang, type: temporary, priority: 30, confidence: 0.6, pattern: 'NCCL SLOW'}
  - {reason: DiskWarn, category: disk_full, type: temporary, priority: 70, confidence: 0.5, pattern: 'DISK 95%'}
"""


@pytest.fixture()
def ordering(tmp_path: Path) -> RuleSet:
    path = tmp_path / "ordering.yaml"
    path.write_text(textwrap.dedent(ORDERING_RULES), encoding="utf-8")
    return RuleSet.load([path])


def test_higher_priority_beats_an_earlier_line(ordering: RuleSet) -> None:
    matches = list(ordering.scan(["NCCL ERROR on rank 3", "noise", "NODE LOST 10.0.0.2"], "job.log"))
    result = classify(matches)
    assert (result.category, result.reason) == (Category.NODE_LOST, "LostNode")
    assert [row[1] for row in result.evidence] == [3, 1]


def test_among_equal_priority_the_first_line_wins(ordering: RuleSet) -> None:
    matches = list(ordering.scan(["NODE GONE b", "NODE LOST a"], "job.log"))
    result = classify(matches)
    assert result.reason == "OtherNodeSign"
    assert result.evidence[0][1] == 1
    # a second sign of the same cause backs it up
    assert result.confidence > 0.8


def test_a_root_cause_beats_echoes_printed_before_it(ordering: RuleSet) -> None:
    # survivors' NCCL errors and timeouts often print before Ray declares the node dead
    lines = ["NCCL ERROR rank 1", "NCCL TIMEOUT rank 2", "KeyError: 'x'", "NODE LOST 10.0.0.2"]
    result = classify(list(ordering.scan(lines, "job.log")))
    assert (result.category, result.evidence[0][1]) == (Category.NODE_LOST, 4)
    assert "Treated as consequences of it: nccl_error, nccl_hang, user_error." in result.summary


def test_among_root_causes_the_first_in_time_wins(ordering: RuleSet) -> None:
    # the OOM that killed the raylet comes first; the lost node is its consequence
    result = classify(list(ordering.scan(["step 1", "HOST OOM on 10.0.0.2", "NODE LOST 10.0.0.2"], "job.log")))
    assert (result.category, result.reason) == (Category.HOST_OOM, "HostOom")
    # priority only breaks ties on the same line
    same_line = classify(list(ordering.scan(["HOST OOM and XID 79"], "job.log")))
    assert same_line.category is Category.GPU_HARDWARE


def test_among_echoes_the_first_in_time_wins(ordering: RuleSet) -> None:
    # a rank's own Python error makes the other ranks time out: the error is the cause
    first = classify(list(ordering.scan(["KeyError: 'responses'", "NCCL TIMEOUT rank 3"], "job.log")))
    assert first.category is Category.USER_ERROR
    later = classify(list(ordering.scan(["NCCL TIMEOUT rank 3", "KeyError: 'responses'"], "job.log")))
    assert later.category is Category.NCCL_HANG


def test_a_temporary_root_cause_sign_does_not_beat_a_permanent_echo(ordering: RuleSet) -> None:
    result = classify(list(ordering.scan(["DISK 95% full", "NCCL ERROR"], "job.log")))
    assert result.category is Category.NCCL_ERROR
    alone = classify(list(ordering.scan(["NCCL SLOW", "DISK 95% full"], "job.log")))
    assert alone.category is Category.DISK_FULL and alone.confidence <= 0.5


def test_temporary_matches_alone_give_lower_confidence(ordering: RuleSet) -> None:
    result = classify(list(ordering.scan(["NCCL SLOW"], "job.log")))
    assert result.category is Category.NCCL_HANG
    assert result.confidence < 0.6
    permanent = classify(list(ordering.scan(["NCCL SLOW", "NCCL ERROR"], "job.log")))
    assert permanent.category is Category.NCCL_ERROR


def test_no_match_is_unknown_with_low_confidence() -> None:
    result = classify([], lines_scanned=42)
    assert result.category is Category.UNKNOWN and result.reason is None
    assert 0.0 <= result.confidence <= 0.2
    assert "No known failure signature" in result.summary and "42 lines" in result.summary
    assert result.evidence == []


def test_evidence_is_bounded(ordering: RuleSet) -> None:
    lines = [f"NCCL ERROR {i} " + "y" * 2000 for i in range(50)]
    result = classify(list(ordering.scan(lines, "job.log")))
    assert len(result.evidence) == MAX_EVIDENCE
    assert all(len(text) <= MAX_EVIDENCE_CHARS for _, _, text in result.evidence)
    assert [row[1] for row in result.evidence] == list(range(1, MAX_EVIDENCE + 1))


# --- reading awkward input ------------------------------------------------------------------------


def test_non_utf8_crlf_and_partial_last_line(rules: RuleSet) -> None:
    raw = (
        b"\xff\xfe garbage \x80\x81\r\n"
        b"ok line\r\n"
        b"The actor died because its node has died. Node Id: 1f2e\xc3\r\n"
        b"last line without newline"
    )
    lines = list(iter_lines(io.BytesIO(raw)))
    assert len(lines) == 4
    assert lines[1] == "ok line" and lines[3] == "last line without newline"
    assert "\ufffd" in lines[0] and not any(line.endswith("\r") for line in lines)
    result = analyze_lines("x.log", iter_lines(io.BytesIO(raw)), rules)
    assert result["category"] == "node_lost"
    assert result["evidence"][0]["line"] == 3


def test_empty_input_is_unknown(rules: RuleSet) -> None:
    assert list(iter_lines(io.BytesIO(b""))) == []
    result = analyze_lines("empty.log", iter_lines(io.BytesIO(b"")), rules)
    assert result["category"] == "unknown" and result["evidence"] == []
    assert result["confidence"] <= 0.2


def test_text_streams_and_byte_lines_are_accepted(rules: RuleSet) -> None:
    text = "hello\nThe actor is dead because its node has died. Node Id: ab\n"
    assert list(iter_lines(io.StringIO(text))) == ["hello", "The actor is dead because its node has died. Node Id: ab"]
    result = analyze_lines("b", [b"hello", b"The actor is dead because its node has died."], rules)
    assert result["category"] == "node_lost" and result["evidence"][0]["line"] == 2


def test_huge_single_line_is_cut_while_reading(tmp_path: Path, rules: RuleSet) -> None:
    path = tmp_path / "huge.log"
    with path.open("wb") as out:
        out.write(b"first\n")
        out.write(b"The actor died because its node has died. ")
        for _ in range(20):
            out.write(b"z" * (1024 * 1024))
        out.write(b"\nafter the huge line\n")
    with path.open("rb") as stream:
        lines = list(iter_lines(stream))
    assert [len(line) <= MAX_LINE_BYTES for line in lines] == [True, True, True]
    assert lines[0] == "first" and lines[2] == "after the huge line"
    assert len(lines[1]) > MAX_LINE_CHARS  # so the engine knows it was cut
    result = analyze_file(path, rules)
    assert result["category"] == "node_lost"
    assert result["evidence"][0]["line"] == 2
    assert "line cut at" in result["evidence"][0]["text"]


def test_huge_line_without_newline_at_end(rules: RuleSet) -> None:
    raw = b"a\n" + b"x" * (3 * MAX_LINE_BYTES)
    lines = list(iter_lines(io.BytesIO(raw)))
    assert lines[0] == "a" and len(lines) == 2 and len(lines[1]) == MAX_LINE_BYTES
