"""Fixtures for the real local stack: Ray cluster, Prometheus + Alertmanager, sshd, webhook receiver.

Each starts only when a test asks for it and is stopped by PID. When a test fails, the logs of the stack
pieces it used are copied into test-artifacts/<test node id>/. Tests using a piece are marked with its
marker automatically, so `-m "not ray"` leaves out everything that starts Ray.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from argus.store.store import Store
from stage.localstack.alertmanager import Alertmanager
from stage.localstack.process import REGISTRY
from stage.localstack.prometheus import Prometheus
from stage.localstack.ray_cluster import RayCluster, RayNode
from stage.localstack.sshd import Sshd
from stage.localstack.webhook_receiver import WebhookReceiver

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

# fixture name -> the markers a test using it gets
_MARKERS = {
    "ray_cluster": ("ray",),
    "ray_faults": ("ray",),
    "prometheus_stack": ("prometheus", "ray"),
    "sshd": ("sshd",),
}

# fixture name -> the running object (with log_paths()) or folder, for copying logs after a failure
_LIVE: dict[str, Any] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in _MARKERS.items():
            if fixture in names:
                for marker in markers:
                    if item.get_closest_marker(marker) is None:
                        item.add_marker(marker)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A safety net for processes a crashed fixture could not stop; normally the registry is empty here.
    REGISTRY.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        try:
            _save_artifacts(item, report.when)
        except Exception as exc:  # never hide the test's own failure behind a copying problem
            report.sections.append(("test-artifacts", f"copying logs failed: {exc}"))


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180]


def _ignore_special(folder: str, names: list[str]) -> list[str]:
    skip = []
    for name in names:
        try:
            mode = Path(folder, name).lstat().st_mode
        except OSError:
            skip.append(name)
            continue
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            skip.append(name)
    return skip


def _copy(path: Path, dest: Path) -> None:
    # The last folders name it: <stack dir>-ray-head.log, h-session_...-logs.
    target = dest / "-".join(part for part in path.parts[-3:] if part != path.anchor)
    if path.is_dir():
        try:
            shutil.copytree(path, target, ignore=_ignore_special, ignore_dangling_symlinks=True,
                            dirs_exist_ok=True)
        except shutil.Error:
            pass  # a Ray log rotated away mid-copy; the rest was copied
    elif path.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _save_artifacts(item: pytest.Item, when: str) -> None:
    dest = ARTIFACTS / _safe_name(item.nodeid)
    names = set(getattr(item, "fixturenames", ()))
    for name in sorted(names & set(_LIVE)):
        obj = _LIVE[name]
        out = dest / name
        out.mkdir(parents=True, exist_ok=True)
        if isinstance(obj, Path):
            _copy(obj, out)
        elif isinstance(obj, WebhookReceiver):
            (out / "received.json").write_text(json.dumps(obj.received, indent=2, default=str))
        else:
            for path in obj.log_paths():
                _copy(Path(path), out)
    if dest.exists():
        (dest / "phase.txt").write_text(f"failed during {when}\n")


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Work folder for the session-wide stack pieces (configs, data, process logs)."""
    return tmp_path_factory.mktemp("localstack")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real SQLite incident store in the test's own folder (a folder's conftest may override it, e.g. with a
    hand-moved clock)."""
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    yield s
    s.close()


@pytest.fixture
def tmp_workdir() -> Iterator[Path]:
    """A fresh, short folder under /tmp (unix socket paths must stay under 107 bytes); removed after."""
    path = Path(tempfile.mkdtemp(prefix="ag-t-", dir="/tmp"))
    _LIVE["tmp_workdir"] = path
    try:
        yield path
    finally:
        _LIVE.pop("tmp_workdir", None)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster(stack_dir: Path) -> Iterator[RayCluster]:
    """Head (0 CPUs) on 127.0.0.2; workers 1, 2 on 127.0.0.3/.4 advertising 4 GPUs each (no real GPUs);
    fast health checks (node DEAD in ~1 s).

    Shared by the whole session: a test that kills a worker uses `ray_faults`, which restarts it.
    """
    profiling = {"RAY_DASHBOARD_ENABLE_PROFILING": "1"}  # py-spy stacks for keep_scene, as the demo has them
    cluster = RayCluster(stack_dir / "ray", fast_health_check=True, worker_gpus=4, head_env=profiling,
                         worker_env=profiling)
    # Registered before start: if start fails, the failing test still gets the `ray start` logs.
    _LIVE["ray_cluster"] = cluster
    cluster.start(timeout=180)  # stops what it started when it fails
    try:
        yield cluster
    finally:
        cluster.stop()
        _LIVE.pop("ray_cluster", None)


@dataclass
class RayFaults:
    """Kills workers of the session cluster and restarts every killed one when the test ends."""

    cluster: RayCluster
    killed: list[int] = field(default_factory=list)

    def kill_worker(self, i: int, sig: int = signal.SIGKILL) -> float:
        """Kill worker i's raylet; return time.time() of the kill."""
        self.killed.append(i)
        return self.cluster.kill_worker(i, sig)

    def restart_worker(self, i: int, *, in_place: bool = False) -> RayNode:
        node = self.cluster.restart_worker(i, timeout=120, in_place=in_place)
        self.killed = [k for k in self.killed if k != i]
        return node

    def restore(self) -> None:
        for i in dict.fromkeys(self.killed):
            self.cluster.restart_worker(i, timeout=120)
        self.killed.clear()


@pytest.fixture
def ray_faults(ray_cluster: RayCluster) -> Iterator[RayFaults]:
    faults = RayFaults(ray_cluster)
    yield faults
    faults.restore()


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver().start()
    _LIVE["webhook_receiver"] = receiver
    try:
        yield receiver
    finally:
        receiver.stop()
        _LIVE.pop("webhook_receiver", None)


@dataclass
class PrometheusStack:
    """Prometheus scraping the session Ray cluster, alerting through Alertmanager into `receiver`.

    Add scrape targets with `prometheus.set_targets(job, ["host:port"])` and alert rules with
    `prometheus.add_rule_file(path)`; Alertmanager posts to `receiver` at path /alertmanager.
    """

    prometheus: Prometheus
    alertmanager: Alertmanager
    receiver: WebhookReceiver
    ray: RayCluster

    def log_paths(self) -> list[Path]:
        return self.prometheus.log_paths() + self.alertmanager.log_paths()

    def stop(self) -> None:
        self.prometheus.stop()
        self.alertmanager.stop()
        self.receiver.stop()


@pytest.fixture(scope="session")
def prometheus_stack(stack_dir: Path, ray_cluster: RayCluster) -> Iterator[PrometheusStack]:
    receiver = WebhookReceiver().start()
    alertmanager = Alertmanager(stack_dir / "alertmanager", webhook_url=f"{receiver.url}/alertmanager")
    prometheus = Prometheus(stack_dir / "prometheus", ray_sd_file=ray_cluster.sd_file)
    stack = PrometheusStack(prometheus, alertmanager, receiver, ray_cluster)
    _LIVE["prometheus_stack"] = stack
    try:
        alertmanager.start()
        prometheus.alertmanager_url = alertmanager.url
        prometheus.start()
    except BaseException:
        stack.stop()
        raise
    try:
        yield stack
    finally:
        stack.stop()
        _LIVE.pop("prometheus_stack", None)


@pytest.fixture(scope="session")
def sshd(stack_dir: Path) -> Iterator[Sshd]:
    server = Sshd(stack_dir / "sshd")
    _LIVE["sshd"] = server
    server.start()  # stops what it started when it fails
    try:
        yield server
    finally:
        server.stop()
        _LIVE.pop("sshd", None)


@pytest.fixture(scope="session")
def llm_server(stack_dir: Path) -> Iterator[Any]:
    """A real llama-server with the pinned small model at `.base_url`, named `.model` (OpenAI API).

    `make llm` installs both into a cache outside the repo. Without them the test is skipped, or fails
    where ARGUS_REQUIRE_LLM=1 says the LLM must be exercised.
    """
    import os

    from stage.localstack.llm import LlamaServer, llm_paths

    paths = llm_paths()
    if not paths.present:
        message = f"run `make llm` first ({paths.problem})"
        if os.environ.get("ARGUS_REQUIRE_LLM") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = LlamaServer(stack_dir / "llm", binary=paths.binary, model=paths.model)
    _LIVE["llm_server"] = server
    server.start(timeout=180)  # stops what it started when it fails
    try:
        yield server
    finally:
        server.stop()
        _LIVE.pop("llm_server", None)
