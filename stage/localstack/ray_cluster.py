"""A real multi-node Ray cluster on one host: a CPU-only head and workers on their own loopback IPs.

How the processes are held (measured with ray 2.60 on this machine):
- Every node is one `ray start ... --block` process. With `--block` the CLI stays the parent of the
  node's GCS, raylet, dashboard, agents and log monitor, all in the process group we create for it.
  SIGTERM to it drains the node and takes every child down in about 1-2 s. Without `--block` the CLI
  exits and its children are re-parented to init; some of them (`ray::DashboardAgent`,
  `ray::RuntimeEnvAgent`) do not carry the temp dir in their command line, so finding them again is
  guesswork. `--block` it is.
- When a node's raylet dies, the blocking parent notices within a second, kills the node's remaining
  processes itself and exits with code 1: killing a raylet is a faithful "node lost".
- `ray stop` is never used: it ends every Ray process on the machine, including other people's.
- Every port is chosen free: GCS (never 6379), dashboard, metrics export (>= 20000, below that is the
  worker port range), dashboard agent, the Ray client server (default 10001) and, through the head's
  environment, the autoscaler's and dashboard's own metrics ports (AUTOSCALER_METRIC_PORT=44217 and
  DASHBOARD_METRIC_PORT=44227 by default). Fixed defaults would collide with another cluster on the
  same host, since nodes bind several of these on 0.0.0.0.
- Temp dirs are short (/tmp/ag-<random>/h, .../w1): Ray puts unix sockets under
  <temp>/session_<timestamp>/sockets/ and a socket path may not exceed 107 bytes.
- The Prometheus service-discovery file is written into the head's session dir; Ray keeps a symlink to
  it at <head temp dir>/prom_metrics_service_discovery.json, which is `sd_file`. A symlink's target
  changing does not wake a file watcher, so Prometheus must re-read it on an interval.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from loguru import logger

from core.errors import ArgusError
from stage.localstack.binaries import require_ray
from stage.localstack.ports import free_port
from stage.localstack.process import REGISTRY, ManagedProcess, StackTimeout, is_alive

FAST_HEALTH_CHECK_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_initial_delay_ms": "1000",
}
# Nothing outside can be reached from test machines; the usage reporter would only retry and log.
# The interpreter's bin first on PATH, as `source .venv/bin/activate && ray start` has it: the dashboard agent
# runs the venv's py-spy for stack dumps (keep_scene) and finds it only there.
# RAY_raylet_start_wait_time_s: `ray start` gives the raylet 30 s to register with the GCS by default; on a loaded
# 2-core CI machine (the unit tests run beside the real stack) the head once needed more and `ray start` exited.
_COMMON_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": "120",
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])}
_METRICS_MIN_PORT = 20000
_STOP_GRACE_S = 15.0


def _own_ports() -> list[str]:
    """The ports a node's processes would otherwise pick for themselves, given from the ones handed out here.

    Left to Ray, the dashboard agent's gRPC server, the runtime-env agent, the node manager and the object manager
    each ask the kernel for a free port while the ports handed out for the node (its agent's HTTP port, say) are not
    bound yet; the kernel once gave the agent's gRPC server the port just handed out for its HTTP server, the agent
    could not bind it, and every Jobs API call on that cluster failed ("Agent info not found in internal KV").
    """
    return [
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
    ]


def _as_dict(state: object) -> dict[str, Any]:
    """One row of Ray's state API as a dict: a dataclass (NodeState, ...) in the Rays we run, a dict in older ones."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.asdict(state)
    if isinstance(state, Mapping):
        return dict(state)
    raise TypeError(f"Ray's state API gave a {type(state).__name__}, neither a dataclass nor a mapping")


@dataclass
class RayNode:
    """One node of the cluster: its `ray start --block` process and what identifies it to Ray."""

    role: str  # "head" or "worker"
    index: int  # 0 for the head, i for worker i (it holds the custom resource "worker<i>")
    ip: str
    temp_dir: Path
    metrics_port: int
    agent_port: int
    process: ManagedProcess
    node_id: str | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "head" if self.role == "head" else f"worker{self.index}"

    def pids(self) -> list[int]:
        """Live pids of this node: the `ray start` parent and everything it started."""
        return self.process.pids()

    def raylet_pid(self) -> int | None:
        for pid in self.pids():
            try:
                proc = psutil.Process(pid)
                if proc.name() == "raylet" or (proc.cmdline()[:1] or [""])[0].endswith("/raylet"):
                    return pid
            except psutil.NoSuchProcess:
                continue
        return None

    def raylet_node_id(self) -> str | None:
        """The node id from the raylet's command line (`--node_id=<hex>`), known before Ray lists the node."""
        pid = self.raylet_pid()
        if pid is None:
            return None
        try:
            args = psutil.Process(pid).cmdline()
        except psutil.NoSuchProcess:
            return None
        for arg in args:
            if arg.startswith("--node_id="):
                return arg.split("=", 1)[1]
        return None

    def log_dir(self) -> Path | None:
        """<temp dir>/session_<...>/logs, where this node's Ray processes write their logs."""
        sessions = sorted(self.temp_dir.glob("session_2*"))
        return sessions[-1] / "logs" if sessions else None


class RayCluster:
    """A head plus workers started with `ray start --block`; see the module docstring for why."""

    def __init__(
        self,
        base_dir: Path,
        *,
        head_ip: str = "127.0.0.2",
        worker_ips: tuple[str, ...] | list[str] = ("127.0.0.3", "127.0.0.4"),
        head_env: dict[str, str] | None = None,
        worker_env: dict[str, str] | None = None,
        worker_gpus: int = 0,
        fast_health_check: bool = True,
        ray_bin: str | None = None,
        keep_temp_dirs: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.head_ip = head_ip
        self.worker_ips = tuple(worker_ips)
        self.head_env = dict(head_env or {})
        # e.g. RAY_memory_usage_threshold: set on workers only, since every node sees the whole host's memory
        self.worker_env = dict(worker_env or {})
        # advertised GPU resources (no real GPUs here): lets jobs request num_gpus and Argus map GPUs to jobs
        self.worker_gpus = worker_gpus
        self.fast_health_check = fast_health_check
        self.ray_bin = ray_bin
        self.keep_temp_dirs = keep_temp_dirs
        self._temp_root: Path | None = None
        self._gcs_port: int | None = None
        self._dashboard_port: int | None = None
        self.head: RayNode | None = None
        self._workers: dict[int, RayNode] = {}
        self._restarts = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RayCluster(head={self.head_ip}, gcs={self._gcs_port}, workers={list(self.worker_ips)})"

    # -- addresses ---------------------------------------------------------------------------------

    def _need_started(self) -> None:
        if self.head is None:
            raise ArgusError("the Ray cluster is not started", hint="call RayCluster.start() first")

    @property
    def gcs_address(self) -> str:
        self._need_started()
        return f"{self.head_ip}:{self._gcs_port}"

    @property
    def dashboard_url(self) -> str:
        self._need_started()
        return f"http://{self.head_ip}:{self._dashboard_port}"

    @property
    def sd_file(self) -> Path:
        self._need_started()
        assert self.head is not None
        return self.head.temp_dir / "prom_metrics_service_discovery.json"

    @property
    def nodes(self) -> list[RayNode]:
        return ([self.head] if self.head else []) + [self._workers[i] for i in sorted(self._workers)]

    @property
    def workers(self) -> list[RayNode]:
        return [self._workers[i] for i in sorted(self._workers)]

    def worker(self, i: int) -> RayNode:
        """Worker i, counted from 1 like its `worker<i>` resource."""
        if i not in self._workers:
            raise ArgusError(
                f"the Ray cluster has no worker {i}",
                hint=f"workers are numbered 1..{len(self.worker_ips)}, like their 'worker<i>' resource",
            )
        return self._workers[i]

    # -- state through Ray's own API ---------------------------------------------------------------

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node Ray knows, alive and dead, as dicts (node_id, node_ip, state, state_message, ...)."""
        from ray.util.state import list_nodes

        states = list_nodes(
            address=self.dashboard_url, detail=True, limit=10_000, timeout=10, raise_on_missing_output=False
        )
        return [_as_dict(s) for s in states]

    def node_state(self, node_id: str) -> dict[str, Any] | None:
        return next((n for n in self.list_nodes() if n["node_id"] == node_id), None)

    def wait_node_state(self, node_id: str, state: str, timeout: float = 60.0) -> dict[str, Any]:
        """Poll list_nodes until node `node_id` is in `state` (ALIVE or DEAD); return its record."""
        deadline = time.monotonic() + timeout
        last: Any = "not listed"
        while True:
            try:
                node = self.node_state(node_id)
                last = node["state"] if node else "not listed"
                if node and node["state"] == state:
                    return node
            except Exception as exc:  # the dashboard may be busy on a loaded machine; keep polling
                last = f"list_nodes failed: {exc}"
            if time.monotonic() >= deadline:
                raise StackTimeout(
                    f"Ray node {node_id} did not reach state {state} within {timeout:.0f} s (last: {last})",
                    hint=f"check the head's logs under {self.head.log_dir() if self.head else '?'}",
                )
            time.sleep(0.3)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> RayCluster:
        """Start the head, then all workers at once; return when Ray lists every node ALIVE."""
        if self.head is not None:
            return self
        deadline = time.monotonic() + timeout
        self.ray_bin = self.ray_bin or require_ray()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._temp_root = Path(tempfile.mkdtemp(prefix="ag-", dir="/tmp"))
        link = self.base_dir / "ray-temp"
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(self._temp_root, target_is_directory=True)
        # Registered as a whole so an entry point's exit handler also removes the temp dirs.
        REGISTRY.add(self)
        try:
            self._start_head(deadline)
            started = [self._spawn_worker(i, ip) for i, ip in enumerate(self.worker_ips, start=1)]
            for node in started:
                self._wait_alive(node, deadline)
        except BaseException:
            self.stop()
            raise
        logger.info("Ray cluster up: gcs={} dashboard={} nodes={}", self.gcs_address, self.dashboard_url,
                    [n.name for n in self.nodes])
        return self

    def _start_head(self, deadline: float) -> None:
        assert self._temp_root is not None and self.ray_bin is not None
        self._gcs_port = free_port(min_port=_METRICS_MIN_PORT)
        self._dashboard_port = free_port()
        metrics, agent, client = free_port(min_port=_METRICS_MIN_PORT), free_port(), free_port()
        # The autoscaler and dashboard export metrics on fixed default ports (44217, 44227) on 0.0.0.0.
        autoscaler_metrics, dashboard_metrics = free_port(), free_port()
        temp_dir = self._temp_root / "h"
        argv = [
            self.ray_bin, "start", "--head", "--block", "--disable-usage-stats",
            "--num-cpus=0", "--num-gpus=0",
            f"--node-ip-address={self.head_ip}",
            f"--port={self._gcs_port}",
            f"--dashboard-host={self.head_ip}",
            f"--dashboard-port={self._dashboard_port}",
            f"--metrics-export-port={metrics}",
            f"--dashboard-agent-listen-port={agent}",
            *_own_ports(),
            f"--ray-client-server-port={client}",
            f"--temp-dir={temp_dir}",
        ]  # fmt: skip
        env = {
            **_COMMON_ENV,
            "AUTOSCALER_METRIC_PORT": str(autoscaler_metrics),
            "DASHBOARD_METRIC_PORT": str(dashboard_metrics),
            **(FAST_HEALTH_CHECK_ENV if self.fast_health_check else {}),
            **self.head_env,
        }
        proc = ManagedProcess("ray-head", argv, log_path=self.base_dir / "head.log", env=env)
        self.head = RayNode("head", 0, self.head_ip, temp_dir, metrics, agent, proc,
                            ports={"gcs": self._gcs_port, "dashboard": self._dashboard_port, "client": client,
                                   "autoscaler_metrics": autoscaler_metrics, "dashboard_metrics": dashboard_metrics})
        proc.start()
        self._wait_alive(self.head, deadline)

    def _spawn_worker(self, i: int, ip: str, env: Mapping[str, str] | None = None,
                      temp_dir: Path | None = None) -> RayNode:
        assert self._temp_root is not None and self.ray_bin is not None
        metrics, agent = free_port(min_port=_METRICS_MIN_PORT), free_port()
        suffix = f"r{self._restarts}" if self._restarts else ""
        temp_dir = temp_dir or self._temp_root / f"w{i}{suffix}"
        argv = [
            self.ray_bin, "start", "--block", "--disable-usage-stats",
            f"--address={self.gcs_address}",
            f"--node-ip-address={ip}",
            "--num-cpus=1",
            f"--num-gpus={self.worker_gpus}",
            f"--resources={json.dumps({'worker': 1, f'worker{i}': 1})}",
            f"--metrics-export-port={metrics}",
            f"--dashboard-agent-listen-port={agent}",
            *_own_ports(),
            f"--temp-dir={temp_dir}",
        ]  # fmt: skip
        log = self.base_dir / f"worker{i}{'-' + suffix if suffix else ''}.log"
        env = {**_COMMON_ENV, **self.worker_env, **(env or {})}
        proc = ManagedProcess(f"ray-worker{i}", argv, log_path=log, env=env)
        node = RayNode("worker", i, ip, temp_dir, metrics, agent, proc)
        self._workers[i] = node
        proc.start()
        return node

    def _wait_alive(self, node: RayNode, deadline: float) -> None:
        def alive() -> bool:
            if node.node_id is None:
                node.node_id = node.raylet_node_id()
                if node.node_id is None:
                    return False
            state = self.node_state(node.node_id)
            return bool(state and state["state"] == "ALIVE")

        # A worker that cannot reach the GCS retries forever; the deadline is its timeout.
        node.process.wait_ready(alive, max(1.0, deadline - time.monotonic()),
                                f"Ray to list node {node.name} ({node.ip}) as ALIVE")

    def kill_worker(self, i: int, sig: int = signal.SIGKILL) -> float:
        """Send `sig` to worker i's raylet (Ray then declares the node DEAD); return time.time() of the kill."""
        node = self.worker(i)
        pid = node.raylet_pid()
        if pid is None:
            raise ArgusError(
                f"worker{i} ({node.ip}) has no running raylet to kill",
                hint="it is already down; call restart_worker(i) first",
            )
        psutil.Process(pid).send_signal(sig)
        killed_at = time.time()
        logger.info("sent signal {} to raylet pid={} of worker{} node_id={}", sig, pid, i, node.node_id)
        return killed_at

    def restart_worker(self, i: int, timeout: float = 60.0, *, env: Mapping[str, str] | None = None,
                       in_place: bool = False) -> RayNode:
        """Replace worker i by a fresh `ray start` (new temp dir, new node id); return it once ALIVE.

        `env` is added to worker_env for this one node (e.g. a lowered RAY_memory_usage_threshold). `in_place`: in
        the old temp dir, as a host restarted without a reboot: the new node writes into the same log folder,
        beside its predecessor's files."""
        old = self.worker(i)
        old.process.stop(grace=5.0)
        with self._lock:
            self._restarts += 1
            node = self._spawn_worker(i, old.ip, env=env, temp_dir=old.temp_dir if in_place else None)
        try:
            self._wait_alive(node, time.monotonic() + timeout)
        except BaseException:
            node.process.stop(grace=5.0)
            raise
        return node

    def log_paths(self) -> list[Path]:
        """The `ray start` logs and every node's Ray log folder, for copying after a failure."""
        paths = [n.process.log_path for n in self.nodes]
        paths += sorted(self.base_dir.glob("*.log"))
        paths += [d for n in self.nodes if (d := n.log_dir()) is not None]
        if self._temp_root is not None:
            paths += sorted(p for p in self._temp_root.glob("*/session_2*/logs") if p not in paths)
        return list(dict.fromkeys(paths))

    def stop(self) -> None:
        """Stop workers, then the head, each by its own PIDs. Idempotent; safe after a failed start."""
        workers = list(self._workers.values())
        threads = [threading.Thread(target=w.process.stop, args=(_STOP_GRACE_S,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.head is not None:
            self.head.process.stop(_STOP_GRACE_S)
        leftovers = [p for n in self.nodes for p in n.pids() if is_alive(p)]
        if leftovers:
            logger.warning("Ray processes still alive after stop: {}", leftovers)
        if self._temp_root is not None and not self.keep_temp_dirs:
            shutil.rmtree(self._temp_root, ignore_errors=True)
            link = self.base_dir / "ray-temp"
            if link.is_symlink():
                link.unlink()
        self._temp_root = None if not self.keep_temp_dirs else self._temp_root
        self.head = None
        self._workers = {}
        REGISTRY.discard(self)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
