"""Which rank holds a hang up, from the stacks of every rank: the stuck rank is the odd one out.

In a hung collective every rank but the culprit waits in the same collective call (all_reduce, barrier, ...);
the culprit is elsewhere: stopped (state T), in uninterruptible sleep (D), busy in Python outside the collective
(a spin, a dataloader, a checkpoint save), or blocked on something else (a lock, a queue). Stacks are py-spy's
`dump` text (what Ray's dashboard returns for a worker); a dump py-spy could not take is evidence too (it cannot
suspend a stopped process). Collective calls are known by name and by library (COLLECTIVE_*), not by job.

Outcomes as values: `localize` returns what it found, with the one sentence a report gives, and says plainly
when nothing stands out (every rank waits: the cause is outside these processes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# A collective or point-to-point call, in a library that does them: the frame a waiting rank is found in.
COLLECTIVE_CALLS = re.compile(
    r"^(?:all_reduce|allreduce|all_gather\w*|allgather\w*|reduce_scatter\w*|reducescatter\w*|broadcast\w*|"
    r"barrier|monitored_barrier|all_to_all\w*|alltoall\w*|reduce|gather\w*|scatter\w*|send|recv|isend|irecv|"
    r"wait|synchronize|batch_isend_irecv)$")
COLLECTIVE_LIBRARIES = re.compile(
    r"(?:^|/)(?:torch/distributed|torch/cuda/nccl|ray/util/collective|deepspeed/comm|megatron/core/parallel_state|"
    r"cupy/cuda/nccl|vllm/distributed|sglang/srt/distributed|nccl|gloo)")
_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<status>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")
STOPPED_STATES = {"T": "stopped (state T)", "t": "stopped by a tracer (state t)", "D": "in uninterruptible sleep "
                  "(state D, usually I/O or a driver call)", "Z": "a zombie (state Z)"}


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.func} ({PurePosixPath(self.file).name}:{self.line})"

    @property
    def collective(self) -> bool:
        return bool(COLLECTIVE_CALLS.match(self.func.rsplit(".", 1)[-1]) and COLLECTIVE_LIBRARIES.search(self.file))


@dataclass(frozen=True)
class Thread:
    name: str
    status: str  # py-spy's: idle, active, active+gil, ...
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankStack:
    """One rank's process as seen when the scene was kept."""

    label: str  # e.g. "Rank pid 4242"
    pid: int | None
    node: str | None  # IP or node id
    dump: str  # py-spy dump's text, or what went wrong getting it
    state: str | None = None  # /proc state letter, where known
    gpu: str | None = None


def parse_dump(text: str) -> list[Thread]:
    """The threads of a py-spy dump, frames innermost first; [] for text that is not one."""
    threads: list[Thread] = []
    current: tuple[str, str, list[Frame]] | None = None
    for line in text.splitlines()[:5000]:
        if m := _THREAD.match(line):
            if current:
                threads.append(Thread(current[0], current[1], tuple(current[2])))
            current = (m["name"] or m["tid"], m["status"], [])
        elif current is not None and (f := _FRAME.match(line)):
            current[2].append(Frame(f["func"], f["file"], int(f["line"])))
    if current:
        threads.append(Thread(current[0], current[1], tuple(current[2])))
    return threads


@dataclass(frozen=True)
class Place:
    """Where one rank is: in a collective (and which), elsewhere in Python (and where), or not known."""

    rank: RankStack
    kind: str  # "collective", "elsewhere", "stopped", "unknown"
    frame: Frame | None = None
    busy: bool = False  # py-spy saw it running (active), not waiting
    note: str = ""

    @property
    def words(self) -> str:
        if self.kind == "collective" and self.frame:
            return f"waits in {self.frame.func.rsplit('.', 1)[-1]}"
        if self.kind == "stopped":
            return self.note
        if self.kind == "elsewhere" and self.frame:
            return f"{'runs' if self.busy else 'is blocked'} outside the collective, in {self.frame.where}"
        return f"has no readable stack ({self.note})" if self.note else "has no readable stack"


def place_of(rank: RankStack) -> Place:
    if rank.state in STOPPED_STATES:
        return Place(rank, "stopped", note=STOPPED_STATES[rank.state])
    threads = parse_dump(rank.dump)
    if not threads:
        first = next((line.strip() for line in rank.dump.splitlines() if line.strip().startswith(("Error", "0:"))),
                     rank.dump.strip().splitlines()[0] if rank.dump.strip() else "empty")
        note = first[:160]
        if "suspend" in rank.dump.lower():  # py-spy cannot suspend a process that is already stopped
            return Place(rank, "unknown", note=f"{note}: py-spy could not suspend it, as with a stopped process")
        return Place(rank, "unknown", note=note)
    main = next((t for t in threads if t.name == "MainThread"), threads[0])
    collective = next((f for t in threads for f in t.frames if f.collective), None)
    if collective is not None:
        return Place(rank, "collective", collective)
    innermost = main.frames[0] if main.frames else None
    return Place(rank, "elsewhere", innermost, busy="active" in main.status)


@dataclass(frozen=True)
class Localization:
    culprits: tuple[Place, ...]
    waiting: tuple[Place, ...]
    places: tuple[Place, ...] = field(default_factory=tuple)
    sentence: str = ""

    def as_json(self) -> dict[str, object]:
        def one(p: Place) -> dict[str, object]:
            return {"rank": p.rank.label, "pid": p.rank.pid, "node": p.rank.node, "gpu": p.rank.gpu,
                    "state": p.rank.state, "where": p.kind, "frame": p.frame.where if p.frame else None,
                    "busy": p.busy, "words": p.words}
        return {"sentence": self.sentence, "culprits": [one(p) for p in self.culprits],
                "waiting": [one(p) for p in self.waiting], "ranks": [one(p) for p in self.places]}


def _who(rank: RankStack) -> str:
    details = [f"pid {rank.pid}" if rank.pid is not None and f"pid {rank.pid}" not in rank.label else None,
               f"node {rank.node}" if rank.node else None, f"GPU {rank.gpu}" if rank.gpu else None]
    said = ", ".join(d for d in details if d)
    return f"{rank.label} ({said})" if said else rank.label


def _calls(places: Sequence[Place]) -> str:
    return ", ".join(sorted({p.frame.func.rsplit(".", 1)[-1] for p in places if p.frame}))


def localize(ranks: Sequence[RankStack]) -> Localization:
    """The odd ranks out of `ranks`, and one sentence saying who and where the others wait."""
    places = tuple(place_of(r) for r in ranks)
    waiting = tuple(p for p in places if p.kind == "collective")
    stopped = tuple(p for p in places if p.kind == "stopped")
    elsewhere = tuple(p for p in places if p.kind == "elsewhere")
    unknown = tuple(p for p in places if p.kind == "unknown")
    if stopped:
        culprits = stopped
    elif waiting and elsewhere:
        culprits = elsewhere
    elif waiting and unknown:
        culprits = unknown  # every readable rank waits: the one whose stack could not be read is the odd one
    else:
        culprits = ()
    if not places:
        sentence = "no rank's stack could be taken"
    elif culprits:
        others = "1 other rank waits" if len(waiting) == 1 else f"{len(waiting)} other ranks wait"
        rest = f"; {others} in {_calls(waiting)}" if waiting else ""
        sentence = "; ".join(f"{_who(p.rank)} {p.words}" for p in culprits) + rest
    elif waiting and len(waiting) == len(places):
        sentence = (f"all {len(places)} ranks Argus could see wait in {_calls(waiting)}: the rank holding them up "
                    "is not among them (another node, or the network)")
    else:
        sentence = "no rank stands out: " + "; ".join(f"{_who(p.rank)} {p.words}" for p in places[:8])
    return Localization(culprits, waiting, places, sentence)
