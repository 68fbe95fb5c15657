"""Log rules as data: load and validate rule files, then match log lines against them.

A rule file is YAML in the node-problem-detector style: a file-level `source` (the log stream the rules
read: job-logs, raylet, gcs, ... or a list of them) and a `rules:` list. Every pattern is compiled at
load, so a bad rule stops Argus at start with the file and line of the rule, never at 3 a.m. on the
first matching line. A rule's `unless` (a regex) keeps it off a line that also says that, wherever on the
line ("retrying", "not a failure"). A rule reads a line as its program wrote it (`rule_text`: past colours, a log
store's JSON and a launcher's head such as "[rank3]:", core.line_shapes); a match keeps the line as written.

One module past 400 lines on purpose: the rule type, its loader, the matcher with its literal gate and the
root-cause order (signatures, then generic rules, then warnings) are one contract that every reader of rules
(live detection, failed jobs, `argus analyze`, the RCA) shares; split, each half would have to restate it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import yaml
from loguru import logger

from core.errors import RuleError
from core.limits import MAX_LINE_BYTES, MAX_LINE_CHARS
from core.line_shapes import body, unwrap, unwrap_block
from core.literal_gate import (
    CharCosts,
    LiteralGate,
    nested_unbounded_repeat,
    required_literals,
)
from core.types import Category, Severity
from detectors.rule_files import RuleFile, RuleItem, rule_paths

STREAM_BLOCK_BYTES = 4 * 1024 * 1024

ANY_SOURCE = "*"

_FILE_KEYS = {"source", "rules"}
_REQUIRED_RULE_KEYS = ("reason", "category", "type", "pattern")
_OPTIONAL_RULE_KEYS = ("severity", "confidence", "action", "priority", "description", "source", "tier", "unless")
DEFAULT_PRIORITY = 50


class Readable(Protocol):
    """What scan_stream reads: a binary file, a pipe, or a reader wrapped around one (rca/analyze.py)."""

    def read(self, size: int = -1, /) -> bytes: ...


class RuleTier(str, Enum):
    """How much a match says. A signature names a known failure in its own words; a generic rule reads the shape of
    a failure (a traceback's last line, "node ... died", "No space") and decides only where no signature matched,
    at a lower confidence. Generic rules serve root-cause analysis of a job that failed, never live detection (a
    running job may log a caught exception): RuleSet.signatures() leaves them out."""

    SIGNATURE = "signature"
    GENERIC = "generic"
    # A generic rule that reads only a log's last non-blank line (RuleSet.ending): what the process was doing
    # when its log stopped, where the line alone says nothing ("NCCL INFO ..." mid-log is setup, as the last line
    # of a failed job's log it is where the job stuck). Never matched line by line.
    ENDING = "ending"


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
    tier: RuleTier = RuleTier.SIGNATURE
    # `unless`: a line this also matches is not the rule's ("retrying", "not a failure", a [W ...] warning's head),
    # wherever on the line it stands. Kept apart from the pattern so the pattern says what the rule reads.
    unless: str | None = None
    unless_regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def finds(self, read: str) -> bool:
        """Whether the rule reads this line (`rule_text` of it): the pattern is found and `unless` is not."""
        return self.regex.search(read) is not None and (
            self.unless_regex is None or self.unless_regex.search(read) is None)

    @property
    def permanent(self) -> bool:
        return self.type is RuleType.PERMANENT

    @property
    def generic(self) -> bool:
        return self.tier is not RuleTier.SIGNATURE

    @property
    def ending(self) -> bool:
        return self.tier is RuleTier.ENDING

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


def last_line(lines: Sequence[str], first_line_no: int = 1) -> tuple[int, str] | None:
    """The last non-blank line of a log and its number, or None when every line is blank."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip():
            return first_line_no + index, lines[index]
    return None


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
        self.rules: tuple[LogRule, ...] = tuple(r for r in rules if not r.ending)  # matched line by line
        self.endings: tuple[LogRule, ...] = tuple(r for r in rules if r.ending)  # matched on a log's last line
        self._line_gate = _rule_gate(self.rules, _DEFAULT_SAMPLE)
        self._block_gates: dict[tuple[str, bool], LiteralGate] = {}
        self._gate_lock = threading.Lock()

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
        return RuleSet([r for r in (*self.rules, *self.endings) if r.reads(source)])

    def signatures(self) -> RuleSet:
        """The rules without the generic tiers: what live detection matches running jobs' logs with."""
        return RuleSet([r for r in self.rules if not r.generic])

    def get(self, reason: str) -> LogRule | None:
        return next((r for r in (*self.rules, *self.endings) if r.reason == reason), None)

    def ending(self, last: tuple[int, str] | None, source: str) -> list[RuleMatch]:
        """The ending rules' matches on a log's last non-blank line and its number (`last_line`; None: the log is
        blank), for a log that has ended: a failed or stopped job's, a file given to `argus analyze`. Never a live
        stream's latest line, which is only where the stream is now."""
        if last is None:
            return []
        line_no, line = last
        text, truncated = clip_line(line.rstrip("\r\n"))
        return [RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)
                for rule in _found(self.endings, text)]

    def match(self, text: str) -> list[LogRule]:
        """Every rule whose pattern is found in what the program wrote of the line (`rule_text`), in rule order."""
        return self._matching(clip_line(text)[0])

    def _matching(self, text: str) -> list[LogRule]:
        """`match` on a line already clipped."""
        read = rule_text(text)
        gate = self._line_gate
        if gate.ungated or not gate.gated:
            return [rule for rule in self.rules if rule.finds(read)]
        return [rule for rule in self._candidates(gate, read) if rule.finds(read)]

    def block_gate(self, sample: bytes = b"", *, kind: str | None = None, native: bool = True) -> LiteralGate:
        """The gate `scan_stream` puts in front of the rules, for a caller that scans bytes blocks itself (a node
        agent): `lines(block)` finds the candidate lines, `match` on each decides. `sample`: typical text of the
        stream (its characters pick the literals' anchors); empty for a general log sample. `kind` names what
        kind of stream the sample is (a raylet's, a job driver's): the first gate built for a kind is kept and
        given to later callers of that kind (building one costs a tenth of a second; the same kind of text
        wants the same literals)."""
        if kind is None:
            return _rule_gate(self.rules, sample[:_SAMPLE_BYTES] or _DEFAULT_SAMPLE, native=native)
        with self._gate_lock:  # many agents' threads reach their sample at once: one builds, the others wait for it
            known = self.known_block_gate(kind, native=native)
            if known is None:
                known = _rule_gate(self.rules, sample[:_SAMPLE_BYTES] or _DEFAULT_SAMPLE, native=native)
                self._block_gates[(kind, native)] = known
            return known

    def known_block_gate(self, kind: str, *, native: bool = True) -> LiteralGate | None:
        """The gate already built for this kind of stream (`block_gate`), if any."""
        return self._block_gates.get((kind, native))

    def scan(self, lines: Iterable[str], source: str, start_line: int = 1) -> Iterator[RuleMatch]:
        """Match every line; `source` names where the lines came from (a path, a stream) in the matches."""
        for line_no, raw in enumerate(lines, start=start_line):
            text, truncated = clip_line(raw.rstrip("\r\n"))
            for rule in self._matching(text):
                yield RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)

    def scan_stream(
        self,
        stream: Readable,
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
        gate: LiteralGate | None = None
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
                gate = _rule_gate(self.rules, chunk[:_SAMPLE_BYTES], native=native)
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
            gate = gate or _rule_gate(self.rules, pending[:_SAMPLE_BYTES], native=native)
            yield from self._scan_block(gate, pending + b"\n", stats, source)

    def _scan_block(self, gate: LiteralGate, block: bytes, stats: ScanStats, source: str) -> Iterator[RuleMatch]:
        """Match the complete lines of `block` (it ends with a newline); line numbers go on from `stats`."""
        first = stats.lines + 1
        stats.lines += block.count(b"\n")
        if gate.ungated or not gate.gated:
            for offset, raw in enumerate(block[:-1].split(b"\n")):
                yield from self._match_raw(raw, first + offset, source, self.rules)
            return
        # Colours inside a word or JSON quoting would hide the rules' literals from the gate: it reads the block
        # unwrapped (the same lines, core.line_shapes), and matches keep each line as written.
        plain = unwrap_block(block)
        written = block.split(b"\n") if plain is not block else None
        counted, line_no = 0, first
        for start, end, first_hit in gate.lines(plain):
            line_no += plain.count(b"\n", counted, start)
            counted = start
            candidates = self._candidates(gate, plain[start:end], first_hit)
            if candidates:
                line = written[line_no - first] if written is not None else plain[start:end]
                yield from self._match_raw(line, line_no, source, candidates)

    def _candidates(self, gate: LiteralGate, line: str | bytes, first_hit: int = 0) -> list[LogRule]:
        """The rules whose gate literal occurs in the line (str or bytes), in rule order."""
        return [self.rules[index] for index in gate.patterns_in(line, first_hit)]

    @staticmethod
    def _match_raw(raw: bytes, line_no: int, source: str, rules: Sequence[LogRule]) -> Iterator[RuleMatch]:
        text, truncated = clip_line(raw[:MAX_LINE_BYTES].decode("utf-8", errors="replace").rstrip("\r\n"))
        for rule in _found(rules, text):
            yield RuleMatch(rule=rule, line_no=line_no, text=text, source=source, truncated=truncated)


def rule_text(line: str) -> str:
    """What rules read of a line: the program's own words, past the wrapper a log store put around them (colours,
    Docker's JSON) and the heads a runtime or launcher put in front (a timestamp, Ray's worker prefix, a rank:
    core.line_shapes). A rule anchored at the start of a traceback's header reads it after "[rank3]: " too, and a
    whole-line exclusion ("not a [W ...] warning") judges the program's line, not the launcher's head. Matches keep
    the line as written: that is the evidence. An indent is not read either: a rule anchored at a line's start
    reads a log pasted as an indented (markdown) block the same."""
    return body(unwrap(line)).lstrip(" \t")


def _found(rules: Iterable[LogRule], text: str) -> list[LogRule]:
    """The rules found in a line as written (clipped)."""
    read = rule_text(text)
    return [rule for rule in rules if rule.finds(read)]


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
    regex = _compile(rule, "pattern", pattern, "it would match every line")
    unless = item.get("unless")
    unless_regex = None if unless is None else _compile(rule, "unless", unless, "no line would be read")

    severity = Severity.CRITICAL if rtype is RuleType.PERMANENT else Severity.WARNING
    if item.get("severity") is not None:
        severity = rule.choice("severity", Severity)
    confidence = rule.confidence(0.9 if rtype is RuleType.PERMANENT else 0.5)
    priority = item.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail("priority", f"priority {priority!r} is not an integer", "higher wins; e.g. 90 for a lost node")
    action = rule.text("action", "write the recommended action as one sentence")
    description = rule.text("description", "write one sentence")
    tier = rule.choice("tier", RuleTier) if item.get("tier") is not None else RuleTier.SIGNATURE
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
        tier=tier,
        unless=unless,
        unless_regex=unless_regex,
        description=description.strip() if description else None,
        file=path,
        line=rule.line,
    )


def _compile(rule: RuleItem, key: str, value: Any, if_empty: str) -> re.Pattern[str]:
    """A rule's regex (`pattern` or `unless`), refused at load when it is no string, no regex, matches the empty
    string or nests unbounded repeats."""
    if not isinstance(value, str):
        raise rule.fail(key, f"{key} must be a string", "quote it with single quotes")
    try:
        regex = re.compile(value)
    except re.error as exc:
        raise rule.fail(key, f"bad regex: {exc}", f"fix the {key}; it is a Python `re` expression") from exc
    if regex.search("") is not None:
        raise rule.fail(key, f"{key} matches the empty string, so {if_empty}", "make it specific")
    if nested_unbounded_repeat(value):
        raise rule.fail(
            key,
            f"{key} nests unbounded repeats (a repeat inside a repeat), which can take exponential time on "
            "hostile lines",
            "bound the inner repeat, e.g. [^ ]{1,64}, or drop the outer one",
        )
    return regex


def _sources(path: Path, line: int, value: Any) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise RuleError(
            f"{path}:{line}: `source` must be a stream name or a list of them",
            hint="e.g. job-logs, raylet, gcs, or '*' for any stream",
        )
    return tuple(v.strip() for v in values)


# --- fast scanning: a literal gate in front of the rules ------------------------------------------

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


def _rule_gate(rules: Sequence[LogRule], sample: bytes, *, native: bool = False) -> LiteralGate:
    """The literal gate for these rules: each rule brings the set of its required literals that costs least
    on `sample` (the first bytes of the stream, or typical log text). A rule without a literal of three
    characters or more, or only with ones that fold non-ASCII letters, is ungated. With `native`, hyperscan
    finds the candidate lines when it is installed; either way the rules' own regexes decide."""
    costs = CharCosts.from_sample(sample)
    literals: list[set[tuple[str, bool]]] = []
    for rule in rules:
        options = [
            option
            for option in required_literals(rule.pattern, costs.literal_set)
            if all(text.isascii() or not icase for text, icase in option)
        ]
        literals.append(min(options, key=costs.literal_set) if options else set())
    return LiteralGate(literals, costs, native=native)


@dataclass
class ScanStats:
    """What a stream scan read: lines (a last line without a newline counts) and bytes."""

    lines: int = 0
    bytes: int = 0


# Permanent matches at or above this priority are root causes; below it, echoes of one (NCCL errors and
# timeouts on the surviving ranks, their tracebacks): the priority scale is documented in each rule file.
ROOT_CAUSE_PRIORITY = 80


def root_cause_pool(matches: Sequence[RuleMatch]) -> list[RuleMatch]:
    """The matches that compete to explain a failure: permanent signatures if any (root causes among them if
    any), else permanent generic matches (root causes among them if any), else all (warnings)."""
    # A generic rule may not contradict a signature (even a warning's) on the same line: "File ... cannot be
    # opened" is a full disk's warning before it is any RuntimeError. Where they agree ("exitcode: -9" is both a
    # SIGKILL warning and the generic host OOM), the generic match stands.
    known: dict[tuple[str, int], set[Category]] = {}
    for m in matches:
        if not m.rule.generic:
            known.setdefault((m.source, m.line_no), set()).add(m.rule.category)
    matches = [m for m in matches if not m.rule.generic
               or m.rule.category in known.get((m.source, m.line_no), {m.rule.category})]
    permanent = [m for m in matches if m.rule.permanent]
    if not permanent:
        return list(matches)
    pool = [m for m in permanent if not m.rule.generic] or permanent
    return [m for m in pool if m.rule.priority >= ROOT_CAUSE_PRIORITY] or pool


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
