"""A real sshd reached with asyncssh: pinned host key, client key, a command."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

from stage.localstack.process import is_alive
from stage.localstack.sshd import Sshd

pytestmark = pytest.mark.sshd


def _run(sshd: Sshd, known_hosts: asyncssh.SSHKnownHosts, command: str) -> asyncssh.SSHCompletedProcess:
    async def go() -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(
            sshd.host, sshd.port, username=sshd.user, client_keys=[str(sshd.client_key)],
            known_hosts=known_hosts, connect_timeout=30,
        ) as conn:
            return await conn.run(command, check=True, timeout=30)

    return asyncio.run(go())


def test_runs_a_command_with_the_pinned_host_key(sshd):
    known = asyncssh.import_known_hosts(f"[{sshd.host}]:{sshd.port} {sshd.host_public_key}\n")
    result = _run(sshd, known, "echo hello")
    assert result.stdout == "hello\n"
    assert sshd.known_hosts.read_text().strip() == sshd.known_hosts_line()


def test_unknown_host_key_is_refused(sshd):
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = asyncssh.import_known_hosts(f"[{sshd.host}]:{sshd.port} {other}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        _run(sshd, known, "echo hello")


def test_stop_leaves_no_process(tmp_workdir):
    server = Sshd(tmp_workdir / "sshd").start()
    pids = server.process.pids()
    assert pids
    server.stop()
    server.stop()
    assert [p for p in pids if is_alive(p)] == []
