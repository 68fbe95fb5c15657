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
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

# A collective or point-to-point call, in a library that does them: the frame a waiting rank is found in.
COLLECTIVE_CALLS = re.compile(
    r"^(?:all_reduce|allreduce|all_gather\w*|allgather\w*|reduce_scatter\w*|reducescatter\w*|broadcast\w*|"
    r"barrier|monitored_barrier|all_to_all\w*|alltoall\w*|reduce|gather\w*|scatter\w*|send|recv|isend|irecv|"
    r"wait|synchronize|batch_isend_irecv)$")
COLLECTIVE_LIBRARIES = re.compile(
    r"(?:^|/)(?:torch/distributed|torch/cuda/nccl|ray/util/collective|deepspeed/comm|megatron/core/parallel_state|"
    r"cupy/cuda/nccl|vllm/distributed|sglang/srt/distributed|nccl|gloo)")
# A host thread waiting for its GPU to finish what was queued on it: torch.cuda.synchronize and the stream and event
# waits beside it, CuPy's, JAX's block_until_ready. With NCCL (collectives run as GPU kernels, launched without
# waiting) this is where the ranks of a hung collective sit; beside ranks waiting in a collective on the host
# (gloo, a sync op) it is the rank whose GPU work does not finish.
GPU_WAIT_CALLS = re.compile(r"^(?:synchronize|block_until_ready)$")
GPU_WAIT_LIBRARIES = re.compile(r"(?:^|/)(?:torch/cuda/|cupy/|cupy_backends/|jax/|jaxlib/)")
_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<status>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")
# Silent work a rank may do for minutes while the others wait for it: no hang, as long as its stack shows it working.
# Each entry: the work's name, a pattern for the function's own name (the part after the last "."), and one for the
# library file it runs in. A folder of the job's own (".../rollout/worker.py") says nothing: a rank blocked on a lock
# in it is not at work, so files count only for the libraries that do the work.
WORK: tuple[tuple[str, re.Pattern[str], re.Pattern[str] | None], ...] = (
    ("saving a checkpoint", re.compile(r"(?i)^(?:_?save(?:_\w+)?|\w*checkpoint\w*|save_pretrained)$"),
     re.compile(r"(?:^|/)(?:torch/serialization\.py|torch/distributed/checkpoint/|safetensors/)")),
    ("loading data", re.compile(r"(?i)^(?:_next_data|load_dataset|\w*dataloader\w*)$"),
     re.compile(r"(?:^|/)(?:torch/utils/data/|datasets/)")),
    ("generating (rollout)", re.compile(r"(?i)^(?:generate\w*|generate_sequences)$"),
     re.compile(r"(?:^|/)(?:vllm|sglang)/")),
    ("evaluating", re.compile(r"(?i)^(?:_?evaluat\w*|_?validat\w*)$"), None),
    ("compiling", re.compile(r"^$"), re.compile(r"(?:^|/)(?:torch/_dynamo|torch/_inductor|triton/compiler)/")),
    ("copying files", re.compile(r"(?i)^upload\w*$"),
     re.compile(r"(?:^|/)(?:shutil\.py|boto\w*/|s3fs/|fsspec/)")),
)


def _work_of(frame: Frame) -> str | None:
    func = frame.func.rsplit(".", 1)[-1]
    for name, funcs, files in WORK:
        if funcs.search(func) or (files is not None and files.search(frame.file)):
            return name
    return None


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

    @property
    def gpu_wait(self) -> bool:
        return bool(GPU_WAIT_CALLS.match(self.func.rsplit(".", 1)[-1]) and GPU_WAIT_LIBRARIES.search(self.file))


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

    @cached_property
    def threads(self) -> list[Thread]:
        """The dump parsed once: where it is placed, what it is called and its signature all read it."""
        return parse_dump(self.dump)


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
    # "collective", "gpu_wait" (its host thread waits for its GPU, GPU_WAIT_CALLS), "working" (silent work, see WORK),
    # "elsewhere", "stopped", "unknown"
    kind: str
    frame: Frame | None = None
    busy: bool = False  # py-spy saw it running (active), not waiting
    note: str = ""

    @property
    def words(self) -> str:
        if self.kind == "collective" and self.frame:
            return f"waits in {self.frame.func.rsplit('.', 1)[-1]}"
        if self.kind == "gpu_wait" and self.frame:
            return f"waits for its GPU, in {self.frame.where}: work queued on the GPU does not finish"
        if self.kind == "stopped":
            return self.note
        if self.kind == "working" and self.frame:
            return f"is {self.note}, in {self.frame.where}"
        if self.kind == "elsewhere" and self.frame:
            return f"{'runs' if self.busy else 'is blocked'} outside the collective, in {self.frame.where}"
        return f"has no readable stack ({self.note})" if self.note else "has no readable stack"


def place_of(rank: RankStack) -> Place:
    threads = rank.threads
    # A stopped or dead process is where it is whatever its stack says. A process in D with a readable stack is
    # placed by its stack: a checkpoint save on a busy disk spends whole seconds in D, a state no stuck rank owns.
    if rank.state in STOPPED_STATES and (rank.state != "D" or not threads):
        return Place(rank, "stopped", note=STOPPED_STATES[rank.state])
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
    for frame in main.frames:
        work = _work_of(frame)
        if work is not None:
            return Place(rank, "working", frame, busy="active" in main.status, note=work)
    if innermost is not None and innermost.gpu_wait:  # "active" here is the CUDA runtime spinning, not work
        return Place(rank, "gpu_wait", innermost, busy=False)
    return Place(rank, "elsewhere", innermost, busy="active" in main.status)


def signature(rank: RankStack, *, lines: bool = True) -> tuple[tuple[str, str, int], ...]:
    """What a rank's main thread was doing, frame by frame: two samples alike mean it did not move. Without
    `lines`, only which functions: a rank looping inside one function (a spin) has not moved either."""
    threads = rank.threads
    main = next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)
    return tuple((f.func, f.file, f.line if lines else 0) for f in main.frames) if main else ()


@dataclass(frozen=True)
class Localization:
    culprits: tuple[Place, ...]
    waiting: tuple[Place, ...]
    places: tuple[Place, ...] = field(default_factory=tuple)
    sentence: str = ""

    def lines(self, limit: int = 8) -> list[str]:
        """Evidence lines: each odd rank where it is, then the waiting ranks as one line with a count."""
        out = [f"{who(p.rank)} {p.words}" for p in self.culprits[:limit]]
        if self.waiting:
            pids = ", ".join(str(p.rank.pid) for p in self.waiting[:limit] if p.rank.pid is not None)
            more = f" and {len(self.waiting) - limit} more" if len(self.waiting) > limit else ""
            nodes = ", ".join(sorted({p.rank.node for p in self.waiting if p.rank.node}))
            out.append(f"{len(self.waiting)} rank(s) wait in {_calls(self.waiting)} (pids {pids}{more}"
                       f"{'; nodes ' + nodes if nodes else ''})")
        if not out:
            out.append(self.sentence)
        return out

    def as_json(self) -> dict[str, object]:
        def one(p: Place) -> dict[str, object]:
            return {"rank": p.rank.label, "pid": p.rank.pid, "node": p.rank.node, "gpu": p.rank.gpu,
                    "state": p.rank.state, "where": p.kind, "frame": p.frame.where if p.frame else None,
                    "busy": p.busy, "words": p.words}
        return {"sentence": self.sentence, "culprits": [one(p) for p in self.culprits],
                "waiting": [one(p) for p in self.waiting], "ranks": [one(p) for p in self.places]}


def who(rank: RankStack) -> str:
    details = [f"pid {rank.pid}" if rank.pid is not None and f"pid {rank.pid}" not in rank.label else None,
               f"node {rank.node}" if rank.node else None, f"GPU {rank.gpu}" if rank.gpu else None,
               f"state {rank.state}" if rank.state and (rank.state not in STOPPED_STATES
                                                        or (rank.state == "D" and rank.threads)) else None]
    said = ", ".join(d for d in details if d)
    return f"{rank.label} ({said})" if said else rank.label


def _calls(places: Sequence[Place]) -> str:
    return ", ".join(sorted({p.frame.func.rsplit(".", 1)[-1] for p in places if p.frame}))


def localize(ranks: Sequence[RankStack]) -> Localization:
    """The odd ranks out of `ranks`, and one sentence saying who and where the others wait."""
    places = tuple(place_of(r) for r in ranks)
    in_collective = tuple(p for p in places if p.kind == "collective")
    on_gpu = tuple(p for p in places if p.kind == "gpu_wait")
    stopped = tuple(p for p in places if p.kind == "stopped")
    elsewhere = tuple(p for p in places if p.kind in ("elsewhere", "working"))
    unknown = tuple(p for p in places if p.kind == "unknown")
    # Ranks waiting for their GPU wait like those in a collective (an NCCL collective is a kernel on the GPU), unless
    # others wait in a collective on the host: then the GPU wait is what those wait for (its work does not finish).
    gpu_culprits = bool(in_collective and on_gpu and not stopped and not elsewhere)
    waiting = in_collective if gpu_culprits else in_collective + on_gpu
    if stopped:
        culprits = stopped
    elif waiting and elsewhere:
        culprits = elsewhere
    elif gpu_culprits:
        culprits = on_gpu
    elif waiting and unknown:
        culprits = unknown  # every readable rank waits: the one whose stack could not be read is the odd one
    else:
        culprits = ()
    if not places:
        sentence = "no rank's stack could be taken"
    elif culprits:
        others = "1 other rank waits" if len(waiting) == 1 else f"{len(waiting)} other ranks wait"
        rest = f"; {others} in {_calls(waiting)}" if waiting else ""
        sentence = "; ".join(f"{who(p.rank)} {p.words}" for p in culprits) + rest
    elif on_gpu and len(on_gpu) == len(places):
        sentence = (f"all {len(places)} ranks Argus could see wait for their GPUs (in {_calls(on_gpu)}): the work "
                    "queued there does not finish, an NCCL collective waiting for a rank or link not among them, or "
                    "a GPU fault")
    elif waiting and len(waiting) == len(places):
        sentence = (f"all {len(places)} ranks Argus could see wait in {_calls(waiting)}: the rank holding them up "
                    "is not among them (another node, or the network)")
    else:
        sentence = "no rank stands out: " + "; ".join(f"{who(p.rank)} {p.words}" for p in places[:8])
    return Localization(culprits, waiting, places, sentence)


def ranks_of(processes: Sequence[dict[str, Any]]) -> list[RankStack]:
    """The ranks among a job's processes (collectors.rank_stacks.ProcessStack attrs): the actors of one class (a
    job's ranks share their worker class), the class some of whose actors wait in a collective, else the most
    numerous. The driver and helper actors of other classes are not ranks: a driver waiting on ray.get is never a
    culprit. A job with no actors (a driver that runs the work itself, or torchrun under it) is its driver."""
    by_class: dict[str, list[RankStack]] = {}
    for p in processes:
        label, pid = str(p.get("label") or "process"), p.get("pid")
        raw = p.get("dump")
        dump = raw if isinstance(raw, str) else str(p.get("error") or "no stack")
        gpu = p.get("gpu")
        rank = RankStack(f"{label} pid {pid}", pid if isinstance(pid, int) else None,
                         p.get("node_ip") or p.get("node_id"), dump, state=p.get("state") or None,
                         gpu=str(gpu) if gpu else None)
        by_class.setdefault(label, []).append(rank)
    actors = {c: r for c, r in by_class.items() if c != "driver"} or by_class
    if not actors:
        return []
    waiting = [c for c, ranks in actors.items() if any(place_of(r).kind == "collective" for r in ranks)]
    return actors[waiting[0] if waiting else max(actors, key=lambda c: len(actors[c]))]


@dataclass(frozen=True)
class HangCall:
    """What two stack samples a few seconds apart say of a job that stopped making progress.

    verdict: "hung" (confirmed: ranks wait in a collective and none moved, or a rank is stopped), "working" (a rank
    does known silent work: not a hang while it lasts), "busy" (a rank runs outside the collective and its stack
    moved: maybe work Argus does not know, so the stall is judged by silence alone), "unknown" (no rank waits in a
    collective, or no stack could be read: the stacks cannot tell)."""

    verdict: str
    localization: Localization
    why: str


def judge(first: Sequence[RankStack], second: Sequence[RankStack], previous: HangCall | None = None) -> HangCall:
    """The verdict of two samples of the same ranks (`second` the later), and where each rank is in the later.
    `previous`: the call on the samples before these, in the same silence (what a rank was doing before)."""
    found = localize(second)
    before = {r.pid: r for r in first if r.pid is not None}

    def earlier_of(place: Place) -> RankStack | None:
        return before.get(place.rank.pid) if place.rank.pid is not None else None

    def moved(place: Place, lines: bool) -> bool:
        earlier = earlier_of(place)
        return earlier is not None and signature(earlier, lines=lines) != signature(place.rank, lines=lines)
    working = [p for p in found.places if p.kind == "working"]
    if working:
        return HangCall("working", found, "; ".join(f"{who(p.rank)} {p.words}" for p in working[:4]))
    # A rank in D with no readable stack (py-spy cannot attach while it sleeps in the kernel) that was at silent work
    # in the sample or the call before is still at it: the work's own I/O.
    at_work = {p.rank.pid: p.note for p in _places_at_work(first, previous)}
    writing = [p for p in found.culprits if p.rank.state == "D" and p.kind == "stopped" and p.rank.pid in at_work]
    if writing and len(writing) == len(found.culprits):
        return HangCall("working", found, "; ".join(
            f"{who(p.rank)} is in uninterruptible sleep (I/O) while {at_work[p.rank.pid]}" for p in writing[:4]))
    readable = [p for p in found.places if p.kind != "unknown"]
    if not readable and not any(p.kind == "unknown" and "suspend" in p.note for p in found.places):
        return HangCall("unknown", found, "no rank's stack could be read")
    # A rank in uninterruptible sleep in one sample only is doing I/O, not stuck in it.
    passing = [p for p in found.culprits if p.rank.state == "D" and (e := earlier_of(p)) is not None
               and e.state != "D"]
    if passing:
        return HangCall("busy", found, f"{who(passing[0].rank)} is in uninterruptible sleep (I/O) in one sample only")
    if any(p.kind == "stopped" for p in found.culprits):
        return HangCall("hung", found, found.sentence)
    if not found.waiting:
        return HangCall("unknown", found, "no rank waits in a collective")
    # A rank outside the collective that went from one function to another is doing something; one that stayed
    # in one function (blocked, or spinning in a loop) while the others waited the whole gap is what they wait for.
    running = [p for p in found.culprits if p.kind == "elsewhere" and moved(p, lines=False)]
    if running:
        return HangCall("busy", found, f"{who(running[0].rank)} runs outside the collective and its stack moved "
                        f"between the samples ({running[0].words})")
    # Ranks all in a collective but not the same line twice: a job training without printing, not one hung.
    if not found.culprits and any(moved(p, lines=True) for p in found.waiting):
        return HangCall("busy", found, "the ranks wait in collectives but their stacks moved between the samples")
    return HangCall("hung", found, found.sentence)


def _places_at_work(first: Sequence[RankStack], previous: HangCall | None) -> list[Place]:
    """The ranks seen at silent work in the earlier sample, or by the call before."""
    places = [place_of(r) for r in first]
    if previous is not None:
        places += list(previous.localization.places)
    return [p for p in places if p.kind == "working" and p.rank.pid is not None]
