"""The literal gate shared by the log-rule engine (which rules may match a line) and redaction (where each
pattern may start): what it extracts from a pattern, that it never changes what the patterns find, and that
it stays linear on hostile input."""

from __future__ import annotations

import importlib.util
import random
import re
import string
from collections.abc import Callable
from pathlib import Path

import pytest

from core.errors import ConfigError, RuleError
from core.literal_gate import (
    CharCosts,
    LiteralGate,
    PrefilterLines,
    literal_prefixes,
    native_search_available,
    nested_unbounded_repeat,
    parse_pattern,
    required_literals,
)
from detectors.engine import RuleSet, load_rule_file, load_rules, rule_text
from rca.redact import DEFAULT_PATTERNS, Redactor
from rca.redact_scan import find_spans, lower_ascii
from tests.cost import FLOOR_S, GROWTH, assert_linear, cpu_seconds, shrunk

ATOMIC = pytest.mark.skipif(not hasattr(re, "NOFLAG"), reason="atomic groups and possessive repeats need 3.11")

# --- atomic groups and possessive repeats, decided once (the engine and redaction used to disagree) -------


@ATOMIC
@pytest.mark.parametrize(
    ("pattern", "nested"),
    [
        (r"(a+)+x", True),  # the classic trap
        (r"(?:\w+\s?)*x", True),
        (r"(?:a{1,8})+x", False),  # a bounded inner repeat backtracks a bounded amount
        # an atomic group is never re-entered from outside: the old engine refused these, wrongly
        (r"(?>a+)+x", False),
        (r"(a++)+x", False),
        (r"(?:a+)++x", False),
        # but what is inside it backtracks as usual: the old redaction check never looked inside, wrongly
        (r"(?>(a+)+x)", True),
        (r"(?:(a+)+x)++", True),
        (r"(?=(a+)+x)", True),
    ],
)
def test_nested_unbounded_repeat_reads_atomic_groups_and_possessive_repeats(pattern: str, nested: bool) -> None:
    assert nested_unbounded_repeat(pattern) is nested


@ATOMIC
def test_an_unbounded_repeat_around_an_atomic_group_is_linear_and_inside_one_is_not() -> None:
    # what the decision rests on, measured: `re` takes exponential time on the nested shape only
    def searcher(pattern: str) -> Callable[[str], object]:
        return re.compile(pattern).search

    def a_run(n: int) -> str:
        return "a" * n + "b"

    def best_of_three(pattern: str, n: int) -> float:
        return min(cpu_seconds(searcher(pattern), a_run(n))[0] for _ in range(3))

    # `re.search` retries from every start, so even a plain `a+x` costs n**2 steps on this text: the atomic
    # forms cost about what it costs, not 2**n
    plain = max(best_of_three(r"a+x", 2000), FLOOR_S)
    assert best_of_three(r"(?>a+)+x", 2000) < 4 * plain
    assert best_of_three(r"(a++)+x", 2000) < 4 * plain
    small, large = best_of_three(r"(?>(a+)+x)", 12), cpu_seconds(searcher(r"(?>(a+)+x)"), a_run(20))[0]
    assert large > 16 * small  # 2**8 more steps: exponential


@ATOMIC
def test_engine_and_redaction_accept_and_refuse_the_same_patterns(tmp_path: Path) -> None:
    for pattern, refused in [(r"(?>a+)+x", False), (r"(?>(a+)+x)", True), (r"abc(?:a++)+x", False)]:
        path = tmp_path / "r.yaml"
        path.write_text(
            f"source: x\nrules:\n  - {{reason: R, category: unknown, type: temporary, pattern: '{pattern}'}}\n"
        )
        if refused:
            with pytest.raises(RuleError, match="nests unbounded repeats"):
                load_rule_file(path)
            with pytest.raises(ConfigError, match="nests an unbounded repeat"):
                Redactor(extra_patterns=[("mine", pattern)])
        else:
            assert load_rule_file(path)
            text = "zz abcaaax zz"
            masked = re.sub(pattern, "[REDACTED:mine]", text)
            assert masked != text and Redactor(extra_patterns=[("mine", pattern)]).redact(text) == masked


@ATOMIC
def test_literals_inside_atomic_groups_and_possessive_repeats_are_required() -> None:
    assert required_literals(r"(?>hello|world)\d") == [{("hello", False), ("world", False)}]
    assert required_literals(r"(?>xhello)") == [{("xhello", False)}]
    assert required_literals(r"(?:world)++") == [{("world", False)}]
    assert required_literals(r"(?:world)*+") == []  # may repeat zero times
    assert literal_prefixes(parse_pattern(r"x(?>ab|cd)e")) == {"xab", "xcd"}  # up to the first group
    assert literal_prefixes(parse_pattern(r"ab(?:c)++")) == {"ab"}


def test_required_literals_fold_case_and_skip_short_runs() -> None:
    # a literal alternation goes on the run before it: the whole words are the literals
    assert required_literals(r"(?i)NVLink (?:down|error)") == [{("nvlink down", True), ("nvlink error", True)}]
    assert required_literals(r"ab\d+cd") == []
    assert required_literals(r"disk (?i:quota) x") == [{("disk ", False)}, {("quota", True)}]


def test_short_alternatives_and_classes_join_the_literal_around_them() -> None:
    # `re` parses "\.(?:cc:|h:)" as "." and a branch of "cc:" and "h:", each too short alone
    assert required_literals(r"INFO \S+(?:\.cc:|\.h:)\d+") == [{("INFO ", False)}, {(".cc:", False), (".h:", False)}]
    assert required_literals(r"[Pp]lugin") == [{("Plugin", False), ("plugin", False)}]
    assert required_literals(r"ab(?:c|)d") == [{("abcd", False), ("abd", False)}]
    # past _MAX_RUNS texts the run so far is one option and the rest starts again
    assert required_literals(r"Xid [1-9][0-9]!") == [{(f"Xid {n}", False) for n in range(1, 10)}]
    assert required_literals(r"(?:a|b)\w") == []  # one character: no literal
    # every text of an option is in a match (checked, not only asserted on examples)
    for pattern, text in ((r"NCCL (?:WARN|ERROR) x", "NCCL ERROR x"), (r"e[Cc][Cc] err", "eCc err")):
        (option,) = required_literals(pattern)
        assert re.search(pattern, text) and any(word in text for word, _ in option)


# --- the gate itself -----------------------------------------------------------------------------------

WORDS = [
    {("password", False), ("passwd", False)},
    {("pass", False)},  # a prefix of the one above: the gate finds "pass", checks "password" there
    {("nvlink", True)},
    {("Speicher", False)},  # non-ASCII neighbours, case-sensitive
    {("ätsch", False)},
    set(),  # ungated
    {("x-y", False), ("://", False)},
]


def brute_starts(literals: list, text: str) -> list[tuple[int, int]]:
    """Every start of every literal, found by `re` (folding ASCII letters only, like the gate)."""
    found = set()
    for index, words in enumerate(literals):
        for word, icase in words:
            flags = re.IGNORECASE | re.ASCII if icase else 0
            found.update((m.start(), index) for m in re.finditer(f"(?={re.escape(word)})", text, flags))
    return sorted(found)


def test_starts_are_exactly_where_the_literals_start_in_str_and_bytes() -> None:
    gate = LiteralGate(WORDS)
    assert gate.ungated == (5,)
    text = "a passwd, PASSWORD, nvLINK and NVLINK://x-y; Speicher ätsch SPEICHER x-y://"
    assert gate.starts(text) == brute_starts(WORDS, text)
    raw = text.encode("utf-8")
    # bytes offsets: the same starts, counted in bytes
    char_at = {len(text[:i].encode("utf-8")): i for i in range(len(text) + 1)}
    assert [(char_at[b], index) for b, index in gate.starts(raw)] == gate.starts(text)
    assert gate.patterns_in(text) == gate.patterns_in(raw) == (0, 1, 2, 3, 4, 6)
    assert gate.patterns_in("nothing here") == ()


def test_gate_without_literals_finds_nothing() -> None:
    gate = LiteralGate([set(), set()])
    assert not gate.gated and gate.ungated == (0, 1)
    assert gate.starts("anything") == [] and list(gate.lines(b"a\nb\n")) == []


def test_the_cost_model_anchors_literals_on_their_rarest_character() -> None:
    # every top-level branch starts with a literal character, so `re` skips ahead in C between stops
    sample = b"aaaa bbbb cccc zzz " * 100
    gate = LiteralGate([{("abcz", False)}, {("nvlink", True)}], CharCosts.from_sample(sample))
    pattern = gate.regex.pattern
    assert pattern.startswith(("z", "k", "K", "v", "V", "i", "I", "l", "L", "n", "N"))
    assert "(?<=abc)z" in pattern or "z(?<=abcz)" in pattern
    table = CharCosts.from_table({"a": 50, "q": 1}, default=5)
    assert table.char("q") == 1 and table.char("Q", icase=True) == 1 + 5
    assert LiteralGate([{("aqa", False)}], table).regex.pattern.startswith("q")


def test_every_case_variant_of_a_folded_literal_is_found() -> None:
    gate = LiteralGate([{("oom", True)}])
    for variant in ("oom", "OOM", "oOm", "Oom"):
        assert gate.patterns_in(f"x {variant} y") == (0,), variant
        assert gate.patterns_in(f"x {variant} y".encode()) == (0,), variant
    with pytest.raises(ValueError, match="folds non-ASCII"):
        LiteralGate([{("ätsch", True)}])


@pytest.mark.skipif(not native_search_available(), reason="hyperscan cannot run here")
def test_hyperscan_and_the_gate_regex_find_the_same_lines() -> None:
    rng = random.Random(5)
    literals = [{("nvlink", True)}, {("Speicher", False)}, {("abc", False), ("xyz", False)}]
    native, regex = LiteralGate(literals, native=True), LiteralGate(literals)
    pieces = ["NVLink", "nvlin", "Speicher", "speicher", "ab", "c", "xyz", "\xff", " ", "\n", "é"]
    for _ in range(50):
        block = "".join(rng.choice(pieces) for _ in range(200)).encode("utf-8", "surrogateescape") + b"\n"
        lines = [(s, e) for s, e, _ in native.lines(block)]
        assert lines == [(s, e) for s, e, _ in regex.lines(block)]
        assert lines == [(s, e) for s, e in _line_spans(block) if regex.patterns_in(block[s:e])]


def _line_spans(block: bytes) -> list[tuple[int, int]]:
    spans, start = [], 0
    while (end := block.find(b"\n", start)) >= 0:
        spans.append((start, end))
        start = end + 1
    return spans


def test_hyperscan_is_used_when_installed() -> None:
    # hyperscan is a dependency: without it the engine's native-versus-regex comparisons compare one gate to itself
    assert native_search_available() == (importlib.util.find_spec("hyperscan") is not None)
    assert native_search_available(), "hyperscan is not importable; pip install -e . installs it"


# --- hostile and huge input ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        "s" * 2_000_000,  # the anchor character of many literals, and nothing else
        "pas" * 700_000,  # near misses of a prefix, overlapping
        "nvlin" * 400_000 + "k",
        ("\xff" * 1000 + "Speiche") * 300,
    ],
)
def test_the_gate_is_linear_on_huge_hostile_text(text: str) -> None:
    literals = [{("password", False)}, {("pass", False)}, {("nvlink", True)}, {("Speicher", False)}]
    literals += [{(f"s{c}s", False)} for c in string.ascii_lowercase if c != "s"]
    gate = LiteralGate(literals, CharCosts.from_sample(b"the quick brown fox " * 50))
    found = assert_linear(gate.starts, shrunk(text), GROWTH)
    assert_linear(gate.starts, lambda n: shrunk(text)(n).encode("utf-8", "surrogateescape"), GROWTH)
    assert found == brute_starts(literals, text)


@pytest.mark.timeout(120)
def test_pathological_patterns_leave_the_gate_and_the_engine_linear(tmp_path: Path) -> None:
    # patterns whose literals overlap themselves and each other, on a line that is all near misses
    path = tmp_path / "r.yaml"
    path.write_text(
        "source: x\nrules:\n"
        "  - {reason: A, category: unknown, type: temporary, pattern: 'aaaa(?:aaab|b)'}\n"
        "  - {reason: B, category: unknown, type: temporary, pattern: '(?i)AAA[^b]{0,64}c'}\n"
        "  - {reason: C, category: unknown, type: temporary, pattern: 'aab|aac|aad'}\n"
    )
    rules = RuleSet.load([path])
    assert assert_linear(rules.match, lambda n: "a" * n, 60_000) == []
    line = "a" * 60_000 + "c"
    assert [r.reason for r in rules.match(line)] == [r.reason for r in rules if r.regex.search(line)]


# --- gating never changes results (both users, random texts built from the literals) -------------------


def _engine_literal_text(rules: RuleSet, rng: random.Random) -> list[str]:
    words = [w for r in rules for option in required_literals(r.pattern) for w, _ in option]
    phrases = [m.group(0) for r in rules for m in [re.search(r"[ -~]{8,}", r.pattern)] if m]
    junk = [" ", ":", "0", "\xff", "é", "Error", "KILL", "\t", "(", "=", "NCCL", "node"]
    lines = []
    for _ in range(3000):
        parts = [rng.choice(words + phrases + junk) for _ in range(rng.randint(1, 6))]
        parts = [p.swapcase() if rng.random() < 0.2 else p for p in parts]
        parts = [p[: rng.randint(1, len(p))] if rng.random() < 0.3 else p for p in parts]
        lines.append("".join(parts))
    return lines


def test_engine_gating_never_changes_which_rules_match() -> None:
    rules = load_rules()
    rng = random.Random(12)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
    real = [line for p in sorted(fixtures.glob("*/*.log")) for line in p.read_text(errors="replace").splitlines()]
    lines = _engine_literal_text(rules, rng) + rng.sample(real, min(2000, len(real)))
    matched = 0
    for line in lines:
        read = rule_text(line)  # what rules read of a line: past its wrapper, its heads and its indent
        plain = [r for r in rules if r.finds(read)]
        assert rules.match(line) == plain, line
        matched += bool(plain)
    assert matched > 200  # the texts reach the rules, not only their gate


def _brute_spans(redactor: Redactor, text: str) -> list[tuple[int, int, int, str]]:
    low = lower_ascii(text)
    found = []
    for rule in redactor._rules:
        for match in rule.regex.finditer(low if rule.lowered else text):
            for index, kind in rule.groups or ((0, rule.name),):
                start, end = match.span(index)
                if end > start:
                    found.append((start, end, rule.order, kind))
    return sorted(found)


def test_redaction_gating_never_changes_what_is_found() -> None:
    redactor = Redactor(extra_patterns=[("ticket", r"TICKET-[0-9]{4,}"), ("employee", r"\bemp[0-9]{6}\b")])
    rng = random.Random(4)
    prefixes = [p for rule in redactor._rules for p in rule.prefixes] + ["TICKET-", "emp"]
    fill = string.ascii_letters + string.digits + "_-=:/@.\"' \t\n?&"
    found = 0
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(1, 12)):
            word = rng.choice(prefixes)
            word = word.upper() if rng.random() < 0.3 else word
            parts.append(word + "".join(rng.choice(fill) for _ in range(rng.randint(0, 48))))
        text = "".join(parts)
        spans = sorted(find_spans(redactor._rules, redactor._gate, text, lower_ascii(text)))
        assert spans == _brute_spans(redactor, text), text
        found += bool(spans)
    assert found > 50


def test_every_builtin_rule_and_default_redaction_pattern_is_gated() -> None:
    # a pattern without a literal would be tried on every line (or need a pass of its own) and cost its user the
    # fast path
    for rule in load_rules():
        assert required_literals(rule.pattern), f"{rule.reason} has no literal of 3+ characters"
    redactor = Redactor()
    for rule, (name, pattern) in zip(redactor._rules, DEFAULT_PATTERNS, strict=True):
        assert rule.prefixes, f"{name} has no literal prefix: it would need a pass of its own"
        assert rule.lowered == pattern.startswith("(?i)"), f"{name} is (?i) but not lower case"
        assert not nested_unbounded_repeat(pattern), name


def test_one_native_gate_serves_many_threads_at_once() -> None:
    # node agents in one process share their rule set's gates; hyperscan's scratch space serves one scan at a time
    if not native_search_available():
        pytest.skip("hyperscan is not installed or cannot run here")
    from concurrent.futures import ThreadPoolExecutor

    gate = LiteralGate([{("fallen off", False)}, {("Xid", False)}], native=True)
    prefilter = PrefilterLines([r"(?<![\w/])step:(\d+) - ", r"(\d{1,3})%\|"])
    assert gate._native is not None and prefilter.native
    block = b"noise line\n" * 20_000 + b"NVRM: Xid 79, GPU has fallen off the bus\nstep:3 - loss\n 45%|#### |\n"

    def scan(_: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        return list(gate.lines(block)), list(prefilter.lines(block))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(scan, range(64)))
    lines, progress = results[0]
    assert [block[s:e] for s, e, _ in lines] == [b"NVRM: Xid 79, GPU has fallen off the bus"]
    assert [block[s:e] for s, e in progress] == [b"step:3 - loss", b" 45%|#### |"]
    assert all(r == results[0] for r in results)
