"""The Python stacks and process states of a job's processes: what a hang is confirmed and localised from.

Stacks come through Ray's dashboard (`GET /worker/traceback`, py-spy on the process's node; the head needs
RAY_DASHBOARD_ENABLE_PROFILING=1 and py-spy on every node). A job's processes are its driver and its alive
actors (Ray's state API); their node IPs come from Ray's node list. A process's state letter (R running, S
sleeping, D uninterruptible, T stopped, ...) is read from /proc where the process runs on this host, and over
`remote` (a node Argus reaches over SSH) elsewhere; a state not known is None, never guessed.

Two uses:
- `take_job_stacks`: one sample of every process of a job, for the scene a remediation step keeps.
- `RankStackSampler`, a collector: the stall detector asks (`requests`) for the jobs it suspects of hanging; the
  sampler takes two samples `gap_s` apart in the background (a sample takes seconds: the loop must not wait) and
  hands them back as one STACKS signal on the next tick, for the detector to judge (detectors/hang_stacks.py).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from loguru import logger

from collectors.ray_api import RayStateApi, cause_of
from control.node_manager import plain_dict
from core import signal_keys as keys
from core.errors import ArgusError
from core.types import Signal, SignalKind, Subject, SubjectKind, utcnow

MAX_PROCESSES = 64  # stacks per sample: py-spy on hundreds of ranks would take minutes; the odd rank shows in 64
DRIVER = "driver"

# Reads the state letters of `pids` on the node at `ip` (e.g. `ps -o pid=,stat=` over SSH); {} when it cannot.
RemoteStates = Callable[[str, Sequence[int]], Mapping[int, str]]


@dataclass(frozen=True)
class ProcessStack:
    """One process of a job, as one sample saw it: `dump` is py-spy's text, or None with `error` saying why."""

    label: str  # the actor's class name, or "driver"
    pid: int
    node_id: str | None
    node_ip: str | None
    dump: str | None
    error: str | None = None
    state: str | None = None  # the /proc state letter, where known
    gpu: str | None = None  # the GPU indices on its node Ray's dashboard saw it use ("3", "2,3"), where known

    def as_attrs(self) -> dict[str, Any]:
        return asdict(self)


# Process states py-spy is not pointed at (see take_job_stacks).
LEFT_ALONE = frozenset({"T", "t"})


class ProcessStates:
    """The state letter of processes: from /proc for a process on this host, from `remote` for others."""

    def __init__(self, remote: RemoteStates | None = None, proc: Path = Path("/proc")) -> None:
        self._remote = remote
        self._proc = proc
        self._local_ips = local_addresses()

    def of(self, node_ip: str | None, pids: Sequence[int]) -> dict[int, str]:
        if not pids:
            return {}
        if node_ip is not None and is_local_address(node_ip, self._local_ips):
            return {pid: state for pid in pids if (state := _proc_state(self._proc, pid)) is not None}
        if node_ip is not None and self._remote is not None:
            try:
                return {int(p): str(s) for p, s in self._remote(node_ip, pids).items()}
            except Exception as exc:  # noqa: BLE001 - an unknown state is no error of the stacks
                logger.debug("process states on {}: {}", node_ip, exc)
        return {}


def parse_ps_states(text: str) -> dict[int, str]:
    """`ps -o pid=,stat= -p ...` output as {pid: state letter} (the first letter of STAT: "Tl" is T)."""
    states: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1][:1].isalpha():
            states[int(parts[0])] = parts[1][0]
    return states


def _proc_state(proc: Path, pid: int) -> str | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ")"
    end = stat.rfind(")")
    rest = stat[end + 1:].split() if end >= 0 else []
    return rest[0] if rest and len(rest[0]) == 1 and rest[0].isalpha() else None


def local_addresses() -> frozenset[str]:
    addresses = {"localhost"}
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            addresses.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:  # noqa: BLE001 - without the interface list, only loopback counts as this host
        pass
    return frozenset(addresses)


def is_local_address(ip: str, local: frozenset[str]) -> bool:
    if ip in local:
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def take_stack(dashboard_url: str, pid: int, node_id: str | None, timeout_s: float = 30.0) -> str:
    """py-spy's dump of one process through Ray's dashboard; RuntimeError saying why when there is none."""
    params = {"pid": str(pid), "node_id": node_id or "", "native": "0"}
    try:
        response = httpx.get(f"{dashboard_url.rstrip('/')}/worker/traceback", params=params, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"Ray's dashboard did not answer: {cause_of(exc)}") from exc
    if response.status_code != 200:
        hint = " (set RAY_DASHBOARD_ENABLE_PROFILING=1 on the head)" if "PROFILING" in response.text else ""
        raise RuntimeError(f"HTTP {response.status_code}: {_why(response.text)}{hint}")
    return response.text


def _why(text: str) -> str:
    """py-spy's reason first ("Error: ...", "Caused by: 0: Failed to suspend process"), before the command line
    Ray puts ahead of it, whose venv path may be long enough to push the reason past any cut."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = [line for line in lines if line.startswith("Error:")]
    start = next((i for i, line in enumerate(lines) if line.startswith("Caused by")), None)
    if start is not None:
        reason += [line for line in lines[start + 1:start + 4] if line[:1].isdigit()]
    return (" ".join(reason) + " | " if reason else "") + " ".join(lines)[:200]


@dataclass(frozen=True)
class JobProcesses:
    """A job's processes as Ray lists them: `job_id` is Ray's hex id (None when Ray does not know the job)."""

    job_id: str | None
    processes: tuple[tuple[str, int, str | None, str | None], ...]  # (label, pid, node_id, node_ip)
    actors: tuple[dict[str, Any], ...] = ()  # the actors' records, as Ray's state API gives them


def job_processes(api: RayStateApi, submission_id: str) -> JobProcesses:
    """The driver and the alive actors of a job; SourceUnavailable when Ray does not answer."""
    info = api.get_json(f"/api/jobs/{submission_id}")
    job_id = info.get("job_id") if isinstance(info, dict) else None
    if not job_id:
        return JobProcesses(None, ())
    actors = [plain_dict(a) for a in api.call("list_actors", filters=[("job_id", "=", job_id)], detail=True)]
    ips = {n.get("node_id"): n.get("node_ip") for n in (plain_dict(n) for n in api.call("list_nodes", detail=True))}
    processes = [(a.get("class_name") or "actor", int(a["pid"]), a.get("node_id"), ips.get(a.get("node_id")))
                 for a in actors if a.get("state") == "ALIVE" and a.get("pid")]
    driver = info.get("driver_info") or {}
    if driver.get("pid"):
        node_id = driver.get("node_id") or info.get("driver_node_id")
        processes.insert(0, (DRIVER, int(driver["pid"]), node_id, driver.get("node_ip_address") or ips.get(node_id)))
    return JobProcesses(str(job_id), tuple(processes[:MAX_PROCESSES]), tuple(actors))


def actor_gpus(api: RayStateApi, actors: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """{pid: GPU indices on its node} of the alive actors that asked Ray for GPUs, as Ray's dashboard reports the
    processes NVML sees on each GPU (`/logical/actors?ids=...`: each actor's `gpus`); a process on no GPU, or one
    on a node without NVML, is left out. SourceUnavailable when the dashboard does not answer."""
    wanted: dict[str, int] = {}
    for actor in actors:
        resources = actor.get("required_resources") or {}
        asks_gpu = isinstance(resources, Mapping) and any(
            str(name).startswith("GPU") and _positive(amount) for name, amount in resources.items())
        if actor.get("state") == "ALIVE" and actor.get("pid") and actor.get("actor_id") and asks_gpu:
            wanted[str(actor["actor_id"])] = int(actor["pid"])
    if not wanted:
        return {}
    body = api.get_json(f"/logical/actors?ids={','.join(list(wanted)[:MAX_PROCESSES])}")
    data = body.get("data") if isinstance(body, dict) else None
    infos = data.get("actors") if isinstance(data, dict) else None
    found: dict[int, str] = {}
    for actor_id, info in infos.items() if isinstance(infos, dict) else ():
        gpus = info.get("gpus") if isinstance(info, dict) else None
        indices = sorted({g["index"] for g in gpus or () if isinstance(g, dict) and isinstance(g.get("index"), int)})
        if actor_id in wanted and indices:
            found[wanted[actor_id]] = ",".join(map(str, indices))
    return found


def _positive(amount: object) -> bool:
    try:
        return float(amount) > 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def take_job_stacks(
    dashboard_url: str,
    processes: Iterable[tuple[str, int, str | None, str | None]],
    *,
    states: ProcessStates | None = None,
    gpus: Mapping[int, str] | None = None,
    timeout_s: float = 30.0,
    pool: ThreadPoolExecutor | None = None,
) -> list[ProcessStack]:
    """One sample: every process's stack (in parallel), its state letter and its GPUs (`gpus`, by pid).

    The states are read first, and a stopped process (T, or t under a tracer) is not handed to py-spy: py-spy cannot
    read it anyway ("Failed to suspend process"), and its ptrace attach and detach can set the process running again,
    which would change the very scene being kept (seen on a 2-core machine: a SIGSTOPped rank read R after py-spy)."""
    processes = list(processes)
    letters: dict[tuple[str | None, int], str] = {}
    if states is not None:
        by_ip: dict[str | None, list[int]] = {}
        for _, pid, _, ip in processes:
            by_ip.setdefault(ip, []).append(pid)
        for ip, pids in by_ip.items():
            letters.update({(ip, pid): s for pid, s in states.of(ip, pids).items()})
    own = pool is None
    pool = pool or ThreadPoolExecutor(max_workers=8, thread_name_prefix="argus-stacks")
    try:
        futures = {(ip, pid): pool.submit(take_stack, dashboard_url, pid, node_id, timeout_s)
                   for _, pid, node_id, ip in processes if letters.get((ip, pid)) not in LEFT_ALONE}
        dumps: list[tuple[str | None, str | None]] = []
        for _, pid, _, ip in processes:
            future = futures.get((ip, pid))
            if future is None:
                dumps.append((None, f"not sampled: the process is stopped (state {letters[(ip, pid)]}); py-spy "
                                    "cannot read a stopped process and its attach could set it running"))
                continue
            try:
                dumps.append((future.result(), None))
            except Exception as exc:  # noqa: BLE001 - a stack py-spy cannot take is evidence too
                dumps.append((None, str(exc)[:500]))
    finally:
        if own:
            pool.shutdown(wait=False)
    return [ProcessStack(label, pid, node_id, ip, dump, error, letters.get((ip, pid)), (gpus or {}).get(pid))
            for (label, pid, node_id, ip), (dump, error) in zip(processes, dumps, strict=True)]


class RankStackSampler:
    """A collector of stack samples for the jobs `requests()` names (the stall detector's suspects).

    Each request is two samples `gap_s` apart, taken off the loop's thread; a request made again while its samples
    are being taken is not taken twice. What is done is returned by the next `collect()` as one STACKS signal per
    job: attrs `samples` (two lists of ProcessStack attrs, oldest first) and `sampled_at` (each sample's time)."""

    name = "rank_stacks"

    def __init__(
        self,
        dashboard_url: str,
        requests: Callable[[], Iterable[str]],
        *,
        gap_s: float = 2.0,
        timeout_s: float = 10.0,
        states: ProcessStates | None = None,
        api: RayStateApi | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dashboard_url = dashboard_url.rstrip("/")
        self._requests = requests
        self.gap_s = gap_s
        self.timeout_s = timeout_s
        self._states = states if states is not None else ProcessStates()
        self._api = api or RayStateApi(self.dashboard_url, timeout_s)
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="argus-hang-samples")
        self._stacks_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="argus-stacks")
        self._running: dict[str, Future[Signal | None]] = {}
        self._lock = threading.Lock()

    def collect(self) -> list[Signal]:
        signals: list[Signal] = []
        with self._lock:
            for sid, future in list(self._running.items()):
                if not future.done():
                    continue
                del self._running[sid]
                try:
                    signal = future.result()
                except ArgusError as exc:
                    logger.info("stacks of job {} could not be taken: {}", sid, exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - one job's samples must not stop the loop
                    logger.opt(exception=exc).warning("stacks of job {} could not be taken", sid)
                    continue
                if signal is not None:
                    signals.append(signal)
            for sid in self._requests():
                if sid not in self._running:
                    self._running[sid] = self._pool.submit(self._sample, sid)
        return signals

    def pending(self) -> list[str]:
        """The jobs whose samples are being taken now."""
        with self._lock:
            return sorted(self._running)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stacks_pool.shutdown(wait=False, cancel_futures=True)

    def _sample(self, submission_id: str) -> Signal | None:
        found = job_processes(self._api, submission_id)
        if not found.processes:
            return None
        samples: list[list[dict[str, Any]]] = []
        times: list[str] = []
        gpus = gpus_or_none(self._api, found.actors)
        for n in range(2):
            if n:
                self._sleep(self.gap_s)
            times.append(utcnow().isoformat())
            stacks = take_job_stacks(self.dashboard_url, found.processes, states=self._states, gpus=gpus,
                                     timeout_s=self.timeout_s, pool=self._stacks_pool)
            samples.append([s.as_attrs() for s in stacks])
        return Signal(
            kind=SignalKind.STACKS,
            source=f"{self.dashboard_url}/worker/traceback",
            subject=Subject(kind=SubjectKind.JOB, id=submission_id),
            observed_at=utcnow(),
            attrs={keys.SAMPLES: samples, keys.SAMPLED_AT: times, keys.JOB_ID: found.job_id},
        )


def gpus_or_none(api: RayStateApi, actors: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """actor_gpus, or {} when the dashboard cannot say: a rank's GPU is worth naming, not worth a missing stack."""
    try:
        return actor_gpus(api, actors)
    except ArgusError as exc:
        logger.debug("GPUs of the job's actors not known: {}", exc)
        return {}
