"""The lines of a log a reader would look at first, for the LLM when no rule explained the failure.

When no failure signature and no generic rule matched, the deterministic verdict has no deciding line, so the
evidence bundle would hold nothing from the logs and the LLM would be asked about an empty incident. This pass
picks, per log and in file order:

- the last lines of each Python traceback: its last frames and the exception line that ends it;
- lines with a failure word (error, fatal, killed, timeout, exception, refused, lost, died, no space, ...);
- the last lines of the log, before the process ended.

Each pick says why it was picked. Lines are scored (a traceback's end and the log's end first, then failure
words, later lines before earlier ones) and the best `limit` are returned in file order, so the bundle's budget
goes to what explains most. Pure: no I/O, no rules.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.line_shapes import body, unwrap

# Words that mark a line as a failure or its trace. Case-insensitive, whole words; counts like "errors: 0" are
# not skipped here (the LLM sees the line and judges), but a line with no such word is never picked for them.
FAILURE_WORDS = re.compile(
    r"(?i)\b(?:error|errors|fatal|killed|kill(?:ing)?|sigkill|sigterm|sigsegv|sigabrt|timeout|timed out|exception|"
    r"traceback|failed|failure|fail|abort(?:ed|ing)?|panic|refused|reset by peer|lost|dead|died|unreachable|"
    r"denied|no space|out of memory|oom|segmentation fault|core dumped|exit(?:ed)? (?:code|status)|exitcode|"
    r"terminated|crash(?:ed)?|preempt(?:ed|ion)?|unavailable|cannot|could not|unable to|invalid|xid|ecc)\b"
)
TRACEBACK_START = "Traceback (most recent call last)"
FRAME = re.compile(r"^\s*File \"[^\"\n]{1,400}\", line \d+")
LAST_LINES = 5
FRAMES_KEPT = 2  # a traceback's last frames: where it was raised, and what called it
MAX_TEXT = 400

SCORE_TAIL = 3.0
SCORE_TRACEBACK_END = 3.0
SCORE_FRAME = 2.0
SCORE_WORD = 1.0


@dataclass(frozen=True)
class SalientLine:
    line_no: int  # the log's own line number
    text: str
    why: str  # "traceback end", "last frame", "failure word", "end of log"
    score: float


def salient_lines(lines: Sequence[str], *, first_line_no: int = 1, limit: int = 25) -> list[SalientLine]:
    """The `limit` most telling lines of one log (see the module docstring), in file order."""
    picked: dict[int, SalientLine] = {}

    def pick(index: int, why: str, score: float) -> None:
        text = lines[index].strip()
        if not text:
            return
        # Later lines weigh a little more: the end of a log is nearer the failure than its start.
        score += index / max(1, len(lines))
        old = picked.get(index)
        if old is None or old.score < score:
            picked[index] = SalientLine(index + first_line_no, text[:MAX_TEXT], why, score)

    for index in _traceback_ends(lines):
        pick(index, "traceback end", SCORE_TRACEBACK_END)
        frames = [i for i in range(index - 1, max(-1, index - 40), -1) if FRAME.match(_body(lines[i]))][:FRAMES_KEPT]
        for frame in frames:
            pick(frame, "last frame", SCORE_FRAME)
            if frame + 1 < index and not FRAME.match(_body(lines[frame + 1])):
                pick(frame + 1, "last frame", SCORE_FRAME - 0.5)  # the frame's source line
    for index, text in enumerate(lines):
        if FAILURE_WORDS.search(text[:2000]):
            pick(index, "failure word", SCORE_WORD)
    tail = [i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()][:LAST_LINES]
    for index in tail:
        pick(index, "end of log", SCORE_TAIL)
    best = sorted(picked.values(), key=lambda s: -s.score)[:limit]
    return sorted(best, key=lambda s: s.line_no)


def _traceback_ends(lines: Sequence[str]) -> list[int]:
    """The index of the exception line that ends each traceback: the first line after its frames that is neither a
    frame, nor a frame's source line, nor blank."""
    ends: list[int] = []
    index = 0
    while index < len(lines):
        if TRACEBACK_START not in lines[index]:
            index += 1
            continue
        cursor = index + 1
        in_frames = False
        while cursor < len(lines):
            text = _body(lines[cursor])
            if FRAME.match(text):
                in_frames = True
            elif in_frames and text.startswith((" ", "\t")) or not text.strip():
                pass  # a frame's source line, a caret line, or a blank
            elif in_frames:
                ends.append(cursor)
                break
            cursor += 1
        index = cursor + 1 if cursor > index else index + 1
    return ends


def _body(text: str) -> str:
    """The line as the program printed it: a frame under Ray's "(TaskRunner pid=123, ip=10.0.0.1) ", a torchrun rank's
    "[rank3]:" or a container runtime's timestamp is a frame (core.line_shapes)."""
    return body(unwrap(text))
