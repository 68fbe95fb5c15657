"""Ray's own logs on every node (raylet, GCS, job drivers, workers), read incrementally by byte offset.

How the log API behaves on Ray 2.60 (measured on the local 3-node cluster, see tests/collectors):
- `ray.util.state.list_logs` / `get_log` want a GCS address, not the dashboard URL, and initialise a
  process-global GCS client. Their HTTP routes on the dashboard (`GET /api/v0/logs?node_id=&glob=` and
  `GET /api/v0/logs/file?node_id=&filename=&lines=`) take the dashboard URL, so we call those.
- `/api/v0/logs/file` has no offset: `lines=-1` sends the whole file every time (a `start_offset` query
  parameter is ignored: 16,261 bytes for a 16,261-byte raylet.out from offset 100), and `lines=N`
  counts from the end. Reading incrementally through it means re-sending every file on every poll.
- `get_log(follow=True)` keeps one HTTP request open per file. Every route of the dashboard's state
  module shares one limit of concurrent calls (`RAY_STATE_SERVER_MAX_HTTP_REQUEST`, default 100):
  following a hundred worker logs would make `list_nodes` and `list_jobs` answer "too many requests".
- Each node's dashboard agent serves its log folder at `http://<node_ip>:<agent_port>/logs/<file>`
  (the LogAgent module, aiohttp static files), and honours HTTP Range: `Range: bytes=0-99` answered
  206 with `Content-Range: bytes 0-99/16261`. The agent ports are in the dashboard's node summary
  (`/nodes?view=summary`, `raylet.dashboardAgentListenPort`). The head must reach that port anyway:
  the Jobs API submits job drivers through it. So files are listed with the log API through the head
  and read by byte range from the node's agent: bounded per poll, resumable after a restart.

Per file we keep the offset of the last complete line, its line count and the last 64 bytes before the
offset. Each read asks for the range starting 64 bytes early: if those bytes differ, the file was
rotated or replaced and is read again from 0; a 416 answer with a total below the offset means it was
truncated. Files that returned nothing are polled less often (back-off up to `idle_backoff_max_s`; never the
driver log of a PENDING or RUNNING job, where its progress is), at
most `max_reads_per_poll` reads run per poll, at most `file_budget_bytes` each. Job driver logs are
found from the Jobs API (`driver_node_id`), so a new job's driver log is read on the next poll without
waiting for the next listing. A DEAD or vanished node is reported once and its files dropped: its logs
are gone with it, unless the node comes back: a raylet restarted on the same host (`ray stop; ray start`, a
rebooted node with a kept /tmp/ray) joins under a new node id but writes into the same session's log folder, old
workers' files and all. So a dropped node's offsets are kept by its IP (`rejoin_memory_s`, a week) and a file of a
new node at that IP whose name and last-read bytes match goes on from where it was read: old lines are not read
again as news. A file whose bytes do not match is a new one, read from 0 as first seen. A rotated Ray file's
unread tail (what was written since the last poll before the rotation) is not read; Ray rotates at 512 MB by
default, so this is rare and small.

A file with no saved offset is read from 0 and what it held then (the total in the first answer's
Content-Range) is its backlog: those lines are dated, by their own stamps or the agent's Last-Modified, and the
ones older than the history window are marked as history (collectors.history): a week of Ray session logs on a
cluster Argus meets for the first time is not a week of new faults.

Node agents (argus/agents): where `agents` is given, a node whose agent was heard from lately is not read over HTTP
at all; its agent reads the same files on the node and sends the lines worth sending, which `from_agents` turns into
the same signals (stream, subject, node, history). A node whose agent goes quiet is read over HTTP again, from this
collector's own offsets.

One module past 400 lines on purpose: listing files, ranged reads and turning them into signals share the
per-file state (offset, tail check, backlog, back-off) and the HTTP behaviour measured above.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from loguru import logger

from collectors.history import HistoryMarker, saved_time
from collectors.kernel_log import STREAM as KERNEL_STREAM
from collectors.logs import LineSplitter
from collectors.offsets import OffsetStore
from collectors.ray_api import DASHBOARD_HINT, cause_of
from core import signal_keys as keys
from core.errors import SourceUnavailable
from core.limits import MAX_LINE_CHARS
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

TAIL_CHECK_BYTES = 64
NO_JOB = "ffffffff"  # the job id in the names of workers started before any job claimed them
_WORKER = re.compile(r"^worker-[0-9a-f]+-([0-9a-f]{8})-\d+\.(?:out|err)$")
_DRIVER = re.compile(r"^job-driver-(.+)\.log$")
_STREAMS = {"raylet.out": "raylet", "raylet.err": "raylet", "gcs_server.out": "gcs", "gcs_server.err": "gcs"}


KERNEL_FILE = "kernel"  # the file name a node agent's kernel log lines travel under


@dataclass(frozen=True)
class AgentLineRecord:
    """One line a node agent read on its node (argus/agents): the file's name, its line number there, the text."""

    file: str
    line: int
    text: str
    truncated: bool = False
    line_time: str | None = None  # set on a backlog line the agent dated
    history: bool = False


@dataclass(frozen=True)
class AgentBatch:
    node_id: str
    node_ip: str
    lines: list[AgentLineRecord]


class AgentFeed(Protocol):
    """What node agents sent since the last poll, and which nodes they cover (argus.agents.inbox.AgentInbox)."""

    def take(self) -> list[AgentBatch]: ...

    def covered(self) -> set[str]: ...


def stream_of(filename: str) -> str | None:
    """The log stream a Ray log file belongs to, or None for files we do not read."""
    if filename in _STREAMS:
        return _STREAMS[filename]
    if _DRIVER.match(filename):
        return "job-logs"
    if _WORKER.match(filename):
        return "worker"
    return None


@dataclass
class _Node:
    node_id: str
    ip: str
    agent_port: int | None
    listed_at: float = float("-inf")
    failing: bool = False


@dataclass
class _File:
    node_id: str
    name: str
    stream: str
    next_due: float = 0.0
    backoff: float = 0.0


@dataclass
class _ReadResult:
    file: _File
    lines: list[tuple[int, str, bool]] = field(default_factory=list)
    backlog: int = 0  # how many of `lines` (a prefix) the file held when first seen
    modified_at: datetime | None = None  # the file's Last-Modified, as the agent said
    state: dict[str, Any] | None = None
    gone: bool = False
    error: str | None = None
    carried: bool = False  # its state was a node's that left, at the same IP (the node came back)


class RayLogsCollector:
    """LOG_LINE signals from Ray's log files on every live node; see the module docstring."""

    name = "ray_logs"

    def __init__(
        self,
        dashboard_url: str,
        offsets: OffsetStore,
        *,
        timeout_s: float = 10.0,
        max_line_bytes: int = MAX_LINE_CHARS,
        file_budget_bytes: int = 2 * 1024 * 1024,
        max_reads_per_poll: int = 200,
        list_interval_s: float = 15.0,
        idle_backoff_max_s: float = 30.0,
        workers: int = 8,
        history_window_s: float = 900.0,
        rejoin_memory_s: float = 7 * 86400.0,
        log_zone: tzinfo | None = None,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        agents: AgentFeed | None = None,
    ) -> None:
        """`history_window_s`: a backlog line written longer ago than this is history (Settings.history_window_s);
        `log_zone`: the zone of log stamps that name none, by default this host's; `rejoin_memory_s`: how long a
        dropped node's offsets wait for a node at its IP (see the module docstring); `agents`: what node agents
        sent (their nodes' files are then left to them, see argus/agents)."""
        self.dashboard_url = dashboard_url.rstrip("/")
        self.offsets = offsets
        self.timeout_s = timeout_s
        self.max_line_bytes = max_line_bytes
        self.file_budget_bytes = file_budget_bytes
        self.max_reads_per_poll = max_reads_per_poll
        self.list_interval_s = list_interval_s
        self.idle_backoff_max_s = idle_backoff_max_s
        self.rejoin_memory_s = rejoin_memory_s
        self.agents = agents
        self._clock = clock
        self._now = monotonic
        self.history = HistoryMarker(history_window_s, clock=clock, tz=log_zone)
        self._http = httpx.Client(timeout=timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ray-logs")
        self._nodes: dict[str, _Node] = {}
        self._files: dict[tuple[str, str], _File] = {}
        self._jobs: dict[str, str] = {}  # job id hex -> submission id
        # The driver logs of PENDING and RUNNING jobs: read every poll, never backed off. A job's progress is in them,
        # and a quiet start (ranks loading a model) must not leave its first steps to arrive in one late batch: the
        # stall detector learns a job's rhythm, and times its last step, from when the lines are read.
        self._live_drivers: set[str] = set()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # -- one poll -----------------------------------------------------------------------------------

    def commit(self) -> None:
        """Save the offsets this collector's reads moved (core.ports.Committing: after the tick's findings are
        filed)."""
        self.offsets.save()

    def collect(self) -> list[Signal]:
        now = self._now()
        self._refresh_nodes()
        self._refresh_jobs()
        covered = self.agents.covered() if self.agents is not None else set()
        listing = [n for n in self._nodes.values()
                   if n.agent_port and now - n.listed_at >= self.list_interval_s and n.node_id not in covered]
        for node, names in zip(listing, self._pool.map(self._list_files, listing), strict=True):
            if names is not None:
                node.listed_at = now
                for name in names:
                    self._track(node.node_id, name)
        due = sorted((f for f in self._files.values() if f.next_due <= now and f.node_id not in covered),
                     key=lambda f: (f.name not in self._live_drivers, f.next_due))  # live drivers first
        due = due[: self.max_reads_per_poll]
        stamp = self._clock()
        signals: list[Signal] = []
        for result in self._pool.map(self._read, due):
            signals += self._settle(result, now, stamp)
        if self.agents is not None:
            signals += self.from_agents(self.agents.take(), stamp)
        return signals

    def from_agents(self, batches: list[AgentBatch], stamp: datetime) -> list[Signal]:
        """The lines node agents read on their nodes, as the signals this collector makes from the same files."""
        signals: list[Signal] = []
        for batch in batches:
            for line in batch.lines:
                stream = KERNEL_STREAM if line.file == KERNEL_FILE else stream_of(line.file)
                if stream is None:
                    continue
                file = _File(batch.node_id, line.file, stream)
                attrs: dict[str, Any] = {keys.STREAM: stream, keys.NODE_ID: batch.node_id, keys.NODE_IP: batch.node_ip,
                                         keys.FILE: line.file, keys.TRUNCATED: line.truncated}
                if line.line_time:
                    attrs[keys.LINE_TIME] = line.line_time
                    attrs[keys.HISTORY] = line.history
                source = (f"kernel://{batch.node_ip}" if stream == KERNEL_STREAM
                          else f"ray://{batch.node_ip}/{line.file}")
                signals.append(Signal(kind=SignalKind.LOG_LINE, source=source,
                                      subject=self._subject(file, batch.node_ip), observed_at=stamp,
                                      text=line.text[:MAX_LINE_CHARS], line=line.line, attrs=attrs))
        return signals

    def _get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._http.get(url, **kwargs)

    def _refresh_nodes(self) -> None:
        try:
            response = self._get(f"{self.dashboard_url}/nodes", params={"view": "summary"})
            response.raise_for_status()
            summary = response.json()["data"]["summary"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable("Ray dashboard", self.dashboard_url, cause_of(exc), hint=DASHBOARD_HINT) from exc
        alive: dict[str, _Node] = {}
        for entry in summary:
            raylet = entry.get("raylet") or {}
            node_id = raylet.get("nodeId")
            if not node_id or raylet.get("state") != "ALIVE":
                continue
            port = raylet.get("dashboardAgentListenPort")
            known = self._nodes.get(node_id)
            node = known or _Node(node_id, str(entry.get("ip") or raylet.get("nodeManagerAddress")), None)
            node.agent_port = int(port) if port else None
            alive[node_id] = node
        for node_id, node in self._nodes.items():
            if node_id not in alive:
                self._drop_node(node)
        self._nodes = alive

    def _drop_node(self, node: _Node) -> None:
        names = sorted(name for (nid, name) in self._files if nid == node.node_id)
        logger.warning(
            "Ray node {} ({}) is no longer alive; its logs went with it. Stopped reading {} file(s): {}",
            node.node_id, node.ip, len(names), ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""),
        )
        for name in names:
            self._files.pop((node.node_id, name), None)
        prefix = f"ray:{node.node_id}:"
        left_at = self._clock().timestamp()
        for key in list(self.offsets.keys()):
            if key.startswith(prefix):
                state = self.offsets.get(key)
                self.offsets.discard(key)
                if state is not None and node.ip:
                    self.offsets.set(_left_key(node.ip, key[len(prefix):]), dict(state, left_at=left_at))
        self._forget_left(left_at)

    def _forget_left(self, now: float) -> None:
        """Drop the offsets of nodes that left longer than `rejoin_memory_s` ago."""
        for key in list(self.offsets.keys()):
            if key.startswith(_LEFT):
                state = self.offsets.get(key) or {}
                left_at = state.get("left_at")
                if not isinstance(left_at, (int, float)) or now - left_at > self.rejoin_memory_s:
                    self.offsets.discard(key)

    def _refresh_jobs(self) -> None:
        try:
            response = self._get(f"{self.dashboard_url}/api/jobs/")
            response.raise_for_status()
            jobs = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("cannot list Ray jobs at {}: {}; worker logs keep their last known jobs",
                           self.dashboard_url, cause_of(exc))
            return
        live: set[str] = set()
        for job in jobs if isinstance(jobs, list) else []:
            job_id, submission_id = job.get("job_id"), job.get("submission_id")
            if job_id and submission_id:
                self._jobs[job_id] = submission_id
            driver_node = job.get("driver_node_id")
            if submission_id and driver_node in self._nodes and job.get("status") in {"PENDING", "RUNNING"}:
                live.add(f"job-driver-{submission_id}.log")
                self._track(driver_node, f"job-driver-{submission_id}.log")
        self._live_drivers = live

    def _list_files(self, node: _Node) -> list[str] | None:
        try:
            response = self._get(
                f"{self.dashboard_url}/api/v0/logs",
                params={"node_id": node.node_id, "glob": "*", "timeout": max(1, int(self.timeout_s))},
            )
            response.raise_for_status()
            result = response.json()["data"]["result"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if not node.failing:
                logger.warning("cannot list Ray logs of node {} ({}): {}", node.node_id, node.ip, cause_of(exc))
            node.failing = True
            return None
        node.failing = False
        return [name for names in result.values() for name in names if not name.endswith("/")]

    def _track(self, node_id: str, name: str) -> None:
        stream = stream_of(name)
        if stream is not None and (node_id, name) not in self._files:
            self._files[(node_id, name)] = _File(node_id, name, stream)

    # -- reading one file ---------------------------------------------------------------------------

    def _read(self, file: _File) -> _ReadResult:
        node = self._nodes.get(file.node_id)
        if node is None or not node.agent_port:
            return _ReadResult(file, error="node has no agent port")
        key = f"ray:{file.node_id}:{file.name}"
        saved = self.offsets.get(key)
        carried = None
        if saved is None and node.ip:  # a node that left and came back at this IP: its file as it was read then
            carried = self.offsets.get(_left_key(node.ip, file.name))
        state = saved or ({k: v for k, v in carried.items() if k != "left_at"} if carried else _fresh(first_sight=True))
        url = f"http://{node.ip}:{node.agent_port}/logs/{quote(file.name)}"
        try:
            for _ in range(2):  # a second pass only after finding the file rotated or truncated
                result = self._read_range(url, file, state)
                if result is not None:
                    result.carried = carried is not None
                    return result
                # rotated or truncated since we read it; one carried from a node that left is a file we do not know
                state = _fresh(first_sight=carried is not None)
        except httpx.HTTPError as exc:
            return _ReadResult(file, error=cause_of(exc))
        return _ReadResult(file, error="file keeps changing under the reader")

    def _read_range(self, url: str, file: _File, state: dict[str, Any]) -> _ReadResult | None:
        offset = int(state["offset"])
        tail = bytes.fromhex(state.get("tail", ""))
        backlog_end, backlog = state.get("backlog"), 0
        start = offset - len(tail)
        headers = {"Range": f"bytes={start}-{offset + self.file_budget_bytes - 1}"}
        splitter = LineSplitter(
            max_line_bytes=self.max_line_bytes, line_no=int(state["line"]), skipping=bool(state["skipping"])
        )
        lines: list[tuple[int, str, bool]] = []
        # The bytes just before the new offset are kept for the next read's identity check; the splitter
        # holds back at most one line, so a window of one line plus the check bytes always covers them.
        recent, seen, keep = bytearray(tail), len(tail), self.max_line_bytes + TAIL_CHECK_BYTES + 1
        with self._http.stream("GET", url, headers=headers) as response:
            if response.status_code == 404:
                return _ReadResult(file, gone=True)
            if response.status_code == 416:
                total = _total_size(response.headers.get("content-range", ""))
                if total is not None and total < offset:
                    logger.info("Ray log {} on node {} was truncated; reading it from the start", file.name,
                                file.node_id)
                    return None
                if state.get("backlog") == -1:  # empty at first sight: no backlog, all it will hold is news
                    state = {k: v for k, v in state.items() if k != "backlog"}
                return _ReadResult(file, state=state)
            response.raise_for_status()
            skip = start if response.status_code == 200 else 0  # a server that ignores Range sends it all
            if backlog_end == -1:  # first sight: the backlog is what the file holds now
                total = _total_size(response.headers.get("content-range", ""))
                backlog_end = total if total is not None else int(response.headers.get("content-length") or 0)
            modified_at = _http_date(response.headers.get("last-modified"))
            check = bytearray()
            for chunk in response.iter_bytes(chunk_size=64 * 1024):
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                if len(check) < len(tail):
                    need = len(tail) - len(check)
                    check += chunk[:need]
                    chunk = chunk[need:]
                    if len(check) == len(tail) and bytes(check) != tail:
                        logger.info("Ray log {} on node {} was rotated or replaced; reading it from the start",
                                    file.name, file.node_id)
                        return None
                if chunk:
                    # to a chunk's precision, as collectors.logs: what began before the backlog's end is backlog
                    in_backlog = backlog_end is not None and offset + splitter.consumed + splitter.pending < backlog_end
                    fed = splitter.feed(chunk)
                    if in_backlog:  # so backlog lines are a prefix: past the backlog's end, no chunk is again
                        backlog += len(fed)
                    lines += fed
                    recent += chunk
                    seen += len(chunk)
                    if len(recent) > keep:
                        del recent[: len(recent) - keep]
        if len(check) < len(tail):  # shorter than what we read before: truncated
            return None
        end = len(tail) + splitter.consumed - (seen - len(recent))  # the new offset, as an index in `recent`
        new_tail = bytes(recent[max(0, end - TAIL_CHECK_BYTES) : end])
        state = dict(state, offset=offset + splitter.consumed, line=splitter.line_no, skipping=splitter.skipping,
                     tail=new_tail.hex(), backlog=backlog_end)
        if backlog_end is None or state["offset"] >= backlog_end:
            state.pop("backlog", None)
            state.pop("backlog_at", None)
        return _ReadResult(file, lines=lines, backlog=backlog, modified_at=modified_at, state=state)

    # -- turning reads into signals -----------------------------------------------------------------

    def _settle(self, result: _ReadResult, now: float, stamp: datetime) -> list[Signal]:
        file = result.file
        key = f"ray:{file.node_id}:{file.name}"
        if result.gone:
            self._files.pop((file.node_id, file.name), None)
            self.offsets.discard(key)
            return []
        if result.error is not None:
            logger.debug("reading Ray log {} on node {} failed: {}", file.name, file.node_id, result.error)
            self._back_off(file, now)
            return []
        ages: list[dict[str, Any]] = []
        if result.backlog and result.state is not None:
            ages, last = self.history.mark([text for _, text, _ in result.lines[: result.backlog]],
                                           modified_at=result.modified_at,
                                           carried=saved_time(result.state.get("backlog_at")))
            if "backlog" in result.state:
                result.state["backlog_at"] = last.isoformat() if last else None
        if result.state is not None:
            self.offsets.set(key, result.state)
            node = self._nodes.get(file.node_id)
            if result.carried and node is not None and node.ip:  # it is this node's file now
                self.offsets.discard(_left_key(node.ip, file.name))
        if not result.lines:
            self._back_off(file, now)
            return []
        file.backoff, file.next_due = 0.0, now
        node = self._nodes.get(file.node_id)
        ip = node.ip if node else None
        subject = self._subject(file, ip)
        source = f"ray://{ip}/{file.name}"
        attrs = {keys.STREAM: file.stream, keys.NODE_ID: file.node_id, keys.NODE_IP: ip, keys.FILE: file.name}
        return [
            Signal(
                kind=SignalKind.LOG_LINE,
                source=source,
                subject=subject,
                observed_at=stamp,
                text=text,
                line=line_no,
                attrs={**attrs, keys.TRUNCATED: cut, **(ages[n] if n < len(ages) else {})},
            )
            for n, (line_no, text, cut) in enumerate(result.lines)
        ]

    def _back_off(self, file: _File, now: float) -> None:
        if file.name in self._live_drivers:
            file.backoff, file.next_due = 0.0, now
            return
        file.backoff = min(self.idle_backoff_max_s, max(1.0, file.backoff * 2))
        file.next_due = now + file.backoff

    def _subject(self, file: _File, ip: str | None) -> Subject:
        driver = _DRIVER.match(file.name)
        if driver:
            return Subject(kind=SubjectKind.JOB, id=driver.group(1))
        worker = _WORKER.match(file.name)
        if worker and worker.group(1) != NO_JOB:
            job_id = worker.group(1)
            return Subject(kind=SubjectKind.JOB, id=self._jobs.get(job_id, job_id))
        return Subject(kind=SubjectKind.NODE, id=file.node_id, name=ip)


_LEFT = "ray-left:"


def _left_key(ip: str, name: str) -> str:
    """Where a dropped node's offset of file `name` waits for a node at its IP."""
    return f"{_LEFT}{ip}:{name}"


def _fresh(*, first_sight: bool = False) -> dict[str, Any]:
    """The state of a file read from 0; on its first sight, its backlog's end is learnt from the first answer."""
    state: dict[str, Any] = {"offset": 0, "line": 0, "skipping": False, "tail": ""}
    if first_sight:
        state["backlog"] = -1
    return state


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _total_size(content_range: str) -> int | None:
    match = re.search(r"/(\d+)\s*$", content_range)
    return int(match.group(1)) if match else None

