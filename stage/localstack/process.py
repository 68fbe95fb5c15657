"""Child processes of the local stack: started in their own session, logged to a file, stopped by PID.

Every process runs in a new session, so its process group holds everything it forks and nothing else;
stopping walks that group and the psutil child tree, never a name pattern, so services of other
engineers on the same machine are never touched. A process-wide registry remembers what is running so
an entry point (the demo) can stop it all on Ctrl-C with `install_exit_handlers()`.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil
from loguru import logger

from core.errors import ArgusError, ConfigError

DEFAULT_GRACE_S = 10.0
_POLL_S = 0.2


class ProcessError(ArgusError):
    """A stack process failed to start, exited early or did not become ready; quotes its log tail."""

    def __init__(self, message: str, *, name: str, log_path: Path, log_tail: str, hint: str | None = None):
        shown = log_tail if log_tail.strip() else "(log is empty)"
        super().__init__(f"{message}; last lines of {log_path}:\n{shown}", hint=hint)
        self.name = name
        self.log_path = log_path
        self.log_tail = log_tail


T = TypeVar("T")


class StackTimeout(ArgusError, TimeoutError):
    """A wait on the local stack (a node state, a series, a webhook) ran out of time."""


def poll_until(what: str, check: Callable[[], T], timeout: float, interval: float = 0.2) -> T:
    """The first truthy value of `check()`, polled every `interval` s; StackTimeout naming `what` after
    `timeout` s (the tests' helper raises AssertionError instead: tests/helpers.py wait_until)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise StackTimeout(f"timed out after {timeout:.0f}s waiting for {what}", hint="see the logs under the work dir")


class Stoppable(Protocol):
    def stop(self) -> None: ...


class Registry:
    """What is running now, stopped last-started-first by `stop_all`."""

    def __init__(self) -> None:
        self._items: list[Stoppable] = []
        self._lock = threading.Lock()

    def add(self, item: Stoppable) -> None:
        with self._lock:
            if item not in self._items:
                self._items.append(item)

    def discard(self, item: Stoppable) -> None:
        with self._lock:
            if item in self._items:
                self._items.remove(item)

    def items(self) -> list[Stoppable]:
        with self._lock:
            return list(self._items)

    def stop_all(self) -> None:
        for item in reversed(self.items()):
            try:
                item.stop()
            except Exception as exc:  # one stubborn process must not keep the others running
                logger.warning("stopping {} failed: {}", item, exc)
            self.discard(item)


REGISTRY = Registry()


def install_exit_handlers(registry: Registry = REGISTRY) -> None:
    """Stop everything in `registry` at interpreter exit, on SIGTERM and on Ctrl-C (for entry points)."""
    atexit.register(registry.stop_all)

    def on_signal(signum: int, _frame: Any) -> None:
        registry.stop_all()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as gone (it holds no resources but a table slot)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _tree(pid: int, *, include_root: bool = True) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        if include_root:
            found[pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter():
        try:
            if proc.pid not in found and os.getpgid(proc.pid) == pid and (include_root or proc.pid != pid):
                found[proc.pid] = proc
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return [p for p in found.values() if is_alive(p.pid)]


def _stop_procs(procs: list[psutil.Process], grace: float, sig: int) -> list[int]:
    # psutil.Process checks the creation time before signalling, so a pid reused meanwhile is left alone.
    signalled = []
    for proc in procs:
        try:
            proc.send_signal(sig)
            signalled.append(proc)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    _, alive = psutil.wait_procs(signalled, timeout=grace)
    alive = [p for p in alive if is_alive(p.pid)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    if alive:
        psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


def stop_pids(pids: Iterable[int], *, grace: float = DEFAULT_GRACE_S, sig: int = signal.SIGTERM) -> list[int]:
    """Send `sig` to every pid, SIGKILL what is still alive after `grace` s; return the pids that were killed."""
    procs = []
    for pid in dict.fromkeys(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return _stop_procs(procs, grace, sig)


def run_check(argv: list[str], what: str, hint: str) -> None:
    """Run a config checker (promtool, amtool, sshd -t) and raise ConfigError quoting it when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: `{' '.join(argv)}` did not finish within 60 s", hint=hint) from None
    if done.returncode != 0:
        out = (done.stdout + done.stderr).strip()
        raise ConfigError(f"{what} failed (`{' '.join(argv)}`, exit {done.returncode}):\n{out}", hint=hint)


def tail(path: Path, lines: int = 40, max_bytes: int = 64_000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class ManagedProcess:
    """One child process with a log file, a readiness wait and a by-PID stop of its whole tree."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        registry: Registry | None = REGISTRY,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.cwd = cwd
        self._registry = registry
        self._popen: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> ManagedProcess:
        if self.running():
            return self
        self._stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ProcessError(
                    f"cannot start {self.name} ({self.argv[0]}): {exc}",
                    name=self.name,
                    log_path=self.log_path,
                    log_tail=tail(self.log_path),
                    hint="check that the program is installed and executable",
                ) from None
        if self._registry is not None:
            self._registry.add(self)
        logger.debug("started {} pid={} log={}", self.name, self.pid, self.log_path)
        return self

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `check` until it returns True; raise ProcessError if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        last_error = ""
        while True:
            rc = self.returncode
            if self._popen is None:
                raise ProcessError(
                    f"{self.name} was never started", name=self.name, log_path=self.log_path, log_tail=""
                )
            if rc is not None:
                raise ProcessError(
                    f"{self.name} (pid {self.pid}) exited with code {rc} before {what}",
                    name=self.name,
                    log_path=self.log_path,
                    log_tail=self.log_tail(),
                    hint="the log above says why it exited",
                )
            try:
                if check():
                    return
            except Exception as exc:  # not ready yet: a refused connection is the normal case
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                detail = f" (last check: {last_error[:300]})" if last_error else ""
                raise ProcessError(
                    f"{self.name} (pid {self.pid}) did not become ready within {timeout:.0f} s: "
                    f"waited for {what}{detail}",
                    name=self.name,
                    log_path=self.log_path,
                    log_tail=self.log_tail(),
                    hint="the machine may be overloaded; otherwise the log above says what is wrong",
                )
            time.sleep(_POLL_S)

    def _procs(self) -> list[psutil.Process]:
        if self._popen is None:
            return []
        pid = self._popen.pid
        if self._popen.poll() is None:
            return _tree(pid)
        if is_alive(pid):
            # Ours was reaped, so this pid now belongs to someone else and our group is already empty.
            return []
        return _tree(pid, include_root=False)

    def pids(self) -> list[int]:
        """The live pids of this process, its descendants and its process group."""
        return [p.pid for p in self._procs()]

    def stop(self, grace: float = DEFAULT_GRACE_S) -> None:
        """SIGTERM the process, then its leftovers, SIGKILL after `grace` s. Idempotent."""
        if self._popen is None or self._stopped:
            return
        pid = self._popen.pid
        members = self._procs()
        if self._popen.poll() is None:
            try:
                self._popen.send_signal(signal.SIGTERM)
                self._popen.wait(timeout=grace)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                logger.warning("{} (pid {}) ignored SIGTERM for {:.0f} s; killing it", self.name, pid, grace)
        if self._popen.poll() is None:
            # Through Popen, not psutil: psutil would reap it and Popen would then report exit code 0.
            self._popen.kill()
            try:
                self._popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                logger.warning("{} (pid {}) survived SIGKILL", self.name, pid)
        # Children the parent did not take down, or forked while it shut down.
        seen = {p.pid for p in members}
        leftovers = [p for p in members if p.pid != pid and is_alive(p.pid)]
        leftovers += [p for p in self._procs() if p.pid not in seen]
        if leftovers:
            _stop_procs(leftovers, min(grace, 3.0), signal.SIGTERM)
        self._stopped = True
        if self._registry is not None:
            self._registry.discard(self)

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
