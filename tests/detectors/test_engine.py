"""The log rule engine: loading and validating rule files, matching, and hostile input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from core.errors import RuleError
from core.types import Category, Severity
from detectors.engine import (
    MAX_LINE_CHARS,
    RuleSet,
    RuleType,
    builtin_rule_dir,
    load_rules,
)

GOOD = """\
source: job-logs
rules:
  - reason: FirstRule
    category: node_lost
    type: permanent
    pattern: 'node \\w+ died'
    priority: 90
    action: drain it
  - reason: SecondRule
    category: gpu_oom
    type: temporary
    pattern: 'CUDA out of memory'
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(RuleError) as info:
        RuleSet.load([path])
    return str(info.value)


# --- loading --------------------------------------------------------------------------------------


def test_good_file_loads_with_defaults_and_locations(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    rules = RuleSet.load([path])
    first, second = rules.rules
    assert first.reason == "FirstRule" and first.category is Category.NODE_LOST
    assert first.type is RuleType.PERMANENT and first.severity is Severity.CRITICAL
    assert first.priority == 90 and first.action == "drain it"
    assert first.sources == ("job-logs",)
    assert (first.file, first.line) == (path, 3)
    assert (second.file, second.line) == (path, 9)
    assert second.type is RuleType.TEMPORARY and second.severity is Severity.WARNING
    assert second.confidence < first.confidence


def test_builtin_rules_load_and_cover_node_lost() -> None:
    rules = load_rules()
    assert (builtin_rule_dir() / "node_lost.yaml").is_file()
    node_lost = [r for r in rules if r.category is Category.NODE_LOST]
    assert any(r.permanent for r in node_lost) and any(not r.permanent for r in node_lost)
    assert all(r.action for r in rules), "every built-in rule says what to do"


def test_extra_rule_folder_is_loaded_and_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "extra.yml")
    rules = load_rules([tmp_path])
    assert rules.get("FirstRule") is not None
    with pytest.raises(RuleError, match="does not exist"):
        load_rules([tmp_path / "nope"])


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            """\
            source: job-logs
            rules:
              - reason: BadRegex
                category: node_lost
                type: permanent
                pattern: 'node (died'
            """,
            6,
            "bad regex: missing ), unterminated subpattern",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: BadCategory
                category: network_weather
                type: permanent
                pattern: 'x'
            """,
            4,
            "unknown category 'network_weather'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Fine
                category: node_lost
                type: permanent
                pattern: 'a'
              - reason: NoPattern
                category: node_lost
                type: permanent
            """,
            7,
            "missing required field 'pattern'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Twice
                category: node_lost
                type: permanent
                pattern: 'a'
              - reason: Twice
                category: node_lost
                type: temporary
                pattern: 'b'
            """,
            7,
            "duplicate rule reason 'Twice'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Extra
                category: node_lost
                type: permanent
                pattern: 'a'
                colour: red
            """,
            7,
            "unknown key 'colour'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Exponential
                category: node_lost
                type: permanent
                pattern: '(a+)+$'
            """,
            6,
            "nests unbounded repeats",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: EveryLine
                category: node_lost
                type: permanent
                pattern: 'x*'
            """,
            6,
            "matches the empty string",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: WrongType
                category: node_lost
                type: forever
                pattern: 'a'
            """,
            5,
            "unknown type 'forever'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: lower_case
                category: node_lost
                type: permanent
                pattern: 'a'
            """,
            3,
            "not a CamelCase name",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: BadConfidence
                category: node_lost
                type: permanent
                pattern: 'a'
                confidence: 7
            """,
            7,
            "confidence 7 is not a number from 0 to 1",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: KeyTwice
                category: node_lost
                category: gpu_oom
                type: permanent
                pattern: 'a'
            """,
            5,
            "key 'category' appears twice",
        ),
        ("- just\n- a list\n", 1, "must be a mapping"),
        ("", 1, "rule file is empty"),
        ("# only a comment\n", 1, "rule file is empty"),
        ("source: job-logs\nrules: [\n", 3, "not valid YAML"),
        ("source: job-logs\nrules: {}\n", 2, "`rules` must be a list"),
        ("rules:\n  - reason: A\n", 1, "missing `source`"),
        ("source: x\nrules:\n  - just a string\n", 3, "a rule must be a mapping"),
    ],
)
def test_bad_rule_files_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    assert f"{path}:{line}" in message
    assert fragment in message


def test_unknown_category_lists_the_allowed_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "source: x\nrules:\n  - {reason: A, category: oops, type: permanent, pattern: a}\n")
    message = load_error(path)
    assert "node_lost" in message and "gpu_oom" in message and "unknown" in message


def test_duplicate_reason_across_files_names_both(tmp_path: Path) -> None:
    one = write(tmp_path, GOOD, "one.yaml")
    two = write(tmp_path, GOOD, "two.yaml")
    with pytest.raises(RuleError) as info:
        RuleSet.load([one, two])
    assert f"{two}:3" in str(info.value) and f"{one}:3" in str(info.value)


def test_duplicate_of_a_builtin_reason_is_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        "source: x\nrules:\n  - {reason: NodeMarkedDeadMissedHeartbeats, category: node_lost, "
        "type: permanent, pattern: a}\n",
    )
    with pytest.raises(RuleError, match="duplicate rule reason 'NodeMarkedDeadMissedHeartbeats'"):
        load_rules([tmp_path])


# --- matching -------------------------------------------------------------------------------------


# Real phrasings from Ray's own messages across versions (Ray source strings and posted logs).
NODE_LOST_LINES = {
    "The node with client ID 1eadc9db2f074bfec34caf25dd5bf1f99fad0d59 has been marked dead because the "
    "monitor has missed too many heartbeats from it.": "NodeMarkedDeadMissedHeartbeats",
    "The node with node id: 75b2eec8a61cdafd37cc8072b1caf9abdeef9c4e74a4f24d5dfce28d and ip: 10.4.4.107 has "
    "been marked dead because the detector has missed too many heartbeats from it.": "NodeMarkedDeadMissedHeartbeats",
    "NodeState(state='DEAD', state_message='Unexpected termination: health check failed due to missing too "
    "many heartbeats')": "NodeHealthCheckFailed",
    "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats": (
        "NodeHealthCheckFailed"
    ),
    "The actor is dead because its node has died. Node Id: 677df2a9020c5db45e755b00": "ActorDiedNodeDied",
    "The actor died because its node has died. Node Id: b157c93de9603b1458ae4bd2": "ActorDiedNodeDied",
    "ray.exceptions.NodeDiedError: Task failed because the node it was running on is dead or unavailable. "
    "Node IP: 127.0.0.1": "TaskNodeDied",
    "[2022-02-16 12:46:52,789 C 149 149] node_manager.cc:170: This node has beem marked as dead.": (
        "RayletMarkedDeadByGcs"
    ),
    "[Timeout] Exiting because this node manager has mistakenly been marked as dead by the GCS: GCS failed "
    "to check the health of this node for 5 times.": "RayletMarkedDeadByGcs",
    "(raylet) Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL": (
        "RayletTerminatedUnexpectedly"
    ),
    "The actor 5e3c0a9b4f2d1e0c8a7b6c5d is unavailable: The actor is temporarily unavailable: IOError: "
    "Connection reset. The task may or may not have been executed on the actor.": "ActorUnavailable",
}


@pytest.mark.parametrize(("line", "reason"), sorted(NODE_LOST_LINES.items()))
def test_builtin_rules_match_real_phrasings(line: str, reason: str) -> None:
    assert reason in [r.reason for r in load_rules().match(line)]


@pytest.mark.parametrize(
    "line",
    [
        "Raylet is terminated. Termination is graceful.",
        "Node is marked as dead by GCS as it's already shutting down.",
        "The actor is dead because it was killed by `ray.kill`.",
        "The actor is dead because its worker process has died. Worker exit type: USER_ERROR",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB.",
        "step:1 - global_seqlen/min:484245.000 - actor/pg_loss:0.001 - perf/mfu/actor:0.343",
        "INFO worker.py:1852 -- Connected to Ray cluster. View the dashboard at 127.0.0.1:8265",
    ],
)
def test_builtin_rules_ignore_other_lines(line: str) -> None:
    assert [r.reason for r in load_rules().match(line) if r.permanent] == []


def test_heartbeat_lag_is_only_temporary() -> None:
    line = (
        "node_manager.cc:157: Last heartbeat was sent 6901 ms ago. There might be resource pressure on this "
        "node. If heartbeat keeps lagging, this node can be marked as dead mistakenly."
    )
    matched = load_rules().match(line)
    assert matched and all(not r.permanent for r in matched)


def test_scan_numbers_lines_and_labels_source(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, GOOD)])
    lines = ["ok", "node abc died\r\n", "CUDA out of memory", "node x died and CUDA out of memory"]
    found = [(m.rule.reason, m.line_no, m.source) for m in rules.scan(lines, "job.log", start_line=10)]
    assert found == [
        ("FirstRule", 11, "job.log"),
        ("SecondRule", 12, "job.log"),
        ("FirstRule", 13, "job.log"),
        ("SecondRule", 13, "job.log"),
    ]
    assert next(iter(rules.scan(["node abc died\r\n"], "s"))).text == "node abc died"


def test_for_source_keeps_rules_of_that_stream(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "a.yaml")
    write(
        tmp_path,
        "source: [gcs, raylet]\nrules:\n  - {reason: GcsOnly, category: node_lost, type: permanent, pattern: a}\n"
        "  - {reason: AnyStream, category: node_lost, type: permanent, pattern: b, source: '*'}\n",
        "b.yaml",
    )
    rules = RuleSet.load(sorted(tmp_path.glob("*.yaml")))
    assert {r.reason for r in rules.for_source("gcs")} == {"GcsOnly", "AnyStream"}
    assert {r.reason for r in rules.for_source("job-logs")} == {"FirstRule", "SecondRule", "AnyStream"}


def test_patterns_that_cannot_be_combined_still_match(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "source: x\nrules:\n"
        "  - {reason: Backref, category: user_error, type: permanent, pattern: '(ab)\\1'}\n"
        "  - {reason: Flags, category: user_error, type: permanent, pattern: '(?i)hello'}\n",
    )
    rules = RuleSet.load([path])
    assert [r.reason for r in rules.match("xxababyy")] == ["Backref"]
    assert [r.reason for r in rules.match("HeLLo")] == ["Flags"]


def test_huge_line_is_cut_before_matching(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, GOOD)])
    early = "node abc died " + "x" * (20 * 1024 * 1024)
    late = "x" * (MAX_LINE_CHARS + 10) + " node abc died"
    (match,) = list(rules.scan([early], "big.log"))
    assert match.truncated and len(match.text) == MAX_LINE_CHARS
    assert list(rules.scan([late], "big.log")) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "bait",
    [
        "node " * 13000,
        "Raylet is terminated " * 3000,
        "The node " + " " * 60000 + "has been marked",
        "Health check failed for node " + "a" * 60000 + "g",
        "node manager has mistakenly been marked as " * 1400,
        "(" * 60000,
    ],
)
def test_builtin_rules_stay_linear_on_hostile_lines(bait: str) -> None:
    # The pytest timeout is the hang guard; a backtracking pattern would take hours on these lines.
    rules = load_rules()
    for _ in range(20):
        rules.match(bait)
