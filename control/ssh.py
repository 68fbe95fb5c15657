"""Running argv lists on a node over SSH (asyncssh), trusting only the node's pinned host key.

known_hosts is built from NodeSpec.host_key alone: ~/.ssh/known_hosts, ~/.ssh/config and an SSH agent
are never consulted, so a node answers with exactly the pinned key or not at all.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncssh
from loguru import logger

from control.nodes import NodeSpec
from core.errors import ArgusError, InputError, SourceUnavailable

_MAX_OUTPUT = 1_000_000  # characters kept per stream; a probe or ray start prints far less


class HostKeyRejected(SourceUnavailable):
    """The node presented a host key other than the pinned one."""


@dataclass(frozen=True)
class CommandOutcome:
    """What one remote command did. `exit_status` None: it was cut off by the timeout or a signal."""

    argv: tuple[str, ...]
    exit_status: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def describe(self) -> str:
        status = "timed out" if self.timed_out else f"exited {self.exit_status}"
        tail = (self.stderr.strip() or self.stdout.strip())[-400:]
        return f"`{shlex.join(self.argv)[:200]}` {status}" + (f": {tail}" if tail else "")


class CommandRunner(Protocol):
    """Runs argv lists on one node. SshRunner is the real one; NodeManager takes a factory of these."""

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None) -> CommandOutcome: ...

    def run_all(self, commands: Sequence[Sequence[str]]) -> list[CommandOutcome]: ...


def _known_hosts_line(spec: NodeSpec) -> str:
    host = spec.host if spec.ssh_port == 22 else f"[{spec.host}]:{spec.ssh_port}"
    return f"{host} {spec.host_key}\n"


def _argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str) or not all(isinstance(a, str) for a in argv) or not argv:
        raise InputError(f"a command must be a non-empty list of strings, got {argv!r}",
                         hint="build it with control.commands; strings are never passed to a shell")
    return tuple(argv)


class SshRunner:
    """Runs commands on `spec.host` as `spec.ssh_user` with `spec.ssh_key_path`; one connection per batch."""

    def __init__(self, spec: NodeSpec, *, connect_timeout_s: float = 15.0, command_timeout_s: float = 180.0):
        self.spec = spec
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s

    @property
    def address(self) -> str:
        return f"{self.spec.ssh_user}@{self.spec.host}:{self.spec.ssh_port}"

    async def _connect(self) -> asyncssh.SSHClientConnection:
        spec = self.spec
        try:
            known_hosts = asyncssh.import_known_hosts(_known_hosts_line(spec))
        except (ValueError, asyncssh.Error) as exc:
            raise InputError(f"node {spec.name}: the pinned host key cannot be read: {exc}",
                             hint="pin the line from the node's ssh_host_*_key.pub") from None
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    spec.host,
                    port=spec.ssh_port,
                    username=spec.ssh_user,
                    client_keys=[spec.ssh_key_path],
                    known_hosts=known_hosts,
                    agent_path=None,
                    config=[],  # an empty list, not (): () would load ~/.ssh/config
                    login_timeout=self.connect_timeout_s,
                ),
                self.connect_timeout_s,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyRejected(
                f"SSH on node {spec.name}", f"{spec.host}:{spec.ssh_port}",
                f"its host key does not match the pinned one ({exc.reason})",
                hint=f"if the node was reinstalled, verify its new key out of band and re-pin host_key for "
                     f"{spec.name}; otherwise someone may be intercepting the connection",
            ) from None
        except asyncssh.PermissionDenied as exc:
            raise SourceUnavailable(
                f"SSH on node {spec.name}", self.address, f"login refused ({exc.reason})",
                hint=f"add the public key of {spec.ssh_key_path} to {spec.ssh_user}'s authorized_keys there",
            ) from None
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            cause = "connection timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            if isinstance(exc, FileNotFoundError | PermissionError) and spec.ssh_key_path in str(exc):
                raise SourceUnavailable(f"SSH key for node {spec.name}", spec.ssh_key_path, cause,
                                        hint="fix ssh_key_path: Argus must be able to read the key") from None
            raise SourceUnavailable(
                f"SSH on node {spec.name}", self.address, cause,
                hint="check that the node is up, sshd listens on that port and the network allows it",
            ) from None

    async def _run_one(self, conn: asyncssh.SSHClientConnection, argv: tuple[str, ...],
                       timeout_s: float) -> CommandOutcome:
        started = time.monotonic()
        command = shlex.join(argv)
        logger.debug("ssh {}: {}", self.spec.name, command[:300])
        try:
            result = await asyncio.wait_for(conn.run(command, check=False), timeout_s)
        except asyncio.TimeoutError:
            return CommandOutcome(argv, None, "", f"no result within {timeout_s:.0f} s",
                                  time.monotonic() - started, timed_out=True)
        except (OSError, asyncssh.Error) as exc:
            raise SourceUnavailable(f"SSH on node {self.spec.name}", self.address,
                                    f"the connection broke while running {argv[0]}: {exc}",
                                    hint="check the node and retry") from None
        return CommandOutcome(
            argv,
            result.exit_status if result.exit_status is not None and result.exit_status >= 0 else None,
            _text(result.stdout),
            _text(result.stderr),
            time.monotonic() - started,
        )

    async def arun_all(self, commands: Sequence[Sequence[str]], *,
                       timeout_s: float | None = None) -> list[CommandOutcome]:
        argvs = [_argv(c) for c in commands]
        conn = await self._connect()
        try:
            return [await self._run_one(conn, a, timeout_s or self.command_timeout_s) for a in argvs]
        finally:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (asyncio.TimeoutError, OSError, asyncssh.Error):
                pass

    async def arun(self, argv: Sequence[str], *, timeout_s: float | None = None) -> CommandOutcome:
        return (await self.arun_all([argv], timeout_s=timeout_s))[0]

    # -- the sync facade, for callers without an event loop -----------------------------------------

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None) -> CommandOutcome:
        return _sync(self.arun(argv, timeout_s=timeout_s))

    def run_all(self, commands: Sequence[Sequence[str]]) -> list[CommandOutcome]:
        return _sync(self.arun_all(commands))


def _text(value: object) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")
    return text[-_MAX_OUTPUT:]


_T = TypeVar("_T")


def _sync(coro: Coroutine[Any, Any, _T]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise ArgusError("SshRunner.run was called inside a running event loop",
                     hint="await SshRunner.arun/arun_all there, or call run from a worker thread")
