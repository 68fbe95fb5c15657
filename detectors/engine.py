"""Log rules as data: load and validate rule files, then match log lines against them.

A rule file is YAML in the node-problem-detector style: a file-level `source` (the log stream the rules
read: job-logs, raylet, gcs, ... or a list of them) and a `rules:` list. Every pattern is compiled at
load, so a bad rule stops Argus at start with the file and line of the rule, never at 3 a.m. on the
first matching line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

import yaml
from loguru import logger

from core.errors import RuleError
from core.limits import MAX_LINE_BYTES, MAX_LINE_CHARS
from core.types import Category, Severity
from detectors.rule_files import RuleFile, RuleItem, rule_paths

try:  # the regex parser moved in 3.11; the old name still works but warns there
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse

try:  # optional: a C multi-literal search (SIMD) for the gate; without it the gate regex walks every byte
    import hyperscan as _hs
except (ImportError, OSError):  # pragma: no cover - depends on the install
    _hs = None

STREAM_BLOCK_BYTES = 4 * 1024 * 1024

ANY_SOURCE = "*"

_FILE_KEYS = {"source", "rules"}
_REQUIRED_RULE_KEYS = ("reason", "category", "type", "pattern")
_OPTIONAL_RULE_KEYS = ("severity", "confidence", "action", "priority", "description", "source")
DEFAULT_PRIORITY = 50


class RuleType(str, Enum):
    """What a match means: permanent ends the job and opens an incident; temporary is an event only."""

    PERMANENT = "permanent"
    TEMPORARY = "temporary"


@dataclass(frozen=True)
class LogRule:
    reason: str
    category: Category
    type: RuleType
    pattern: str
    regex: re.Pattern[str] = field(compare=False, repr=False)
    sources: tuple[str, ...] = (ANY_SOURCE,)
    severity: Severity = Severity.CRITICAL
    confidence: float = 0.9
    action: str | None = None
    priority: int = DEFAULT_PRIORITY
    description: str | None = None
    file: Path | None = None
    line: int | None = None

    @property
    def permanent(self) -> bool:
        return self.type is RuleType.PERMANENT

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<memory>"

    def reads(self, source: str) -> bool:
        return ANY_SOURCE in self.sources or source in self.sources


@dataclass(frozen=True)
class RuleMatch:
    """One rule that matched one line. `text` is the line as matched (cut to MAX_LINE_CHARS)."""

    rule: LogRule
    line_no: int
    text: str
    source: str
    truncated: bool = False


def clip_line(text: str) -> tuple[str, bool]:
    """The part of a line that is matched, and whether anything was cut."""
    if len(text) > MAX_LINE_CHARS:
        return text[:MAX_LINE_CHARS], True
    return text, False


class RuleSet:
    """An ordered, validated set of log rules; matching is one prefilter search per line."""

    def __init__(self, rules: Sequence[LogRule] = ()) -> None:
        seen: dict[str, LogRule] = {}
        for rule in rules:
            if rule.reason in seen:
                first = seen[rule.reason]
                raise RuleError(
                    f"{rule.location}: duplicate rule reason '{rule.reason}' (first defined at {first.location})",
                    hint="every reason must be unique across all rule files; rename one of them",
                )
            seen[rule.reason] = rule
        self.rules: tuple[LogRule, ...] = tuple(rules)
        self._line_gate = _Gate(self.rules, _DEFAULT_SAMPLE)

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[LogRule]:
        return iter(self.rules)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> RuleSet:
        rules: list[LogRule] = []
        for path in paths:
            rules.extend(load_rule_file(Path(path)))
        return cls(rules)

    def for_source(self, source: str) -> RuleSet:
        """The rules that read the named log stream (rules for any stream included)."""
        return RuleSet([r for r in self.rules if r.reads(source)])

    def get(self, reason: str) -> LogRule | None:
        return next((r for r in self.rules if r.reason == reason), None)

    def match(self, text: str) -> list[LogRule]:
        """Every rule whose pattern is found in the line, in rule order."""
        text, _ = clip_line(text)
        gate = self._line_gate
        if gate.ungated or gate.text is None:
            return [r for r in self.rules if r.regex.search(text)]
        return [r for r in _candidates(gate, text, gate.text) if r.regex.search(text)]

    def scan(self, lines: Iterable[str], source: str, start_line: int = 1) -> Iterator[RuleMatch]:
        """Match every line; `source` names where the lines came from (a path, a stream) in the matches."""
        for line_no, raw in enumerate(lines, start=start_line):
            text, truncated = clip_line(raw.rstrip("\r\n"))
            for rule in self.match(text):
                yield RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)

    def scan_stream(
        self,
        stream: IO[bytes],
        source: str,
        *,
        stats: ScanStats | None = None,
        block_bytes: int = STREAM_BLOCK_BYTES,
        native: bool = True,
    ) -> Iterator[RuleMatch]:
        """`scan` over a whole binary stream, the same matches, much faster.

        Reads blocks of `block_bytes`, finds candidate lines with one gate over each block (built for this
        stream from its first block), and runs the rules only on those lines. The gate's literals are found
        by hyperscan when it is installed and `native` is true, else by the gate regex; either way the
        gate regex then picks the rules for each candidate line and the rules' own regexes decide, so the
        matches are the same. Bytes that are not UTF-8 are replaced, CRLF and a missing last newline are
        fine, and a line longer than MAX_LINE_BYTES is cut while reading, so memory stays bounded by the
        block size.
        """
        stats = stats if stats is not None else ScanStats()
        gate: _Gate | None = None
        pending = b""
        dropping = False  # inside a line already cut at MAX_LINE_BYTES: skip to its end
        while True:
            chunk = stream.read(block_bytes)
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8", errors="surrogateescape")
            if not chunk:
                break
            stats.bytes += len(chunk)
            if dropping:
                newline = chunk.find(b"\n")
                if newline < 0:
                    continue
                chunk, dropping = chunk[newline + 1 :], False
            if gate is None:
                gate = _Gate(self.rules, chunk[:_SAMPLE_BYTES], native=native)
            data = pending + chunk
            end = data.rfind(b"\n")
            if end >= 0:
                yield from self._scan_block(gate, data[: end + 1], stats, source)
                pending = data[end + 1 :]
            else:
                pending = data
            if len(pending) > MAX_LINE_BYTES:
                yield from self._scan_block(gate, pending[:MAX_LINE_BYTES] + b"\n", stats, source)
                pending, dropping = b"", True
        if pending:
            gate = gate or _Gate(self.rules, pending[:_SAMPLE_BYTES], native=native)
            yield from self._scan_block(gate, pending + b"\n", stats, source)

    def _scan_block(self, gate: _Gate, block: bytes, stats: ScanStats, source: str) -> Iterator[RuleMatch]:
        """Match the complete lines of `block` (it ends with a newline); line numbers go on from `stats`."""
        first = stats.lines + 1
        stats.lines += block.count(b"\n")
        if gate.ungated or gate.raw is None:
            for offset, raw in enumerate(block[:-1].split(b"\n")):
                yield from self._match_raw(raw, first + offset, source, self.rules)
            return
        counted, line_no = 0, first
        for start, end, first_hit in gate.lines(block):
            line_no += block.count(b"\n", counted, start)
            counted = start
            line = block[start:end]
            candidates = _candidates(gate, line, gate.raw, first_hit=first_hit)
            if candidates:
                yield from self._match_raw(line, line_no, source, candidates)

    @staticmethod
    def _match_raw(raw: bytes, line_no: int, source: str, rules: Sequence[LogRule]) -> Iterator[RuleMatch]:
        text, truncated = clip_line(raw[:MAX_LINE_BYTES].decode("utf-8", errors="replace").rstrip("\r\n"))
        for rule in rules:
            if rule.regex.search(text):
                yield RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)


def builtin_rule_dir() -> Path:
    return Path(__file__).resolve().parent / "rules"


def load_rules(extra_dirs: Iterable[Path] = ()) -> RuleSet:
    """The built-in rules plus every *.yaml / *.yml in the extra folders, validated together."""
    paths = rule_paths(builtin_rule_dir(), extra_dirs, "rule")
    ruleset = RuleSet.load(paths)
    logger.trace("loaded {} log rules from {} files", len(ruleset), len(paths))
    return ruleset


# --- loading one file ------------------------------------------------------------------------------


def load_rule_file(path: Path) -> list[LogRule]:
    rule_file = RuleFile.read(
        path,
        kind="rule",
        empty_hint="write `source: <stream>` and a `rules:` list, or delete the file",
        shape="`source` and `rules`",
        shape_hint="see detectors/rules/node_lost.yaml for the shape",
        allowed=_FILE_KEYS,
    )
    for key in ("source", "rules"):
        rule_file.require(key, hint="add it")
    sources = _sources(path, rule_file.keys["source"], rule_file.data["source"])
    return [_build_rule(path, item_node, item, sources) for item_node, item in rule_file.rule_items()]


def _build_rule(path: Path, node: yaml.Node, item: Any, file_sources: tuple[str, ...]) -> LogRule:
    rule = RuleItem(path, node, item, kind="rule", hint="give it reason, category, type and pattern")
    fail = rule.fail
    rule.check_keys(_REQUIRED_RULE_KEYS, _OPTIONAL_RULE_KEYS)
    reason = rule.reason("NodeMarkedDead")
    category = rule.choice("category", Category)
    rtype = rule.choice("type", RuleType)
    pattern = item["pattern"]
    if not isinstance(pattern, str):
        raise fail("pattern", "pattern must be a string", "quote it with single quotes")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise fail("pattern", f"bad regex: {exc}", "fix the pattern; it is a Python `re` expression") from exc
    if regex.search("") is not None:
        raise fail("pattern", "pattern matches the empty string, so it would match every line", "make it specific")
    danger = _nested_repeat(pattern)
    if danger:
        raise fail(
            "pattern",
            f"pattern nests unbounded repeats ({danger}), which can take exponential time on hostile lines",
            "bound the inner repeat, e.g. [^ ]{1,64}, or drop the outer one",
        )

    severity = Severity.CRITICAL if rtype is RuleType.PERMANENT else Severity.WARNING
    if item.get("severity") is not None:
        severity = rule.choice("severity", Severity)
    confidence = rule.confidence(0.9 if rtype is RuleType.PERMANENT else 0.5)
    priority = item.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail("priority", f"priority {priority!r} is not an integer", "higher wins; e.g. 90 for a lost node")
    action = rule.text("action", "write the recommended action as one sentence")
    description = rule.text("description", "write one sentence")
    sources = _sources(path, rule.keys.get("source", rule.line), item["source"]) if "source" in item else file_sources
    return LogRule(
        reason=reason,
        category=category,
        type=rtype,
        pattern=pattern,
        regex=regex,
        sources=sources,
        severity=severity,
        confidence=confidence,
        action=action.strip() if action else None,
        priority=priority,
        description=description.strip() if description else None,
        file=path,
        line=rule.line,
    )


def _sources(path: Path, line: int, value: Any) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise RuleError(
            f"{path}:{line}: `source` must be a stream name or a list of them",
            hint="e.g. job-logs, raylet, gcs, or '*' for any stream",
        )
    return tuple(v.strip() for v in values)


_REPEATS = {_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT}


# --- fast scanning: a literal gate in front of the rules ------------------------------------------

_MIN_ANCHOR = 3
_SAMPLE_BYTES = 256 * 1024
_ROTATIONS_TRIED = 4
# Byte counts for gates built without a stream to sample (RuleSet.match on single lines): typical
# training-job log text.
_DEFAULT_SAMPLE = (
    b"(TaskRunner pid=2396241) step:120 - actor/entropy:0.323 - actor/pg_loss:0.001 - perf/mfu/actor:0.343\n"
    b"worker-3:3018453:3024011 [2] NCCL INFO Channel 01/0 : 2[1040] -> 0[1020] via P2P/IPC/read\n"
    b"[2025-04-02 15:02:00,117 I 135782 135782] core_worker.cc:4134: Number of alive nodes:4\n"
    b"(WorkerDict pid=1234, ip=10.0.0.3) INFO 11-18 18:07:28 llm_engine.py:275] # GPU blocks: 2048\n"
    b"Training Progress:  76%|######   | 244/320 [08:56<02:05,  1.65s/it]\n"
    b"/usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: inputs have no grad\n"
)


@dataclass
class ScanStats:
    """What a stream scan read: lines (a last line without a newline counts) and bytes."""

    lines: int = 0
    bytes: int = 0


def required_literals(pattern: str, cost: Any = None) -> list[set[tuple[str, bool]]]:
    """Candidate sets of literals, as (text, ignore_case): every match of `pattern` contains at least one
    literal of each set. Empty when the pattern has no literal of three characters or more. With `cost`
    (a literal set -> number), alternatives contribute their cheapest literals, otherwise their longest."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - re.compile already accepted it
        return []
    return _literal_options(list(parsed), bool(parsed.state.flags & re.IGNORECASE), cost)


def _literal_options(items: list, icase: bool, cost: Any = None) -> list[set[tuple[str, bool]]]:
    options: list[set[tuple[str, bool]]] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= _MIN_ANCHOR:
            options.append({("".join(run), icase)})
        run.clear()

    for op, av in items:
        if op is _sre_constants.LITERAL:
            run.append(chr(av))
            continue
        flush()
        if op is _sre_constants.SUBPATTERN:
            add, delete, body = av[1], av[2], av[3]
            sub = (icase or bool(add & re.IGNORECASE)) and not bool(delete & re.IGNORECASE)
            options.extend(_literal_options(list(body), sub, cost))
        elif op is _sre_constants.BRANCH:
            alternatives = [_literal_options(list(b), icase, cost) for b in av[1]]
            if all(alternatives):
                merged: set[tuple[str, bool]] = set()
                for alt in alternatives:
                    if cost is None:
                        merged |= max(alt, key=lambda s: min(len(t) for t, _ in s))
                    else:
                        merged |= min(alt, key=cost)
                options.append(merged)
        elif op in _REPEATS and av[0] >= 1:
            options.extend(_literal_options(list(av[2]), icase, cost))
    flush()
    return options


class _Gate:
    """One regex that finds, cheaply, every line a gated rule could match, and which rules to try there.

    Each rule contributes one set of its required literals. Each literal is cut to start where the text
    sampled from the stream makes it cheapest (a rare first byte, so the regex engine's first-character
    skip loop seldom stops, and a suffix that seldom occurs, so few stops are false); the literals form a
    trie, so a stop costs one branch, not one per rule. Case-insensitive literals are spelled with [aA]
    classes after their first character: an inline (?i) group, or a class at the start of an
    alternative, disables the skip loop. Rules with no usable literal are `ungated`: tried on every line.
    With `native`, hyperscan finds the lines that hold a literal when it is installed (see `lines`).
    """

    def __init__(self, rules: Sequence[LogRule], sample: bytes, *, native: bool = False) -> None:
        costs = _Sample(sample)
        ungated: list[LogRule] = []
        self._words: list[tuple[int, set[tuple[str, bool]]]] = []
        for index, rule in enumerate(rules):
            options = [
                o for o in required_literals(rule.pattern, costs.set_cost) if all(t.isascii() or not i for t, i in o)
            ]
            if not options:
                ungated.append(rule)
                continue
            chosen = min(options, key=costs.set_cost)
            self._words.append((index, {costs.rotate(t, i)[1] for t, i in chosen}))
        self.ungated = tuple(ungated)
        self._rules = tuple(rules)
        self._for_hit: dict[str, tuple[LogRule, ...]] = {}
        words = {w for _, ws in self._words for w in ws}
        pattern = _trie(words)
        self.text = re.compile(pattern) if words else None
        self.raw = re.compile(pattern.encode("utf-8")) if words else None
        self._native = _NativeLiterals.build(words) if native and words and not ungated else None

    def lines(self, block: bytes) -> Iterator[tuple[int, int, int]]:
        """(start, end, offset of the first hit) of every line of `block` that holds a gate literal, in
        order; `block` ends with a newline. The offset is 0 where only the line is known."""
        if self._native is not None:
            yield from self._native.lines(block)
            return
        assert self.raw is not None
        pos, search = 0, self.raw.search
        while (hit := search(block, pos)) is not None:
            start = block.rfind(b"\n", 0, hit.start()) + 1
            end = block.find(b"\n", hit.start())
            yield start, end, hit.start() - start
            pos = end + 1

    def rules_for(self, hit: str) -> tuple[LogRule, ...]:
        """The rules that a gate hit (the matched text) may belong to, in rule order.

        Every literal found where the hit starts is a prefix of the text there, so it is a prefix of the
        hit or the hit is a prefix of it (the trie stops at the shortest); case-insensitive literals are
        compared case-folded."""
        found = self._for_hit.get(hit)
        if found is None:
            low = hit.lower()

            def related(word: str, icase: bool) -> bool:
                text = low if icase else hit
                return word.startswith(text) or text.startswith(word)

            found = tuple(self._rules[i] for i, words in self._words if any(related(w, c) for w, c in words))
            self._for_hit[hit] = found
        return found


class _NativeLiterals:
    """The gate's literals found by hyperscan, which scans a block in C at gigabytes a second where the
    gate regex's skip loop stops at every byte that could start a literal. It only says which lines hold
    a literal; the gate regex still picks the rules for each of them, so the matches cannot change."""

    def __init__(self, words: set[tuple[str, bool]]) -> None:
        assert _hs is not None
        ordered = sorted(words)
        # every byte spelled \xHH: the literal means exactly its bytes, whatever hyperscan's syntax
        expressions = ["".join(f"\\x{b:02x}" for b in text.encode("utf-8")).encode("ascii") for text, _ in ordered]
        # CASELESS folds ASCII letters only, like the gate's [aA] classes (non-ASCII icase literals are
        # never in the gate)
        flags = [_hs.HS_FLAG_CASELESS if icase else 0 for _, icase in ordered]
        self._db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        self._db.compile(expressions=expressions, ids=list(range(len(ordered))), flags=flags)

    @classmethod
    def build(cls, words: set[tuple[str, bool]]) -> _NativeLiterals | None:
        """The native search for `words`, or None (the gate regex does the work) if hyperscan is not
        installed or cannot run here."""
        if _hs is None:
            return None
        try:
            return cls(words)
        except _hs.error as exc:  # e.g. a CPU without the instructions it needs
            logger.debug("hyperscan cannot compile the log gate ({}); using the regex gate", exc)
            return None

    def lines(self, block: bytes) -> Iterator[tuple[int, int, int]]:
        ends: list[int] = []
        # hyperscan reports where each hit ends; the hit's last byte lies in the line to report
        self._db.scan(block, match_event_handler=lambda _id, _start, end, _flags, _ctx: ends.append(end))
        ends.sort()
        line_end = -1
        for hit_end in ends:
            if hit_end <= line_end:
                continue
            start = block.rfind(b"\n", 0, hit_end - 1) + 1
            line_end = block.find(b"\n", hit_end - 1)
            yield start, line_end, 0


def native_search_available() -> bool:
    """Whether stream scans can find gate literals with hyperscan (installed and working here)."""
    return _NativeLiterals.build({("probe", False)}) is not None


def _candidates(gate: _Gate, line: Any, regex: re.Pattern, first_hit: int = 0) -> tuple[LogRule, ...]:
    """The rules to try on a line: those of every gate hit in it, overlapping hits included (a literal
    that starts inside another's hit must not be missed). Works on str or bytes lines."""
    found: set[LogRule] = set()
    pos = first_hit
    while True:
        hit = regex.search(line, pos)
        if hit is None:
            break
        text = hit.group(0)
        found.update(gate.rules_for(text if isinstance(text, str) else text.decode("utf-8", errors="replace")))
        pos = hit.start() + 1
    return tuple(r for r in gate._rules if r in found)


# A false stop of the gate costs a few rule searches; a stop of the skip loop costs one branch.
_FALSE_HIT_WEIGHT = 50


class _Sample:
    """Costs of gate literals, measured on a sample of the text to scan.

    A literal is searched from its cheapest start: each stop of the skip loop (its first byte) costs 1,
    each false hit (its suffix occurring where no rule matches) costs _FALSE_HIT_WEIGHT.
    """

    def __init__(self, sample: bytes) -> None:
        self.counts = [1] * 256
        for byte in sample:
            self.counts[byte] += 1
        self.sample, self.folded = sample, sample.lower()
        self._memo: dict[tuple[str, bool], tuple[int, tuple[str, bool]]] = {}

    def first_byte(self, ch: str, icase: bool) -> int:
        if icase and ch.isascii() and ch.isalpha():
            return self.counts[ord(ch.lower())] + self.counts[ord(ch.upper())]
        return self.counts[ch.encode("utf-8")[0]]

    def rotate(self, text: str, icase: bool) -> tuple[int, tuple[str, bool]]:
        """(cost, (suffix, icase)) for the cheapest suffix of at least _MIN_ANCHOR characters."""
        key = (text, icase)
        if key not in self._memo:
            text = text.lower() if icase else text
            haystack = self.folded if icase else self.sample
            # counting a suffix in the sample is the expensive part: only for the rarest first bytes
            starts = sorted(range(len(text) - _MIN_ANCHOR + 1), key=lambda i: (self.first_byte(text[i], icase), i))
            best = min(
                (
                    self.first_byte(text[i], icase) + _FALSE_HIT_WEIGHT * haystack.count(text[i:].encode("utf-8")),
                    i,
                )
                for i in starts[:_ROTATIONS_TRIED]
            )
            self._memo[key] = (best[0], (text[best[1] :], icase))
        return self._memo[key]

    def set_cost(self, option: set[tuple[str, bool]]) -> int:
        return sum(self.rotate(text, icase)[0] for text, icase in option)


def _trie(words: set[tuple[str, bool]]) -> str:
    root: dict = {}
    for text, icase in words:
        fold = icase and text[0].isascii() and text[0].isalpha()
        # the first character is spelled out as two literals, never a class: the skip loop only works
        # when every top-level alternative starts with a literal
        for first in {text[0].upper(), text[0].lower()} if fold else {text[0]}:
            node = root.setdefault((first, False), {})
            for ch in text[1:]:
                node = node.setdefault((ch, icase and ch.isascii() and ch.isalpha()), {})
            node[None] = {}

    def atom(key: tuple[str, bool]) -> str:
        ch, fold = key
        return f"[{ch.upper()}{ch.lower()}]" if fold else re.escape(ch)

    def emit(node: dict) -> str:
        if None in node:  # a shorter literal ends here: finding it is enough
            return ""
        alts = [atom(k) + emit(node[k]) for k in sorted(node)]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


def _nested_repeat(pattern: str) -> str | None:
    """Name the first unbounded repeat that holds another unbounded repeat, the classic `(a+)+` trap.

    Python's `re` backtracks, so such a rule could hang the scanner on one crafted line. Alternations
    under a repeat (`(a|a)*`) can also blow up; rule authors keep those out by review.
    """
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - re.compile already accepted it; this check is best effort
        return None

    def unbounded(op: Any, av: Any) -> bool:
        return op in _REPEATS and av[1] == _sre_constants.MAXREPEAT

    def walk(items: Any, inside: bool) -> str | None:
        for op, av in items:
            if unbounded(op, av):
                if inside:
                    return "a repeat inside a repeat"
                found = walk(av[2], True)
                if found:
                    return found
                continue
            for sub in _children(op, av):
                found = walk(sub, inside)
                if found:
                    return found
        return None

    return walk(parsed, False)


def _children(op: Any, av: Any) -> list[Any]:
    if op in _REPEATS:
        return [av[2]]
    if op is _sre_constants.SUBPATTERN:
        return [av[-1]]
    if op is _sre_constants.BRANCH:
        return list(av[1])
    if op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is _sre_constants.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    if hasattr(_sre_constants, "ATOMIC_GROUP") and op is _sre_constants.ATOMIC_GROUP:
        return [av]
    return []


# Permanent matches at or above this priority are root causes; below it, echoes of one (NCCL errors and
# timeouts on the surviving ranks, their tracebacks): the priority scale is documented in each rule file.
ROOT_CAUSE_PRIORITY = 80


def root_cause_pool(matches: Sequence[RuleMatch]) -> list[RuleMatch]:
    """The matches that compete to explain a failure: root causes if any, else permanent ones, else all."""
    permanent = [m for m in matches if m.rule.permanent]
    if not permanent:
        return list(matches)
    return [m for m in permanent if m.rule.priority >= ROOT_CAUSE_PRIORITY] or permanent


def root_cause(matches: Sequence[RuleMatch]) -> RuleMatch | None:
    """The match that explains the others. Among root causes the first in time wins (an OOM that killed a
    raylet beats the lost node it caused) and priority breaks ties on one line; with warnings only, the
    highest priority wins."""
    pool = root_cause_pool(matches)
    if not pool:
        return None
    if any(m.rule.permanent for m in pool):
        return min(enumerate(pool), key=lambda im: (im[1].line_no, -im[1].rule.priority, im[0]))[1]
    return min(enumerate(pool), key=lambda im: (-im[1].rule.priority, im[1].line_no, im[0]))[1]
