"""The central side of the node agents: what they sent, waiting for the next tick of the loop.

The API (`POST /v1/agents/batch`, argus/api/agents.py) puts each batch here; the Ray log collector takes it out on
its next poll and turns the lines into the same LOG_LINE signals it makes from files it reads itself
(collectors.ray_logs), so the detectors cannot tell the two paths apart. Bounded: past `max_lines` waiting, a
batch is refused (the API answers 429 and the agent keeps it and sends it again), so a burst costs the central
memory up to the bound and nothing more.

A node is covered while its agent was heard from within `stale_after_s` (a heartbeat or a batch): the central
poller leaves its files to the agent then, and takes them back when the agent goes quiet (the poller's offsets are
its own, so it reads the files from where it stopped). `argus_agent_up{node}` says which nodes are covered how.

GPU readings (collectors.agent_gpus) are states, not events: only each node's newest report waits, a newer one
replaces it, so they cost at most one report per node.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.agent_gpus import AgentGpuReport, GpuReading
from collectors.ray_logs import AgentBatch, AgentLineRecord
from core.types import utcnow


@dataclass
class AgentSeen:
    node_id: str
    node_ip: str
    last_at: float
    stats: dict[str, Any] = field(default_factory=dict)
    lines: int = 0


class AgentInbox:
    """Batches from node agents, waiting for the collector; see the module docstring."""

    def __init__(self, *, max_lines: int = 500_000, stale_after_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_lines = max_lines
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._batches: deque[AgentBatch] = deque()
        self._waiting = 0
        self._seen: dict[str, AgentSeen] = {}
        self._gpus: dict[str, AgentGpuReport] = {}
        self.refused = 0

    def put(self, node_id: str, node_ip: str, lines: list[AgentLineRecord], stats: dict[str, Any],
            gpus: list[GpuReading] | None = None, hostname: str | None = None) -> bool:
        """Keep a batch for the next poll; False (keep nothing) when the inbox is full. `gpus`: the node's newest
        GPU readings (replacing any not yet taken), `hostname` the node's own name (their Hostname label)."""
        with self._lock:
            seen = self._seen.get(node_id)
            if seen is None:
                seen = self._seen[node_id] = AgentSeen(node_id, node_ip, self._clock())
            seen.last_at, seen.node_ip, seen.stats = self._clock(), node_ip, stats
            if lines and self._waiting + len(lines) > self.max_lines:
                self.refused += 1
                return False
            if gpus:
                self._gpus[node_id] = AgentGpuReport(node_id, node_ip, hostname or node_ip, utcnow(), gpus)
            if not lines:
                return True
            self._batches.append(AgentBatch(node_id=node_id, node_ip=node_ip, lines=lines))
            self._waiting += len(lines)
            seen.lines += len(lines)
            return True

    def take(self) -> list[AgentBatch]:
        with self._lock:
            batches = list(self._batches)
            self._batches.clear()
            self._waiting = 0
            return batches

    def take_gpus(self) -> list[AgentGpuReport]:
        with self._lock:
            reports = list(self._gpus.values())
            self._gpus.clear()
            return reports

    def covered(self) -> set[str]:
        """The node ids whose agent was heard from lately."""
        now = self._clock()
        with self._lock:
            return {n for n, seen in self._seen.items() if now - seen.last_at <= self.stale_after_s}

    def agents(self) -> list[AgentSeen]:
        with self._lock:
            return list(self._seen.values())

    def waiting(self) -> int:
        return self._waiting
