"""detectors/promql.py: the metric names an expression selects, the bracket check, rule-file text and
promtool (real) on it, including hostile input: huge expressions, unbalanced brackets, unicode and strings
that look like metric names.

The tokenizer replaced two: the dashboards' (argus/dashboards.py) and the health rules' regex
(detectors/metric_rules.py). Where they disagreed the better answer is pinned in
test_where_the_old_tokenizers_disagreed_the_better_answer_holds.
"""

from __future__ import annotations

import random
import stat
import time
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError, MissingBinary, RuleError
from detectors.promql import (
    Complaint,
    PromtoolVerdict,
    bracket_problem,
    find_promtool,
    metric_names,
    promtool_check_rules,
    rule_file_metric_names,
    rule_file_text,
)
from tests.cost import assert_linear

# --- metric names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (job) (rate(http_requests_total{job="a", code=~"5.."}[5m]))', {"http_requests_total"}),
        ("a * on(node_ip) group_left(owner, submission_id) b", {"a", "b"}),
        ("a / ignoring (gpu) group_right b", {"a", "b"}),
        ('label_replace(up, "node_ip", "$1", "instance", "([^:]+):.*")', {"up"}),
        ("histogram_quantile(0.9, sum without (instance) (rate(x_bucket[5m] offset 1h)))", {"x_bucket"}),
        ('{__name__="foo", job="by"}', {"foo"}),
        ('count_values("version", build_info)', {"build_info"}),
        ("topk(5, x) > bool 3", {"x"}),
        ("sum(x) by (le) and y", {"x", "y"}),
        ("x @ start() unless z @ 1700000000", {"x", "z"}),
        ("1e3 + 0x1F + Inf + NaN - .5 + 2.5e-3", set()),
        ("foo # bar is a comment\n+ baz", {"foo", "baz"}),
        ("sum_over_time(a[1h:1m]) / 60", {"a"}),
        ("by_node_total + offset_seconds + sum_of_things", {"by_node_total", "offset_seconds", "sum_of_things"}),
        ("job:requests:rate5m", {"job:requests:rate5m"}),
        ("absent(up{job='ray'})", {"up"}),
        ("vector(0) or time() - max(ts)", {"ts"}),
        ("sum\n  by (a)\n  (m)", {"m"}),
        ('quantile_over_time(0.9, lat[10m:30s]) * on() group_left() scalar(s)', {"lat", "s"}),
        ("SUM BY (a) (m) AND ON (b) n", {"m", "n"}),
        ("topk by (gpu) (3, m)", {"m"}),
        ("m offset -5m", {"m"}),
    ],
)
def test_metric_names_skips_functions_keywords_labels_strings_and_numbers(expr, names):
    assert metric_names(expr) == (names, [])


def test_a_health_rule_expression_reads_only_its_metrics() -> None:
    expr = ('sum by (job, collector) (rate(argus_collector_errors_total{collector=~"ray(_logs)?"}[15m] offset 5m))'
            ' / on (job) group_left sum without (le) (rate(argus_loop_tick_duration_seconds_count[15m])) > 1e3'
            ' or absent(up{job="argus"}) unless label_replace(x, "a", "$1", "b", "(c+)")  # not_a_metric')
    assert metric_names(expr) == ({"argus_collector_errors_total", "argus_loop_tick_duration_seconds_count",
                                   "up", "x"}, [])


def test_a_name_regex_cannot_be_checked_and_says_so():
    names, notes = metric_names('{__name__=~"DCGM_.*"}')
    assert names == set() and "regex" in notes[0] and "DCGM_.*" in notes[0]
    assert metric_names('x{__name__!="y"}') == ({"x"}, [])  # a negative name matcher selects nothing by name


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        # strings that look like metrics, matchers or brackets are strings
        ('x{job="up_total", path="a{b}"} + y', {"x", "y"}),
        ("x{a='}'} + y{b=\"]\"} + z{c=`)`}", {"x", "y", "z"}),
        ('label_replace(x, "dst", "up", "src", "(node_cpu_total)")', {"x"}),
        ('x{job="a,__name__=\'evil\'"}', {"x"}),  # the old dashboards tokenizer found `evil` here
        ('x{job="a\\",__name__=\\"evil"}', {"x"}),  # an escaped quote does not end the string
        ('{ __name__ = "spaced" , job="j" }', {"spaced"}),
        ("x # it's a comment with a \"quote\n+ y", {"x", "y"}),
        # unbalanced input: what can be found is found, nothing fails
        ("sum(rate(x[5m])", {"x"}),
        ('x{a="b"', {"x"}),
        ("x]]] + y)))", {"x", "y"}),
        ('x + "unterminated y', {"x"}),
        ("x{a=`raw", {"x"}),
        # unicode: a word stays whole (Prometheus rejects it; promtool says so)
        ("métric_total + 温度", {"métric_total", "温度"}),
        ('x{a="ü€😀"} / y', {"x", "y"}),
    ],
)
def test_hostile_expressions(expr, names):
    assert metric_names(expr)[0] == names


def test_where_the_old_tokenizers_disagreed_the_better_answer_holds():
    # {__name__="x"} selects x (the rules' regex missed it)
    assert metric_names('{__name__="foo"}')[0] == {"foo"}
    # atan2 is a binary operator, not a metric (the rules' regex reported it)
    assert metric_names("a atan2 b")[0] == {"a", "b"}
    # a matcher inside a string value is text (the dashboards' tokenizer reported `evil`)
    assert metric_names('x{job="a,__name__=\'evil\'"}')[0] == {"x"}
    # a label name of an unclosed selector is not a metric (the rules' regex reported `a`)
    assert metric_names('x{a="b"')[0] == {"x"}
    # a non-ASCII word is not cut in pieces (the dashboards' tokenizer reported `m` and `tric_total`)
    assert metric_names("métric_total")[0] == {"métric_total"}
    # aggregations are keywords, whatever their case (the dashboards' tokenizer reported `SUM`, `Sum`)
    assert metric_names("SUM BY (a) (m) + Sum without(b) (n)")[0] == {"m", "n"}


def test_metric_names_never_fails_on_random_text():
    for text in ['"unterminated', "sum(", "{a=", "[5m", "`raw", "}{)(][", "\\", "", "#", "a{b='\\'}c", "{,,,}",
                 "{__name__=}", "{__name__", "by (", "sum by", "\x00\x01", "\ud800"]:
        metric_names(text)
    rng = random.Random(7)
    alphabet = "ab_:{}[]()\"'`\\#,=~!.0123456789 \n+-*/^@éü温"
    for _ in range(3000):
        metric_names("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))


@pytest.mark.parametrize(
    ("make", "size", "names"),
    [
        (lambda n: " + ".join(f"m{i}" for i in range(n)), 50_000, {f"m{i}" for i in range(50_000)}),
        (lambda n: "(" * n + "x" + ")" * n, 100_000, {"x"}),
        (lambda n: "x" + "[" * n, 200_000, {"x"}),
        (lambda n: "x" + "{" * n, 200_000, {"x"}),
        (lambda n: "x" + " sum by (" * n, 50_000, {"x"}),
        (lambda n: 'x{a="' + "\\\"" * n + '"}', 200_000, {"x"}),
        (lambda n: '{__name__="' + "n" * n + '"}', 500_000, {"n" * 500_000}),
        (lambda n: "x" + " " * n + "+ y", 500_000, {"x", "y"}),
        (lambda n: "1" * n + " + " + "9m" * (n // 5), 500_000, set()),
        (lambda n: '"' * (n | 1), 300_001, set()),
    ],
    ids=["many-names", "deep-nesting", "unclosed-ranges", "unclosed-braces", "unclosed-label-lists",
         "escapes", "long-name", "long-space", "long-numbers", "quotes"],
)
def test_huge_expressions_take_linear_time(make, size, names):
    def check(expr: str) -> tuple[set[str], str | None]:
        return metric_names(expr)[0], bracket_problem(expr)

    found, problem = assert_linear(check, make, size)
    assert found == names
    assert problem is None or isinstance(problem, str)


# --- the bracket check ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ('sum(rate(x{a="(", b=`[`}[5m]))', None),
        ("x{a='\\''}", None),
        ("温度{a=\"ü\"} > 1", None),
        ("(]", "unmatched ']'"),
        ("x)", "unmatched ')'"),
        ("sum(rate(x[5m])", "unclosed '('"),
        ('x{a="b}', 'unterminated string (missing closing ")'),
        ("x{a=`b}", "unterminated string (missing closing `)"),
        ("(" * 100_000, "unclosed '('"),
    ],
)
def test_bracket_problem(expr, problem):
    assert bracket_problem(expr) == problem


# --- rule files -----------------------------------------------------------------------------------------

HOSTILE_TEXTS = [
    "up",
    "sum(\n  rate(x[5m])\n)\n",  # several lines: a | block
    "x  \ny",  # a trailing space cannot be a block: quoted instead
    '  x{a="b: c # d"}',
    "x{a='it''s'} - 'y'",
    "ü€😀 温度",
    "x\ty\x00\x1b",
    "x\ud800y",
    "- [x, y]: {z}",
]


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_rule_file_text_keeps_every_expression_exactly(text):
    groups = {"g": [{"record": "r", "expr": text, "labels": {"note": text}}], "h": [{"alert": "A", "expr": "up"}]}
    dumped = rule_file_text(groups)
    assert yaml.safe_load(dumped) == {"groups": [{"name": "g", "rules": groups["g"]},
                                                 {"name": "h", "rules": groups["h"]}]}
    assert rule_file_text(groups) == dumped


def test_multi_line_expressions_read_as_blocks():
    assert "expr: |-\n      sum(\n        rate(x[5m])\n      )" in rule_file_text(
        {"g": [{"record": "r", "expr": "sum(\n  rate(x[5m])\n)"}]})


def test_rule_file_metric_names(tmp_path: Path) -> None:
    path = tmp_path / "r.rules.yml"
    path.write_text(rule_file_text({
        "g": [{"alert": "A", "expr": 'a_total{job="b_total"} > 0'}, {"record": "r:x", "expr": "sum(c) + d"}],
        "h": [{"alert": "A", "expr": "e"}, {"alert": "NoExpr"}],
    }), encoding="utf-8")
    assert rule_file_metric_names(path) == {"A": {"a_total", "e"}, "r:x": {"c", "d"}}


def test_a_file_that_is_not_a_rule_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rules.yml"
    for text in ("groups: [\n", "- just a list\n", "\xff\xfe".encode("latin-1").decode("latin-1")):
        bad.write_text(text, encoding="latin-1")
        with pytest.raises(RuleError, match="bad.rules.yml"):
            rule_file_metric_names(bad)
    with pytest.raises(RuleError, match="nope.yml"):
        rule_file_metric_names(tmp_path / "nope.yml")


# --- promtool (the real one) ----------------------------------------------------------------------------


def test_promtool_names_each_rule_it_rejects():
    text = rule_file_text({
        "good": [{"alert": "Fine", "expr": "up == 0"}],
        "bad": [{"record": "ok:r", "expr": "sum(up)"}, {"alert": "RateOfGauge", "expr": "rate(up) > 1"},
                {"alert": "Unclosed", "expr": "sum(up"}],
    })
    verdict = promtool_check_rules(text)
    assert not verdict.ok
    complaints = {(c.group, c.index, c.rule) for c in verdict.complaints()}
    assert complaints == {("bad", 2, "RateOfGauge"), ("bad", 3, "Unclosed")}, verdict.output
    assert any("expected type range vector" in c.error for c in verdict.complaints())


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_promtool_reads_hostile_expressions_as_written(text):
    """Whatever the text, promtool gets it intact: it accepts the valid ones and names the others."""
    verdict = promtool_check_rules(rule_file_text({"q": [{"record": "r", "expr": text}]}), lint=False)
    if text == "x\ud800y":  # a lone surrogate is no character: YAML has no way to carry it, and says so
        assert not verdict.ok and "Unicode" in verdict.output
        return
    valid = text in ("up", "sum(\n  rate(x[5m])\n)\n", "x{a='it''s'} - 'y'") or text.strip().startswith("x{a=\"b")
    if verdict.ok:
        assert valid, text
    else:
        assert [(c.group, c.rule) for c in verdict.complaints()] == [("q", "r")], verdict.output


def test_promtool_verdict_parses_complaints_from_output():
    output = ('Checking /tmp/x/rules.yml\n  FAILED:\n'
              'group "g-1", rule 3, "HotGpu": could not parse expression: 1:5: parse error: unexpected "}"\n'
              'group "q7", rule 1, "argus_dashboard_query": bad: "quoted" too\n'
              'unrelated line\n')
    assert PromtoolVerdict(1, output).complaints() == [
        Complaint("g-1", 3, "HotGpu", 'could not parse expression: 1:5: parse error: unexpected "}"'),
        Complaint("q7", 1, "argus_dashboard_query", 'bad: "quoted" too'),
    ]
    assert PromtoolVerdict(0, output).complaints() == []


def test_a_missing_promtool_says_how_to_install_it(tmp_path: Path):
    with pytest.raises(MissingBinary, match="no-such-promtool") as info:
        find_promtool(str(tmp_path / "no-such-promtool"))
    assert "apt-get install prometheus" in (info.value.hint or "")


def test_a_promtool_that_hangs_is_a_config_error(tmp_path: Path):
    slow = tmp_path / "promtool"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="did not finish within 0.5 s"):
        promtool_check_rules("groups: []\n", promtool=str(slow), timeout_s=0.5)
    assert time.monotonic() - started < 20
