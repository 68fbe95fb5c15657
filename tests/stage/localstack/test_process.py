"""ManagedProcess, stop_pids, the registry and free ports, with real child processes."""

from __future__ import annotations

import signal
import socket
import sys

import pytest

from stage.localstack.ports import free_port, free_ports, is_free
from stage.localstack.process import ManagedProcess, ProcessError, Registry, is_alive, stop_pids


def test_stop_takes_down_the_whole_tree(tmp_workdir):
    proc = ManagedProcess(
        "tree", ["sh", "-c", "sleep 300 & sleep 300 & echo forked; wait"], log_path=tmp_workdir / "tree.log",
        registry=None,
    ).start()
    proc.wait_ready(lambda: "forked" in proc.log_tail() and len(proc.pids()) >= 3, 30, "children forked")
    pids = proc.pids()
    assert len(pids) >= 3
    proc.stop(grace=5)
    assert [p for p in pids if is_alive(p)] == []
    assert not proc.running()
    proc.stop()  # idempotent


def test_stop_kills_what_ignores_sigterm(tmp_workdir):
    # An ignored signal stays ignored across exec, so the sleep ignores SIGTERM too.
    proc = ManagedProcess(
        "stubborn", ["sh", "-c", "trap '' TERM; echo trapped; sleep 300"], log_path=tmp_workdir / "s.log",
        registry=None,
    ).start()
    proc.wait_ready(lambda: "trapped" in proc.log_tail(), 30, "the trap to be set")
    pids = proc.pids()
    proc.stop(grace=1)
    assert [p for p in pids if is_alive(p)] == []
    assert proc.returncode == -signal.SIGKILL


def test_readiness_timeout_names_the_process_and_quotes_its_log(tmp_workdir):
    proc = ManagedProcess(
        "slowpoke", ["sh", "-c", "echo hello-from-the-log; sleep 300"], log_path=tmp_workdir / "slow.log",
        registry=None,
    ).start()
    try:
        proc.wait_ready(lambda: "hello-from-the-log" in proc.log_tail(), 30, "its greeting")
        with pytest.raises(ProcessError) as info:
            proc.wait_ready(lambda: False, 1, "a port that never opens")
    finally:
        proc.stop(grace=2)
    message = str(info.value)
    assert "slowpoke" in message
    assert "a port that never opens" in message
    assert "hello-from-the-log" in message
    assert info.value.log_path == tmp_workdir / "slow.log"


def test_early_exit_reports_the_exit_code_and_log(tmp_workdir):
    proc = ManagedProcess("quitter", ["sh", "-c", "echo boom >&2; exit 3"], log_path=tmp_workdir / "q.log",
                          registry=None).start()
    with pytest.raises(ProcessError) as info:
        proc.wait_ready(lambda: False, 30, "never")
    assert "quitter" in str(info.value) and "exited with code 3" in str(info.value)
    assert "boom" in info.value.log_tail
    proc.stop()


def test_unstartable_program_is_a_process_error(tmp_workdir):
    proc = ManagedProcess("ghost", [str(tmp_workdir / "no-such-program")], log_path=tmp_workdir / "g.log",
                          registry=None)
    with pytest.raises(ProcessError, match="cannot start ghost"):
        proc.start()
    proc.stop()  # safe after a failed start


def test_registry_stops_everything_it_holds(tmp_workdir):
    registry = Registry()
    procs = [
        ManagedProcess(f"p{i}", [sys.executable, "-c", "import time; time.sleep(300)"],
                       log_path=tmp_workdir / f"p{i}.log", registry=registry).start()
        for i in range(2)
    ]
    assert len(registry.items()) == 2
    pids = [pid for p in procs for pid in p.pids()]
    registry.stop_all()
    assert registry.items() == []
    assert [p for p in pids if is_alive(p)] == []


def test_stop_pids_ends_plain_pids(tmp_workdir):
    proc = ManagedProcess("plain", ["sleep", "300"], log_path=tmp_workdir / "plain.log", registry=None).start()
    assert stop_pids([proc.pid], grace=5) == []  # ended by SIGTERM, nothing needed SIGKILL
    assert not is_alive(proc.pid)
    proc.stop()


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(5, min_port=20000)
    assert len(set(ports)) == 5
    assert all(p >= 20000 for p in ports)
    for port in ports:
        assert is_free(port)
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        assert not is_free(held.getsockname()[1])
