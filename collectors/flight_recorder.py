"""PyTorch's flight recorder dumps of a job's ranks, for the scene of a hang: what each rank's communicator last did.

A job turns the recorder on with TORCH_FR_BUFFER_SIZE (older name TORCH_NCCL_TRACE_BUFFER_SIZE) above 0. When a
collective times out, PyTorch's watchdog writes every rank's ring of recent collectives to `<prefix><rank>` on the
rank's node: prefix TORCH_FR_DUMP_TEMP_FILE (older TORCH_NCCL_DEBUG_INFO_TEMP_FILE), default /tmp/nccl_trace_rank_.
Argus reads those variables from each rank process's own environment (/proc/<pid>/environ, on this host or over
`remote` on the rank's node), else from the job's runtime_env, and copies the dumps written since the job started.
A dump is a pickle of plain dicts and lists; it is read with an unpickler that refuses every class, so a file on a
node can never run code here. What it says is summed up per rank: the last collective it entered (sequence number,
operation, state); a rank behind the others is the one they wait for. The files are kept as they are, for
`python -m torch.distributed.flight_recorder.fr_trace <folder>` (PyTorch's own analyser).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import pickle
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from collectors.rank_stacks import is_local_address, local_addresses

DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
MAX_FILE_BYTES = 32 * 1024 * 1024  # a dump of 2,000 entries with stacks is a few MB
MAX_FILES = 64  # per prefix and node: a prefix like "/tmp/" must not copy a whole folder
_RANK_SUFFIX = re.compile(r"(\d+)$")

# Runs argv on the node at `ip` and returns its stdout, or None when it could not (not reachable, failed).
NodeCommand = Callable[[str, Sequence[str]], str | None]


@dataclass(frozen=True)
class Recorder:
    """A process's flight recorder: on when `buffer` > 0; dumps go to `prefix` + rank."""

    buffer: int
    prefix: str
    source: str  # where the settings were read: "process environment" or "job runtime_env"


def recorder_of(env: Mapping[str, str], source: str) -> Recorder | None:
    """The recorder the variables in `env` turn on, or None when they leave it off."""
    raw = next((env[v] for v in BUFFER_VARS if env.get(v)), "0")
    try:
        buffer = int(raw.strip())
    except ValueError:
        return None
    if buffer <= 0:
        return None
    prefix = next((env[v] for v in PREFIX_VARS if env.get(v)), DEFAULT_PREFIX)
    if not prefix.startswith("/") or prefix.endswith("/"):
        return None  # a relative or folder prefix names no place Argus can look in
    return Recorder(buffer, prefix, source)


@dataclass(frozen=True)
class RankDump:
    """One dump file, copied (`data`) or not (`error` says why), and what it says."""

    node_ip: str
    path: str
    size: int
    mtime: float
    data: bytes | None = None
    error: str | None = None
    rank: int | None = None  # from the file name's suffix (<prefix><rank>)
    last_seq: int | None = None  # the highest collective sequence number the rank entered
    last_op: str | None = None  # that entry's profiling name, e.g. "nccl:all_reduce"
    last_state: str | None = None  # scheduled, started or completed
    entries: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node_ip, "path": self.path, "size": self.size,
                "mtime": datetime.fromtimestamp(self.mtime, timezone.utc).isoformat(), "rank": self.rank,
                "entries": self.entries, "last_seq": self.last_seq, "last_op": self.last_op,
                "last_state": self.last_state, "error": self.error}


@dataclass(frozen=True)
class FlightRecords:
    """What the job's ranks' recorders left: their settings per node and the dumps found."""

    recorders: dict[str, Recorder] = field(default_factory=dict)  # node IP -> its ranks' recorder
    dumps: tuple[RankDump, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.recorders)

    def sentence(self) -> str:
        """What the dumps say of who is behind, in one sentence ('' when there is nothing to say)."""
        read = [d for d in self.dumps if d.last_seq is not None]
        if not read:
            if self.enabled and not self.dumps:
                return ("flight recorder on, but no rank has dumped it yet (PyTorch writes it when a collective "
                        "times out)")
            return ""
        ahead = max(d.last_seq or 0 for d in read)
        front = [d for d in read if d.last_seq == ahead]
        behind = sorted((d for d in read if d.last_seq != ahead), key=lambda d: (d.last_seq or 0, d.rank or 0))
        at_front = f"{_ranks(front)} at #{ahead} ({_ops(front)})"
        if not behind:
            return f"flight recorder: the last collective entered is the same for every dump: {at_front}"
        lag = "; ".join(f"{_ranks([d])} last entered collective #{d.last_seq} ({_ops([d])})" for d in behind[:4])
        return f"flight recorder: {lag}, behind {at_front}"

    def as_json(self) -> dict[str, Any]:
        return {
            "recorders": {ip: {"buffer": r.buffer, "prefix": r.prefix, "source": r.source}
                          for ip, r in sorted(self.recorders.items())},
            "dumps": [d.as_json() for d in self.dumps],
            "sentence": self.sentence(),
            "problems": list(self.problems),
            "analyse": "python -m torch.distributed.flight_recorder.fr_trace <this folder's node folder> "
                       "--prefix <the dump prefix's file name>",
        }


def _ranks(dumps: Sequence[RankDump]) -> str:
    ranks = sorted(d.rank for d in dumps if d.rank is not None)
    if not ranks:
        return f"{len(dumps)} dump(s)"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _ops(dumps: Sequence[RankDump]) -> str:
    return ", ".join(sorted({f"{d.last_op or '?'}, {d.last_state or '?'}" for d in dumps}))


class _PlainUnpickler(pickle.Unpickler):
    """Loads only what a flight recorder dump holds (dicts, lists, strings, numbers): any class is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump holds no objects, found {module}.{name}")


def summarize(data: bytes) -> dict[str, Any]:
    """The entries count and the last collective of one dump; ValueError when it is not a dump."""
    try:
        loaded = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a dump we can read"
        raise ValueError(f"not a flight recorder dump: {exc}") from None
    entries = loaded.get("entries") if isinstance(loaded, dict) else None
    if not isinstance(entries, list):
        raise ValueError("not a flight recorder dump: no 'entries' list")
    collectives = [e for e in entries if isinstance(e, dict) and isinstance(e.get("collective_seq_id"), int)
                   and not e.get("is_p2p")]
    if not collectives:
        return {"entries": len(entries), "last_seq": None, "last_op": None, "last_state": None}
    last = max(collectives, key=lambda e: (e["collective_seq_id"], e.get("record_id") or 0))
    return {"entries": len(entries), "last_seq": last["collective_seq_id"], "last_op": str(last.get("profiling_name")),
            "last_state": str(last.get("state"))}


class FlightRecorderReader:
    """Finds and copies the flight recorder dumps of a job's processes (see the module's doc)."""

    def __init__(self, remote: NodeCommand | None = None, *, proc: Path = Path("/proc"),
                 max_file_bytes: int = MAX_FILE_BYTES, max_files: int = MAX_FILES) -> None:
        self._remote = remote
        self._proc = proc
        self._local = local_addresses()
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files

    def read(self, processes: Iterable[tuple[int, str | None]], *, job_env: Mapping[str, str] | None = None,
             since: datetime | None = None) -> FlightRecords:
        """`processes`: (pid, node IP) of the job's ranks. `job_env`: the job's runtime_env variables, for a
        process whose environment cannot be read. `since`: dumps older than this (another job's) are left."""
        recorders: dict[str, Recorder] = {}
        problems: list[str] = []
        for pid, ip in processes:
            if ip is None or ip in recorders:
                continue
            env = self._environment(ip, pid)
            found = recorder_of(env, "process environment") if env is not None else None
            if found is None and env is None and job_env:
                found = recorder_of(job_env, "job runtime_env")
            if found is not None:
                recorders[ip] = found
        dumps: list[RankDump] = []
        seen: set[tuple[str, str]] = set()
        copied: set[tuple[str, str]] = set()
        cutoff = since.timestamp() if since is not None else None
        for ip, recorder in sorted(recorders.items()):
            # Nodes on this host share its files; every node sees a prefix on shared storage: each place is read once.
            place = ("this host" if self._is_local(ip) else ip, recorder.prefix)
            if place in seen:
                continue
            seen.add(place)
            listed = self._list(ip, recorder.prefix)
            if listed is None:
                problems.append(f"flight recorder dumps on {ip}: cannot list {recorder.prefix}* (no access)")
                continue
            for size, mtime, path in listed[: self.max_files]:
                if cutoff is not None and mtime < cutoff:
                    continue
                dump = self._copy(ip, path, size, mtime, recorder.prefix)
                same = (path, hashlib.sha256(dump.data).hexdigest() if dump.data is not None else f"{size}:{mtime}")
                if same not in copied:
                    copied.add(same)
                    dumps.append(dump)
            if len(listed) > self.max_files:
                problems.append(f"flight recorder dumps on {ip}: {len(listed)} files match {recorder.prefix}*, "
                                f"the first {self.max_files} kept")
        return FlightRecords(recorders, tuple(dumps), tuple(problems))

    # -- one node ------------------------------------------------------------------------------------------

    def _is_local(self, ip: str) -> bool:
        return is_local_address(ip, self._local)

    def _environment(self, ip: str, pid: int) -> dict[str, str] | None:
        """The TORCH_* variables of a process, or None when its environment cannot be read."""
        raw: str | None
        if self._is_local(ip):
            try:
                raw = (self._proc / str(pid) / "environ").read_bytes().decode("utf-8", "replace").replace("\0", "\n")
            except OSError:
                return None
        elif self._remote is not None:
            raw = self._remote(ip, ["sh", "-c", 'tr "\\000" "\\n" < "/proc/$1/environ"', "sh", str(int(pid))])
        else:
            return None
        if raw is None:
            return None
        env: dict[str, str] = {}
        for line in raw.splitlines():
            name, sep, value = line.partition("=")
            if sep and name.startswith("TORCH_"):
                env[name] = value
        return env

    def _list(self, ip: str, prefix: str) -> list[tuple[int, float, str]] | None:
        """(size, mtime, path) of the regular files named `prefix`*, newest last; None when it cannot look."""
        folder, stem = Path(prefix).parent, Path(prefix).name
        if self._is_local(ip):
            try:
                found = [(st.st_size, st.st_mtime, str(p)) for p in folder.iterdir()
                         if p.name.startswith(stem) and p.is_file() and not p.is_symlink() and (st := p.stat())]
            except OSError:
                return None if not folder.exists() else []
            return sorted(found, key=lambda f: f[1])
        if self._remote is None:
            return None
        script = 'for f in "$1"*; do if [ -f "$f" ] && [ ! -L "$f" ]; then stat -c "%s %Y %n" -- "$f"; fi; done; true'
        out = self._remote(ip, ["sh", "-c", script, "sh", prefix])
        if out is None:
            return None
        found = []
        for line in out.splitlines():
            size, _, rest = line.partition(" ")
            mtime, _, path = rest.partition(" ")
            if size.isdigit() and mtime.isdigit() and path.startswith(prefix):
                found.append((int(size), float(mtime), path))
        return sorted(found, key=lambda f: f[1])

    def _copy(self, ip: str, path: str, size: int, mtime: float, prefix: str) -> RankDump:
        suffix = _RANK_SUFFIX.search(path[len(prefix):]) if path.startswith(prefix) else None
        rank = int(suffix.group(1)) if suffix else None
        base = RankDump(ip, path, size, mtime, rank=rank)
        if size > self.max_file_bytes:
            return replace(base, error=f"{size} bytes, over the {self.max_file_bytes} kept: left on the node")
        try:
            data = self._fetch(ip, path)
        except ValueError as exc:
            return replace(base, error=str(exc))
        if data is None:
            return replace(base, error="could not be read")
        try:
            said = summarize(data)
        except ValueError as exc:
            return replace(base, data=data, error=str(exc))
        return replace(base, data=data, **said)

    def _fetch(self, ip: str, path: str) -> bytes | None:
        if self._is_local(ip):
            try:
                with open(path, "rb") as f:
                    return f.read(self.max_file_bytes + 1)[: self.max_file_bytes]
            except OSError:
                return None
        assert self._remote is not None  # _list found the file over it
        out = self._remote(ip, ["sh", "-c", 'gzip -c -- "$1" | base64 | tr -d "\\n"', "sh", path])
        if out is None:
            return None
        try:
            return gzip.decompress(base64.b64decode(out.strip(), validate=True))
        except (ValueError, OSError, EOFError):
            raise ValueError(f"its copy over SSH came back cut short (too large for one command's output): "
                             f"left on the node, read it with: ssh {ip} cat {shlex.quote(path)}") from None
