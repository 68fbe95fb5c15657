"""Which rank holds a hang up, as the report says it: one sentence from the ranks' stacks, and their lines behind it.

The stacks were read once already (detectors/hang_stacks.py `localize`): by the stall detector when it confirms a
hang from stack samples (its finding's `attrs["localization"]`, that `as_json()`), or by the keep_scene step (the
scene's `stacks/localization.json`, and the sentence in its outcome's `stacks`). The finding is preferred: it is
what confirmed the hang. Rules decide this fact: the report's root cause states it whatever an LLM writes (an LLM's
prose that does not name the culprit gets the sentence put before it), and the stack lines are evidence lines the
LLM may cite, so restating the pid, node or frame is grounded (rca/grounding.py).

The sentence names the culprit's rank, pid, node, GPU and process state where known, where its stack is (its
frame), the job's last step where a finding logged one, and what the other ranks wait in; where no rank stands
out it says so (every rank waits: the cause is outside these processes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.types import Action, Category, Finding
from detectors.stall import DEFAULT_PATTERNS as PROGRESS_PATTERNS

KEEP_SCENE = "keep_scene"
LOCALIZATION_FILE = "stacks/localization.json"
MAX_FILE_BYTES = 256 * 1024
MAX_CULPRITS = 3  # named in the sentence; more are counted
MAX_WAITING_NAMED = 3  # waiting ranks named one by one; more are counted
MAX_LINES = 6  # stack lines given as evidence
STACK_SOURCE = "py-spy"
_STEP_KEYS = ("last_step", "step")


@dataclass(frozen=True)
class Hang:
    """What the ranks' stacks say of one hang. `sentence`: the report's words; `lines`: (source, text) evidence lines
    of the ranks' places, the culprits first; `origin`: "finding" (the stall detector's) or "scene" (keep_scene's)."""

    sentence: str
    lines: tuple[tuple[str, str], ...] = ()
    origin: str = "finding"
    culprits: tuple[Mapping[str, Any], ...] = ()
    waiting: tuple[Mapping[str, Any], ...] = ()
    step: int | None = None
    confirmed_by: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def named_in(self, text: str) -> bool:
        """Whether `text` names every culprit (by its pid or its rank label); False where no culprit is known."""
        if not self.culprits:
            return False
        lower = text.lower()
        for c in self.culprits:
            pid, label = c.get("pid"), str(c.get("rank") or "").strip().lower()
            if not ((pid is not None and re.search(rf"(?<!\d){re.escape(str(pid))}(?!\d)", text))
                    or (label and label in lower)):
                return False
        return True

    def first_in(self, prose: str) -> str:
        """`prose` stating the culprit: as it is where it names every culprit, else after this sentence."""
        if self.sentence in prose or self.named_in(prose):
            return prose
        return f"{self.sentence} {prose}".strip() if prose.strip() else self.sentence

    def redacted(self, redact: Callable[[str], str]) -> Hang:
        def clean(places: tuple[Mapping[str, Any], ...]) -> tuple[Mapping[str, Any], ...]:
            return tuple({k: redact(v) if isinstance(v, str) else v for k, v in p.items()} for p in places)

        return replace(self, sentence=redact(self.sentence), lines=tuple((s, redact(t)) for s, t in self.lines),
                       culprits=clean(self.culprits), waiting=clean(self.waiting))

    def as_dict(self) -> dict[str, Any]:
        return {"sentence": self.sentence, "from": self.origin, "confirmed_by": self.confirmed_by, "step": self.step,
                "culprits": [dict(c) for c in self.culprits], "waiting": [dict(w) for w in self.waiting], **self.extra}


def hang_of(findings: Sequence[Finding], actions: Sequence[Action] = ()) -> Hang | None:
    """What the stacks say of the hang in `findings`: a finding's localisation (the newest), else the keep_scene
    step's; None where neither read any stack."""
    step = step_of(findings)
    for f in reversed(findings):
        loc = f.attrs.get("localization")
        if isinstance(loc, Mapping) and (loc.get("ranks") or loc.get("culprits")):  # no stack taken: nothing said
            said = [(e.source, e.text) for e in f.evidence if e.source == STACK_SOURCE and e.text]
            confirmed = f.attrs.get("confirmed_by")
            return _from_localization(loc, step, origin="finding", said=said,
                                      confirmed_by=str(confirmed) if confirmed else None)
    for a in reversed(actions):
        if a.kind != KEEP_SCENE or not isinstance(a.result, Mapping):
            continue
        for folder in a.result.get("folders") or ():
            loc = _read_json(Path(str(folder)) / LOCALIZATION_FILE)
            if isinstance(loc, Mapping) and (loc.get("ranks") or loc.get("culprits")):
                hang = _from_localization(loc, step, origin="scene", source=LOCALIZATION_FILE)
                return replace(hang, extra={"scene": str(folder)})
        stacks = [str(s) for s in a.result.get("stacks") or () if s]
        if stacks:  # the scene's file cannot be read here: its step's own words
            told = "; ".join(stacks)[:600]
            return Hang(sentence=f"The ranks' stacks (kept with the scene) say: {_end(told)}", origin="scene",
                        lines=tuple(("keep_scene", s[:400]) for s in stacks[:MAX_LINES]), step=step)
    return None


def step_of(findings: Sequence[Finding]) -> int | None:
    """The job's last step a hang finding saw: its attrs' step, else the step in its last progress line."""
    for f in reversed(findings):
        if f.category is not Category.NCCL_HANG:
            continue
        for key in _STEP_KEYS:
            value = f.attrs.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                return int(value)
        line = f.attrs.get("last_progress_line")
        if isinstance(line, str) and line:
            for p in PROGRESS_PATTERNS:
                if p.name == "hf_epoch":  # an epoch, not a step
                    continue
                m = p.regex.search(line[:8192])
                if m and m.groupdict().get("step"):
                    return int(float(m.group("step")))
    return None


def _from_localization(loc: Mapping[str, Any], step: int | None, *, origin: str, source: str = STACK_SOURCE,
                       said: Sequence[tuple[str, str]] = (), confirmed_by: str | None = None) -> Hang:
    culprits = tuple(p for p in loc.get("culprits") or () if isinstance(p, Mapping))
    waiting = tuple(p for p in loc.get("waiting") or () if isinstance(p, Mapping))
    if culprits:
        named = "; ".join(f"{_who(p)} {_doing(p)}" for p in culprits[:MAX_CULPRITS])
        if step is not None:
            named += f", at step {step}"
        if len(culprits) > MAX_CULPRITS:
            named += f"; {len(culprits) - MAX_CULPRITS} more ranks stand out as well"
        rest = _waiting(waiting)
        # Stacks that did not confirm the hang (it was called on silence) show whom the others wait for, no more.
        noun = ("culprit" if len(culprits) == 1 else "culprits") if confirmed_by != "silence" else \
            ("rank the others wait for" if len(culprits) == 1 else "ranks the others wait for")
        sentence = f"The ranks' stacks show the {noun}: {named}" + (f"; {rest}" if rest else "") + "."
    else:
        why = str(loc.get("sentence") or "no rank's stack could be read")
        at = f" (the job's last step: {step})" if step is not None else ""
        sentence = f"The ranks' stacks single out no rank: {_end(why + at)}"
    lines = _lines(culprits, waiting, said, source)
    return Hang(sentence=sentence, lines=lines, origin=origin, culprits=culprits, waiting=waiting, step=step,
                confirmed_by=confirmed_by)


def _lines(culprits: Sequence[Mapping[str, Any]], waiting: Sequence[Mapping[str, Any]],
           said: Sequence[tuple[str, str]], source: str) -> tuple[tuple[str, str], ...]:
    """The evidence lines: the finding's own stack lines (the culprits' first), else one per place."""
    if said:
        def culprit_first(item: tuple[str, str]) -> bool:
            return not any(_mentions(item[1], c) for c in culprits)
        return tuple(sorted(said, key=culprit_first)[:MAX_LINES])
    places = [*culprits[:MAX_CULPRITS], *waiting][:MAX_LINES]
    return tuple((source, f"{_who(p)} {_doing(p)}") for p in places)


def _mentions(text: str, place: Mapping[str, Any]) -> bool:
    pid, label = place.get("pid"), str(place.get("rank") or "")
    return bool((pid is not None and re.search(rf"(?<!\d){re.escape(str(pid))}(?!\d)", text))
                or (label and label in text))


def _who(p: Mapping[str, Any]) -> str:
    """"Rank pid 4242 (node 10.0.0.7, GPU 1, state S)": the rank's label and what is known of where it runs."""
    label = str(p.get("rank") or "a rank")
    pid, node, gpu, state = p.get("pid"), p.get("node"), p.get("gpu"), p.get("state")
    stopped = p.get("where") == "stopped"
    details = [f"pid {pid}" if pid is not None and not re.search(rf"(?<!\d){re.escape(str(pid))}(?!\d)", label)
               else None, f"node {node}" if node else None, f"GPU {gpu}" if gpu not in (None, "") else None,
               f"state {state}" if state and not stopped else None]
    shown = ", ".join(d for d in details if d)
    return f"{label} ({shown})" if shown else label


def _doing(p: Mapping[str, Any]) -> str:
    """What the rank does, in detectors/hang_stacks.py's words ("is blocked outside the collective, in f (a.py:3)")."""
    words, frame = str(p.get("words") or "").strip(), p.get("frame")
    if frame and p.get("where") == "collective":
        return f"waits in {frame}"
    if not words:
        words = f"is in {frame}" if frame else "has no readable stack"
    elif p.get("where") == "stopped":
        words = f"is {words}"
    if frame and str(frame) not in words:
        words += f", in {frame}"
    return words


def _waiting(waiting: Sequence[Mapping[str, Any]]) -> str:
    if not waiting:
        return ""
    calls = sorted({_call(p) for p in waiting} - {""})
    where = f" in {', '.join(calls)}" if calls else " in a collective"
    if len(waiting) <= MAX_WAITING_NAMED:
        names = " and ".join(_who(p) for p in waiting)
        return f"{names} {'waits' if len(waiting) == 1 else 'wait'}{where}"
    return f"the {len(waiting)} other ranks wait{where}"


def _call(p: Mapping[str, Any]) -> str:
    words = str(p.get("words") or "")
    if words.startswith("waits in "):
        return words[len("waits in "):]
    frame = str(p.get("frame") or "")
    return frame.split(" (", 1)[0].rsplit(".", 1)[-1] if frame else ""


def _end(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _read_json(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
