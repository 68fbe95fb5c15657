"""What the stack's long-running services share: a work dir, a host and port, one ManagedProcess.

A service picks a free port at start() unless given one, launches its process, waits until it answers
and stops it again if it never does, so a failed start leaves nothing running.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import httpx

from stage.localstack.ports import free_port
from stage.localstack.process import DEFAULT_GRACE_S, ManagedProcess

if TYPE_CHECKING:  # typing.Self is new in 3.11; Argus runs on 3.10 too
    from typing_extensions import Self


class LocalService(ABC):
    """One process serving on `host`:`port`; port 0 means "any free port, chosen at start()"."""

    _label: ClassVar[str]  # how messages name the service
    _stop_grace: ClassVar[float] = DEFAULT_GRACE_S

    def __init__(self, work_dir: Path, *, host: str, port: int) -> None:
        self.work_dir = Path(work_dir)
        self.host = host
        self._port = port
        self.process: ManagedProcess | None = None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{self._label} has no port before start()")
        return self._port

    @abstractmethod
    def start(self) -> Self:
        """Start the service unless it is running, and return it; subclasses add a `timeout`."""

    def _running(self) -> bool:
        return self.process is not None and self.process.running()

    def _prepare(self) -> None:
        """Create the work dir and, unless one was given, pick a free port."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self._port:
            self._port = free_port()

    def _launch(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready_check: Callable[[], bool],
        what: str,
        timeout: float,
    ) -> None:
        """Start the process and wait until `ready_check` passes; stop it again if it never does."""
        self.process = ManagedProcess(name, argv, log_path=log_path)
        self.process.start()
        try:
            self.process.wait_ready(ready_check, timeout, what)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=self._stop_grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpService(LocalService):
    """A LocalService with an HTTP API at `url` and a Prometheus-style `/-/ready` endpoint."""

    def __repr__(self) -> str:
        return f"{self._label}({self.url if self.process else 'not started'})"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _ready(self) -> bool:
        return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200

    def _launch_http(self, name: str, argv: Sequence[str], timeout: float) -> None:
        """Launch with the log in `<work_dir>/<name>.log` and wait for /-/ready to answer 200."""
        self._launch(name, argv, self.work_dir / f"{name}.log", self._ready,
                     f"{self.url}/-/ready to answer 200", timeout)
