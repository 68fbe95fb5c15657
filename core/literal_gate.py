"""One literal gate in front of many regexes: find, in one pass, where any of their literals occurs.

Running N regexes over a text costs N scans; most of them find nothing. Every match of a pattern holds one of
its literals (`required_literals`: somewhere in the match; `literal_prefixes`: where the match starts), so a
`LiteralGate` built from those literals scans the text once and says which patterns may match it and where
their literals start. The log-rule engine asks "which rules may match this line" (`patterns_in`, `lines` over
bytes blocks); redaction asks "where may each pattern start" (`starts`, then `regex.match` there).

How the one pass stays cheap: Python's `re` skips ahead in C only to characters that can start a match, so
every literal is anchored on its cheapest character (`CharCosts`: measured on a sample of the text to scan,
or a frequency table) and the gate regex is one branch per anchor character, each starting with that literal
character and checking the rest of the literal with a lookbehind and a lookahead trie. At a stop, a table
names the literals that really start there. Case-insensitive literals fold ASCII letters only ([aA] classes,
never an inline (?i): that would turn the skip loop off). With `native`, hyperscan finds the lines of a bytes
block that hold a literal, in C at gigabytes a second.

The same parse of a pattern also answers whether it can backtrack exponentially (`nested_unbounded_repeat`),
so what an atomic group `(?>...)` or a possessive repeat `a++` (Python 3.11) means is decided here once:
their bodies are never re-entered by backtracking from outside, so an unbounded repeat around them is safe
and their literals are required like any other; repeats nested inside their body are still checked.

One module (past 400 lines) because it is one concept: what a pattern's parse promises (its literals, its
backtracking) and the gate built on those promises are read by the same walk of the parse tree, and keeping
them together is what keeps the two users from drifting apart again. Imports nothing of ours.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, AnyStr, Generic

# The parser `re` itself uses; it moved in 3.11 (the old name still works but warns there). A version check,
# not try/except ImportError: mypy reads it, so each branch is checked against the Python it runs on.
if sys.version_info >= (3, 11):
    # typeshed has no stubs for these private modules (it has the 3.10 names below)
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    from re import _constants as _sre  # type: ignore[attr-defined]
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre
    import sre_parse as _sre_parse

try:  # optional: a C multi-literal search (SIMD); without it the gate regex walks the block
    import hyperscan as _hs
except (ImportError, OSError):  # pragma: no cover - depends on the install
    # a flag, not `_hs = None`: the module keeps its own type (hyperscan ships stubs) where it is importable
    _hyperscan_imported = False
else:
    _hyperscan_imported = True

__all__ = [
    "CharCosts",
    "LiteralGate",
    "literal_prefixes",
    "native_search_available",
    "nested_unbounded_repeat",
    "parse_pattern",
    "required_literals",
    "sre_constants",
    "walk",
]

# The op codes of `walk`'s parse trees, for callers that read patterns further (whichever Python names them).
sre_constants = _sre

# A literal, as (text, ignore_case); a case-insensitive literal is stored lower case.
Literal = tuple[str, bool]

MIN_LITERAL = 3  # shorter required literals stop the gate too often to pay for themselves
_MAX_PREFIXES = 64

_BACKTRACKING_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)
# Present from 3.11; None before (no pattern can hold them then).
_POSSESSIVE_REPEAT = getattr(_sre, "POSSESSIVE_REPEAT", None)
_ATOMIC_GROUP = getattr(_sre, "ATOMIC_GROUP", None)


# --- reading a pattern -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def parse_pattern(pattern: str) -> Any:
    """The parse tree `re` builds for `pattern` (raises re.error like re.compile).

    Cached: a stream scan builds its gate from every rule's pattern, once per stream; callers only read the tree.
    """
    return _sre_parse.parse(pattern)


def _is_repeat(op: Any) -> bool:
    return op in _BACKTRACKING_REPEATS or (_POSSESSIVE_REPEAT is not None and op is _POSSESSIVE_REPEAT)


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed op."""
    if _is_repeat(op):
        return [av[2]]
    if op is _sre.SUBPATTERN:
        return [av[3]]
    if op is _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op is _sre.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    if _ATOMIC_GROUP is not None and op is _ATOMIC_GROUP:
        return [av]
    return []


def walk(parsed: Any) -> Iterator[tuple[Any, Any]]:
    """Every (op, argument) in a parsed pattern, nested ones included."""
    for op, av in parsed:
        yield op, av
        for child in _children(op, av):
            yield from walk(child)


def nested_unbounded_repeat(pattern: str) -> bool:
    """Whether an unbounded repeat sits inside another (`(a+)*`), the shape that backtracks exponentially.

    An atomic group or a possessive repeat is never re-entered by backtracking from outside, so an unbounded
    repeat around one is safe (`(?>a+)+`, `(a++)+`); their bodies are checked on their own (`(?>(a+)+b)` is
    not safe). Alternations under a repeat (`(a|a)*`) can also blow up; authors keep those out by review.
    False when the pattern does not parse (re.compile reports that better).
    """
    try:
        parsed = parse_pattern(pattern)
    except re.error:
        return False

    def nested(items: Any, inside: bool) -> bool:
        for op, av in items:
            if op in _BACKTRACKING_REPEATS:
                unbounded = av[1] == _sre.MAXREPEAT
                if unbounded and inside:
                    return True
                if nested(av[2], inside or unbounded):
                    return True
            elif (_POSSESSIVE_REPEAT is not None and op is _POSSESSIVE_REPEAT) or (
                _ATOMIC_GROUP is not None and op is _ATOMIC_GROUP
            ):
                if any(nested(child, False) for child in _children(op, av)):
                    return True
            elif any(nested(child, inside) for child in _children(op, av)):
                return True
        return False

    return nested(parsed, False)


def required_literals(pattern: str, cost: Callable[[set[Literal]], float] | None = None) -> list[set[Literal]]:
    """Candidate sets of literals, as (text, ignore_case): every match of `pattern` contains at least one
    literal of each set. Empty when the pattern has no literal of MIN_LITERAL characters or more. With `cost`
    (a literal set -> number), alternatives contribute their cheapest literals, otherwise their longest."""
    try:
        parsed = parse_pattern(pattern)
    except re.error:
        return []
    return _literal_options(list(parsed), bool(parsed.state.flags & re.IGNORECASE), cost)


def _literal_options(items: list[Any], icase: bool, cost: Any = None) -> list[set[Literal]]:
    options: list[set[Literal]] = []
    # The literal texts the pattern may hold here: one run, or several where a small class or an alternation of
    # literals sits among literal characters ("\.(?:cc|h):" holds ".cc:" or ".h:"; `re` parses the group as "."
    # then a branch). A set of runs each MIN_LITERAL long is one option.
    runs: list[str] = [""]

    def flush() -> None:
        if all(len(run) >= MIN_LITERAL for run in runs):
            options.append({(run.lower() if icase else run, icase) for run in runs})
        runs[:] = [""]

    for op, av in items:
        texts = _literal_texts(op, av)
        if texts is not None:
            if len(runs) * len(texts) > _MAX_RUNS:
                flush()
            if len(texts) <= _MAX_RUNS:
                runs[:] = [run + text for run in runs for text in texts]
                continue
        flush()
        if op is _sre.SUBPATTERN:
            add, delete, body = av[1], av[2], av[3]
            sub = (icase or bool(add & re.IGNORECASE)) and not bool(delete & re.IGNORECASE)
            options.extend(_literal_options(list(body), sub, cost))
        elif _ATOMIC_GROUP is not None and op is _ATOMIC_GROUP:
            options.extend(_literal_options(list(av), icase, cost))  # its body matches whole, like a group
        elif op is _sre.BRANCH:
            alternatives = [_literal_options(list(b), icase, cost) for b in av[1]]
            if all(alternatives):
                merged: set[Literal] = set()
                for alt in alternatives:
                    if cost is None:
                        merged |= max(alt, key=lambda s: min(len(t) for t, _ in s))
                    else:
                        merged |= min(alt, key=cost)
                options.append(merged)
        elif _is_repeat(op) and av[0] >= 1:
            options.extend(_literal_options(list(av[2]), icase, cost))
    flush()
    return options


_MAX_RUNS = 16  # literal texts one place of a pattern may hold before the gate stops spelling them out


def _literal_texts(op: Any, av: Any) -> list[str] | None:
    """The texts one op matches when it is a literal, a small class of literals, or an alternation (a group
    without flags) of such sequences; None otherwise or past _MAX_RUNS texts."""
    chars = _chars(op, av)
    if chars is not None:
        return chars if len(chars) <= _MAX_RUNS else None
    if op is _sre.SUBPATTERN and not av[1] and not av[2]:
        return _sequence_texts(list(av[3]))
    if op is _sre.BRANCH:
        texts: list[str] = []
        for branch in av[1]:
            alternative = _sequence_texts(list(branch))
            if alternative is None or len(texts) + len(alternative) > _MAX_RUNS:
                return None
            texts += alternative
        return texts
    return None


def _sequence_texts(items: list[Any]) -> list[str] | None:
    texts = [""]
    for op, av in items:
        part = _literal_texts(op, av)
        if part is None or len(texts) * len(part) > _MAX_RUNS:
            return None
        texts = [text + p for text in texts for p in part]
    return texts


def _chars(op: Any, av: Any) -> list[str] | None:
    """The characters one op matches when it is a literal or a small class of literals and ranges."""
    if op is _sre.LITERAL:
        return [chr(av)]
    if op is _sre.IN:
        chars: list[str] = []
        for item_op, item in av:
            if item_op is _sre.LITERAL:
                chars.append(chr(item))
            elif item_op is _sre.RANGE and item[1] - item[0] < 32:
                chars.extend(chr(code) for code in range(item[0], item[1] + 1))
            else:
                return None
        return chars
    return None


def literal_prefixes(parsed: Any) -> set[str]:
    """Literal prefixes of a parsed pattern, as written: every match starts with one of them ("" in the set
    when nothing is certain). Case flags are not applied: the caller decides how the text is folded."""
    out = {""}
    for op, av in parsed:
        chars = _chars(op, av)
        if chars is not None:
            if len(out) * len(chars) > _MAX_PREFIXES:
                return out
            out = {prefix + char for prefix in out for char in chars}
            continue
        if op in (_sre.ASSERT, _sre.ASSERT_NOT) and (op is _sre.ASSERT_NOT or av[0] < 0):
            continue  # a lookbehind or a negative lookahead consumes nothing and promises no text
        if op is _sre.BRANCH:
            tails: set[str] = set().union(*(literal_prefixes(branch) for branch in av[1]))
        elif op is _sre.SUBPATTERN:
            tails = literal_prefixes(av[3])
        elif _ATOMIC_GROUP is not None and op is _ATOMIC_GROUP:
            tails = literal_prefixes(av)  # the text here starts with its body's match
        elif op is _sre.ASSERT:  # a lookahead: the text here starts with its prefix, and nothing is consumed
            tails = literal_prefixes(av[1])
        else:
            return out
        if len(out) * len(tails) > _MAX_PREFIXES:
            return out
        return {prefix + tail for prefix in out for tail in tails}
    return out


# --- what a stop costs -----------------------------------------------------------------------------------

# A false hit of the gate costs a few regex searches; a stop of the skip loop costs one branch.
_FALSE_HIT_WEIGHT = 50


class CharCosts:
    """What the gate pays for its literals: each stop of the skip loop at a literal's anchor character, and
    (with a sample) each time the literal occurs where no pattern matches, weighted _FALSE_HIT_WEIGHT."""

    def __init__(self, frequency: Callable[[str], float], sample: bytes = b"") -> None:
        self._frequency = frequency
        self.sample, self.folded = sample, sample.lower()
        self._memo: dict[Literal, float] = {}

    @classmethod
    def from_sample(cls, sample: bytes) -> CharCosts:
        """Costs counted on a sample of the text to scan (its first bytes): a stop costs one per occurrence
        of the character's first byte."""
        counts = [1] * 256
        for byte in sample:
            counts[byte] += 1
        return cls(lambda ch: counts[ch.encode("utf-8", "surrogatepass")[0]], sample)

    @classmethod
    def from_table(cls, frequency: Mapping[str, float], default: float) -> CharCosts:
        """Costs from a table of character frequencies (characters not in it cost `default`)."""
        return cls(lambda ch: frequency.get(ch, default))

    def char(self, ch: str, icase: bool = False) -> float:
        if icase and ch.isascii() and ch.isalpha():
            return self._frequency(ch.lower()) + self._frequency(ch.upper())
        return self._frequency(ch)

    def literal(self, text: str, icase: bool) -> float:
        """The cost of one literal: its cheapest stop, and its false hits in the sample."""
        key = (text, icase)
        if key not in self._memo:
            stops = min(self.char(ch, icase) for ch in text)
            haystack = self.folded if icase else self.sample
            hits = haystack.count(text.encode("utf-8", "surrogatepass")) if haystack else 0
            self._memo[key] = stops + _FALSE_HIT_WEIGHT * hits
        return self._memo[key]

    def literal_set(self, option: set[Literal]) -> float:
        """The cost of a set of literals that all go into the gate."""
        return sum(self.literal(text, icase) for text, icase in option)


# --- the gate --------------------------------------------------------------------------------------------


def _fold(ch: str, icase: bool) -> bool:
    return icase and ch.isascii() and ch.isalpha()


def _atom(ch: str, icase: bool) -> str:
    return f"[{ch.upper()}{ch.lower()}]" if _fold(ch, icase) else re.escape(ch)


def _trie(words: Iterable[str], icase: bool) -> str:
    """A regex for these literal words, as a trie (few branches for `re` to try). A word that ends where
    longer ones go on ends the branch: finding it is enough."""
    heads: dict[str, set[str]] = {}
    for word in words:
        if not word:
            return ""
        heads.setdefault(word[0], set()).add(word[1:])  # case-insensitive words are stored lower case
    alternatives = [
        _atom(head, icase) + _trie(tails, icase) for head, tails in sorted(heads.items()) if "" not in tails
    ]
    singles = sorted(head for head, tails in heads.items() if "" in tails)
    ascii_singles = [h for h in singles if h.isascii()]
    if len(ascii_singles) > 1:  # one class, not one branch each (a class cannot hold a multi-byte character)
        folded = "".join(
            dict.fromkeys(c for h in ascii_singles for c in ({h.lower(), h.upper()} if _fold(h, icase) else {h}))
        )
        alternatives.append(f"[{''.join(map(re.escape, sorted(folded)))}]")
        singles = [h for h in singles if not h.isascii()]
    alternatives.extend(_atom(head, icase) for head in singles)
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


class _Form(Generic[AnyStr]):
    """The gate for one kind of text (str or bytes): its regex, and at each stop the literals to check."""

    def __init__(self, pattern: AnyStr, triggers: list[tuple[Literal, int, list[tuple[Literal, int]]]]) -> None:
        self.regex: re.Pattern[AnyStr] = re.compile(pattern)
        raw = isinstance(pattern, bytes)

        def units(text: str) -> Any:
            return text.encode("utf-8") if raw else text

        # anchor unit -> [(anchor offset, trigger length, icase, {trigger (folded if icase): entries})]
        # entries: (word, icase, pattern index) for every literal that starts with the trigger
        groups: dict[Any, dict[tuple[int, int, bool], dict[Any, list[tuple[Any, bool, int]]]]] = {}
        for (trigger, icase), offset, entries in triggers:
            anchor = trigger[offset]
            before = len(units(trigger[:offset]))
            for ch in {anchor.lower(), anchor.upper()} if _fold(anchor, icase) else {anchor}:
                table = groups.setdefault(units(ch)[0], {}).setdefault((before, len(units(trigger)), icase), {})
                table.setdefault(units(trigger), []).extend((units(w), i, index) for (w, i), index in entries)
        self.lookup = {
            unit: [(offset, length, icase, table) for (offset, length, icase), table in by_place.items()]
            for unit, by_place in groups.items()
        }

    def starts(self, text: Any, pos: int, endpos: int) -> set[tuple[int, int]]:
        found: set[tuple[int, int]] = set()
        lookup, startswith = self.lookup, text.startswith
        for hit in self.regex.finditer(text, pos, endpos):
            at = hit.start()
            for offset, length, icase, table in lookup[text[at]]:
                start = at - offset
                if start < 0:
                    continue
                piece = text[start : start + length]
                entries = table.get(piece.lower() if icase else piece)
                if not entries:
                    continue
                for word, fold, index in entries:
                    if len(word) == length or (
                        text[start : start + len(word)].lower() == word if fold else startswith(word, start)
                    ):
                        found.add((start, index))
        return found


class LiteralGate:
    """One pass that finds where the literals of many patterns start, and so which patterns may match.

    `literals[i]` are the literals of pattern i, as (text, ignore_case): every match of the pattern holds one
    of them (where the match starts, or anywhere, as the caller built them). A pattern without literals is
    `ungated`: the caller runs it everywhere. `costs` picks each literal's anchor character (the default
    counts nothing: the first cheapest character); `native` finds the lines of bytes blocks with hyperscan
    when it is installed and every pattern is gated.
    """

    def __init__(
        self,
        literals: Sequence[Collection[Literal]],
        costs: CharCosts | None = None,
        *,
        native: bool = False,
    ) -> None:
        costs = costs or CharCosts(lambda _: 1)
        self.ungated = tuple(i for i, words in enumerate(literals) if not words)
        by_word: dict[Literal, list[int]] = {}
        for index, words in enumerate(literals):
            for text, icase in words:
                if not text or (icase and not text.isascii()):
                    raise ValueError(f"gate literal {text!r} is empty or folds non-ASCII letters; leave it out")
                by_word.setdefault((text.lower() if icase else text, icase), []).append(index)
        # Only the shortest literals go into the regex ("pass" finds "password" too); the longer ones are
        # checked at its stops.
        # Each literal belongs to its shortest prefix among them, its trigger (found by prefix lookups: the
        # rules bring hundreds of literals, and comparing every pair cost a quarter of a second per gate).
        present = set(by_word)
        members: dict[Literal, list[tuple[Literal, int]]] = {}
        for (word, icase), indexes in by_word.items():
            shortest = next(k for k in range(1, len(word) + 1) if (word[:k], icase) in present)
            members.setdefault((word[:shortest], icase), []).extend(((word, icase), index) for index in indexes)
        triggers = sorted(members)
        # Triggers whose best character is common choose first; the rest prefer an anchor already chosen when
        # it is not much more common than their own best (one more check at a stop costs less than more stops).
        chosen: set[tuple[str, bool]] = set()
        placed: list[tuple[Literal, int, list[tuple[Literal, int]]]] = []
        for trigger in sorted(triggers, key=lambda w: (-min(costs.char(c, w[1]) for c in w[0]), w)):
            text, icase = trigger

            def anchor_cost(i: int, text: str = text, icase: bool = icase) -> tuple[float, int]:
                key = (text[i].lower() if _fold(text[i], icase) else text[i], _fold(text[i], icase))
                return (costs.char(text[i], icase) * (0.25 if key in chosen else 1), i)

            offset = min(range(len(text)), key=anchor_cost)
            chosen.add(
                (text[offset].lower() if _fold(text[offset], icase) else text[offset], _fold(text[offset], icase))
            )
            placed.append((trigger, offset, members[trigger]))
        self.literals = tuple(trigger for trigger, _, _ in placed)
        pattern = self._pattern(placed, costs)
        self._str: _Form[str] | None = _Form(pattern, placed) if placed else None
        self._bytes: _Form[bytes] | None = _Form(pattern.encode("utf-8"), placed) if placed else None
        self._native = _NativeLiterals.build(set(self.literals)) if native and placed and not self.ungated else None

    @staticmethod
    def _pattern(placed: list[tuple[Literal, int, list[tuple[Literal, int]]]], costs: CharCosts) -> str:
        # anchor spelling -> {(before, icase): [after...]}
        by_anchor: dict[str, dict[tuple[str, bool], list[str]]] = {}
        for (text, icase), offset, _ in placed:
            anchor = text[offset]
            for ch in {anchor.lower(), anchor.upper()} if _fold(anchor, icase) else {anchor}:
                by_anchor.setdefault(ch, {}).setdefault((text[:offset], icase), []).append(text[offset + 1 :])
        branches = []
        # The most common anchors first: at a stop, `re` tries the branches in order. Every branch starts with
        # its literal character, never a class: the skip loop only works when all of them do.
        for anchor, checks_by_before in sorted(by_anchor.items(), key=lambda item: (-costs.char(item[0]), item[0])):
            checks = []
            for (before, icase), afters in sorted(checks_by_before.items()):
                behind = "".join(_atom(c, icase) for c in before) + re.escape(anchor)
                ahead = _trie(afters, icase)
                checks.append((f"(?<={behind})" if before else "") + (f"(?={ahead})" if ahead else ""))
            tail = "" if "" in checks else checks[0] if len(checks) == 1 else "(?:" + "|".join(checks) + ")"
            branches.append(re.escape(anchor) + tail)
        return "|".join(branches)

    @property
    def gated(self) -> bool:
        """Whether any pattern has literals (else the gate finds nothing and every pattern is ungated)."""
        return self._str is not None

    @property
    def regex(self) -> re.Pattern[str] | None:
        """The gate regex over str (its matches are the anchor characters of literals)."""
        return self._str.regex if self._str is not None else None

    def _form(self, text: str | bytes) -> _Form[str] | _Form[bytes] | None:
        return self._bytes if isinstance(text, (bytes, bytearray)) else self._str

    def starts(self, text: str | bytes, pos: int = 0, endpos: int | None = None) -> list[tuple[int, int]]:
        """(offset, pattern index) for every place in text[pos:endpos] where a literal of a pattern starts,
        sorted. Offsets are in the text's units (characters or bytes); a literal starting before `pos` whose
        anchor lies after it counts too."""
        form = self._form(text)
        if form is None:
            return []
        return sorted(form.starts(text, pos, len(text) if endpos is None else endpos))

    def patterns_in(self, text: str | bytes, pos: int = 0) -> tuple[int, ...]:
        """The gated patterns whose literal occurs in text[pos:] (anchored there), in index order."""
        form = self._form(text)
        if form is None:
            return ()
        return tuple(sorted({index for _, index in form.starts(text, pos, len(text))}))

    def lines(self, block: bytes) -> Iterator[tuple[int, int, int]]:
        """(start, end, first hit) of every line of `block` that holds a gate literal, in order; `block` ends
        with a newline. `first hit` is an offset in the line from which `patterns_in` finds all its literals
        (0 where only the line is known)."""
        if self._native is not None:
            yield from self._native.lines(block)
            return
        if self._bytes is None:
            return
        pos, search = 0, self._bytes.regex.search
        while (hit := search(block, pos)) is not None:
            start = block.rfind(b"\n", 0, hit.start()) + 1
            end = block.find(b"\n", hit.start())
            yield start, end, hit.start() - start
            pos = end + 1


class _NativeLiterals:
    """The gate's literals found by hyperscan, which scans a block in C where the gate regex's skip loop stops
    at every anchor character. It only says which lines hold a literal; the gate regex then names them."""

    def __init__(self, words: set[Literal]) -> None:
        ordered = sorted(words)
        # every byte spelled \xHH: the literal means exactly its bytes, whatever hyperscan's syntax
        expressions = ["".join(f"\\x{b:02x}" for b in text.encode("utf-8")).encode("ascii") for text, _ in ordered]
        # CASELESS folds ASCII letters only, like the gate's [aA] classes (literals never fold others)
        flags = [_hs.HS_FLAG_CASELESS if icase else 0 for _, icase in ordered]
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=expressions, ids=list(range(len(ordered))), flags=flags)
        self._db = _ScanPerThread(db)

    @classmethod
    def build(cls, words: set[Literal]) -> _NativeLiterals | None:
        """The native search for `words`, or None (the gate regex does the work) if hyperscan is not
        installed or cannot run here."""
        if not _hyperscan_imported:
            return None
        try:
            return cls(words)
        except _hs.error:  # e.g. a CPU without the instructions it needs
            return None

    def lines(self, block: bytes) -> Iterator[tuple[int, int, int]]:
        for start, end in _lines_of_hits(block, self._db.ends(block)):
            yield start, end, 0


class _ScanPerThread:
    """A compiled hyperscan database scanned with a scratch space per thread: a scratch serves one scan at a time
    (hyperscan raises ScratchInUseError otherwise), and one gate may serve many threads (node agents sharing a rule
    set in one process)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._local = threading.local()

    def ends(self, block: bytes) -> list[int]:
        """Where every hit in `block` ends."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _hs.Scratch(self._db)
        ends: list[int] = []
        self._db.scan(block, match_event_handler=lambda _id, _start, end, _flags, _ctx: ends.append(end),
                      scratch=scratch)
        return ends


def _lines_of_hits(block: bytes, ends: list[int]) -> Iterator[tuple[int, int]]:
    """(start, newline) of each line of `block` holding a hit, once and in order, from where the hits end: a hit's
    last byte lies in its line (the newline, at most)."""
    line_end = -1
    for hit_end in sorted(ends):
        last = max(hit_end - 1, 0)
        if last <= line_end:
            continue
        line_end = block.find(b"\n", last)
        if line_end < 0:
            return
        yield block.rfind(b"\n", 0, last) + 1, line_end


def alternatives(patterns: Sequence[str]) -> str:
    """Patterns joined into one alternation that means what each meant: named groups become plain ones (a name may
    repeat across them) and a leading global flag such as (?i) is scoped to its own alternative."""
    parts = []
    for pattern in patterns:
        body = _unnamed(pattern)
        flags = re.match(r"\(\?([aiLmsux]+)\)", body)
        parts.append(f"(?{flags.group(1)}:{body[flags.end():]})" if flags else f"(?:{body})")
    return "|".join(parts)


def _unnamed(pattern: str) -> str:
    return re.sub(r"\(\?P<\w+>", "(?:", pattern)


def native_search_available() -> bool:
    """Whether gates can find literals in bytes blocks with hyperscan (installed and working here)."""
    return _NativeLiterals.build({("probe", False)}) is not None


class PrefilterLines:
    """The lines of a bytes block where any of some regexes may match: a superset the caller confirms line by line
    with the regexes themselves (over str). For patterns without a literal the gate can use (a tqdm bar's "%|").

    With hyperscan (installed and `native`), every pattern compiled in its prefilter mode, which approximates what
    it cannot run (lookbehinds) by something that matches more, at gigabytes a second; where it refuses a pattern,
    or is not installed, one bytes regex of all of them (MULTILINE) found with `finditer`, which is exact per line
    except for a match that would span a newline through a `\\s` (such a match counts for no line)."""

    def __init__(self, patterns: Sequence[str], *, native: bool = True) -> None:
        self.patterns = tuple(patterns)
        self._db = self._compile_native(self.patterns) if native and _hyperscan_imported else None
        joined = alternatives(self.patterns).encode("utf-8")
        self._regex = re.compile(joined, re.MULTILINE) if self.patterns else None

    @staticmethod
    def _compile_native(patterns: Sequence[str]) -> Any:
        expressions, flags = [], []
        for pattern in patterns:
            body = _unnamed(pattern)  # hyperscan has no named groups
            flag = _hs.HS_FLAG_PREFILTER
            lead = re.match(r"\(\?([aiLmsux]+)\)", body)
            if lead:
                if set(lead.group(1)) - {"i"}:
                    return None  # a flag hyperscan's prefilter would not honour: let the regex decide
                flag |= _hs.HS_FLAG_CASELESS
                body = body[lead.end():]
            expressions.append(body.encode("utf-8"))
            flags.append(flag)
        try:
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            db.compile(expressions=expressions, ids=list(range(len(expressions))), flags=flags)
        except _hs.error:
            return None
        return _ScanPerThread(db)

    @property
    def native(self) -> bool:
        return self._db is not None

    def lines(self, block: bytes) -> Iterator[tuple[int, int]]:
        """(start, end) of every line of `block` (which ends with a newline) where a pattern may match, in order;
        `end` is the offset of the line's newline."""
        if self._db is not None:
            yield from _lines_of_hits(block, self._db.ends(block))
        elif self._regex is not None:
            yield from _lines_of_hits(block, [m.end() for m in self._regex.finditer(block)])
