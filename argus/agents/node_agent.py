"""The node agent: Argus on every node, as a Ray actor the fleet (argus/agents/fleet.py) pins to its node.

Each poll (every `interval_s`) it reads what is new on its node (argus/agents/scanner.py: Ray's log folder and the
kernel log, scanned with the central's rules) into a bounded buffer and sends the buffer's head to the central
Argus (`POST /v1/agents/batch`, a node-agent token), at most `batch_lines` lines per request, and a heartbeat with
its counters at least every `heartbeat_s` when there is nothing to send.

- Nothing is lost while the central restarts: lines stay in the buffer until a batch is answered 2xx, and are
  sent again (in order) when it is back; a 429 (the central's inbox is full) or an unreachable central backs off
  (1 s doubling to 10 s).
- Back-pressure instead of unbounded memory: while the buffer holds `max_buffer_lines`, the agent stops reading,
  so the lines stay in their files and the offsets do not move.
- Offsets are saved only when the buffer is empty (everything read was answered 2xx): an agent that dies with
  lines unsent reads them again after its restart (sent at least once, never dropped).
- Where the node has a GPU and `nvml` is on, every `gpu_interval_s` it reads its GPUs through NVML
  (collectors.nvml, dcgm-exporter's names) and sends the newest reading with the next batch
  (collectors.agent_gpus); a reading not yet answered is replaced by a newer one, never queued. A node where NVML
  cannot start (no driver) says why in its stats (`gpus`) and tries again every `nvml_retry_s`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from loguru import logger

from argus.agents.scanner import NodeScanner, line_json
from collectors.agent_gpus import GpuReading, reading_json, readings_of
from collectors.kernel_log import pick_source
from collectors.nvml import NvmlCollector
from collectors.offsets import OffsetStore
from collectors.ray_logs import AgentLineRecord
from core.errors import SourceUnavailable
from detectors.engine import RuleSet, load_rules

BATCH_PATH = "/v1/agents/batch"


@dataclass
class AgentCounters:
    started_at: float = field(default_factory=time.time)
    polls: int = 0
    lines_read: int = 0
    bytes_read: int = 0
    lines_picked: int = 0
    lines_sent: int = 0
    batches_sent: int = 0
    send_failures: int = 0
    paused_polls: int = 0  # polls skipped because the buffer was full (back-pressure)
    gpu_reads: int = 0
    last_error: str | None = None


def ray_logs_dir() -> Path:
    """The Ray log folder of the node this process runs on (a Ray worker's own stdout is a file in it)."""
    try:
        target = os.readlink("/proc/self/fd/1")
        if target.endswith((".out", ".log")) and "/logs/" in target:
            return Path(target).parent
    except OSError:
        pass
    return Path("/tmp/ray/session_latest/logs")


class NodeAgent:
    """One node's agent; see the module docstring. Plain Python: the fleet wraps it as a Ray actor."""

    def __init__(
        self,
        *,
        node_id: str,
        node_ip: str,
        central_url: str,
        token: str,
        logs_dir: str | None = None,
        kernel_log: str = "auto",
        state_dir: str | None = None,
        interval_s: float = 1.0,
        heartbeat_s: float = 10.0,
        batch_lines: int = 5000,
        max_buffer_lines: int = 200_000,
        history_window_s: float = 900.0,
        rules_dirs: tuple[str, ...] = (),
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        rules: RuleSet | None = None,
        nvml: bool = True,
        gpu_interval_s: float = 10.0,
        nvml_retry_s: float = 300.0,
        nvml_module: Any = None,
        hostname: str | None = None,
    ) -> None:
        """`rules`: the log rules to scan with (default: the built-in ones and `rules_dirs`); many agents in one
        process (bench/fanin.py) share one set. `nvml`: read the node's GPUs (off where dcgm-exporter does);
        `nvml_module`: pynvml or a stand-in with its functions (stage/sim/nvml_host.py)."""
        self.node_id = node_id
        self.node_ip = node_ip
        self.url = central_url.rstrip("/") + BATCH_PATH
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.batch_lines = batch_lines
        self.max_buffer_lines = max_buffer_lines
        logs = Path(logs_dir) if logs_dir else ray_logs_dir()
        state = Path(state_dir) if state_dir else logs.parent / "argus-agent"
        state.mkdir(parents=True, exist_ok=True)
        self.offsets = OffsetStore(state / "offsets.json")
        if "{" in kernel_log:  # a path per node, e.g. /var/log/nodes/{node_ip}/kern.log on shared storage
            kernel_log = kernel_log.replace("{node_ip}", node_ip).replace("{node_id}", node_id)
        kernel = pick_source(kernel_log, self.offsets, history_window_s=history_window_s)
        self.kernel_source = kernel.source.name if kernel.source else "none: " + "; ".join(kernel.tried)
        self.scanner = NodeScanner(logs, self.offsets, rules or load_rules([Path(d) for d in rules_dirs]),
                                   kernel=kernel.source, history_window_s=history_window_s)
        self.logs_dir = str(logs)
        self.buffer: deque[AgentLineRecord] = deque()
        self.hostname = hostname or socket.gethostname()
        self.gpu_interval_s = gpu_interval_s
        self.nvml_retry_s = nvml_retry_s
        self._nvml = NvmlCollector(hostname=self.hostname, nvml=nvml_module) if nvml else None
        self.gpu_state = "nvml: not read yet" if nvml else "off"
        self._gpus: list[GpuReading] = []  # the newest reading, until the central answers it
        self._gpus_due = float("-inf")
        self.counters = AgentCounters()
        self._http = httpx.Client(timeout=timeout_s, transport=transport,
                                  headers={"authorization": f"Bearer {token}"})
        self._clock = clock
        self._last_sent = float("-inf")
        self._retry_at = float("-inf")
        self._backoff = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the actor's methods ----------------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Start polling in a background thread (idempotent); what it reads."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="argus-node-agent", daemon=True)
            self._thread.start()
            logger.info("argus node agent on {} ({}): reading {} and the kernel log from {}; sending to {}",
                        self.node_ip, self.node_id, self.logs_dir, self.kernel_source, self.url)
        return self.stats()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.scanner.close()
        self._http.close()
        if self._nvml is not None:
            self._nvml.shutdown()

    def stats(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "node_ip": self.node_ip, "logs_dir": self.logs_dir,
                "kernel_log": self.kernel_source, "gpus": self.gpu_state, "buffered": len(self.buffer),
                "pid": os.getpid(),
                **self.counters.__dict__}

    def ping(self) -> str:
        return self.node_id

    # -- the loop ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            began = self._clock()
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the agent must outlive any one bad poll; it says why
                self.counters.last_error = f"{type(exc).__name__}: {exc}"
                logger.exception("argus node agent poll failed")
            # behind a burst (the budgets left bytes unread) and room in the buffer: read on at once, not a poll a
            # second; what a poll reads is still bounded by its budgets
            catching_up = self.scanner.behind and len(self.buffer) < self.max_buffer_lines
            self._stop.wait(0.0 if catching_up else max(0.0, self.interval_s - (self._clock() - began)))

    def run_once(self) -> None:
        """One poll: read what is new (unless the buffer is full), then send what the central has not answered."""
        self.counters.polls += 1
        if len(self.buffer) < self.max_buffer_lines:
            picked = self.scanner.poll()
            self.buffer.extend(picked)
            self.counters.lines_picked += len(picked)
            self.counters.lines_read = self.scanner.lines_read
            self.counters.bytes_read = self.scanner.bytes_read
        else:
            self.counters.paused_polls += 1
        self._read_gpus()
        self._send()
        if not self.buffer:
            self.scanner.save()  # everything read is answered: a restart may start after it

    def _read_gpus(self) -> None:
        """The node's GPUs through NVML, when due; a node where NVML cannot start tries again later."""
        now = self._clock()
        if self._nvml is None or now < self._gpus_due:
            return
        try:
            readings = readings_of(self._nvml.samples())
        except SourceUnavailable as exc:
            self._gpus_due = now + self.nvml_retry_s
            self.gpu_state = f"none: {exc.message}"
            return
        self._gpus_due = now + self.gpu_interval_s
        self._gpus = readings
        self.counters.gpu_reads += 1
        failing = f"; failing: {'; '.join(self._nvml.last_errors.values())}" if self._nvml.last_errors else ""
        self.gpu_state = f"nvml: {len(readings)} GPU(s){failing}"[:400]

    def _send(self) -> None:
        now = self._clock()
        if now < self._retry_at:
            return
        while self.buffer or self._gpus or now - self._last_sent >= self.heartbeat_s:
            batch = [self.buffer[i] for i in range(min(self.batch_lines, len(self.buffer)))]
            gpus = self._gpus
            body = {"node_id": self.node_id, "node_ip": self.node_ip, "hostname": self.hostname,
                    "agent": self.stats(), "lines": [line_json(line) for line in batch],
                    "gpus": [reading_json(reading) for reading in gpus]}
            try:
                answer = self._http.post(self.url, json=body)
            except httpx.HTTPError as exc:
                self._failed(f"cannot reach the central Argus at {self.url}: {type(exc).__name__}: {exc}")
                return
            if answer.status_code >= 300:
                self._failed(f"the central Argus answered {answer.status_code}: {answer.text[:300]}")
                return
            for _ in batch:
                self.buffer.popleft()
            if self._gpus is gpus:  # a newer reading taken meanwhile still waits
                self._gpus = []
            self.counters.lines_sent += len(batch)
            self.counters.batches_sent += 1
            self._backoff = 0.0
            self._last_sent = now = self._clock()
            if not self.buffer:
                return

    def _failed(self, why: str) -> None:
        self.counters.send_failures += 1
        self.counters.last_error = why
        self._backoff = min(10.0, max(1.0, self._backoff * 2))
        self._retry_at = self._clock() + self._backoff
