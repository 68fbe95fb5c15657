"""Process states for the hang scene and the stack sampler (collectors/rank_stacks.py): /proc on this host (a real
stopped process), `ps` output from a remote node, and what is not known staying unknown."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from collectors.rank_stacks import ProcessStates, parse_ps_states
from tests.helpers import wait_until


def test_a_stopped_process_on_this_host_reads_as_state_t() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        # a signal is delivered when the child next runs
        wait_until("the child to stop", lambda: ProcessStates().of("127.0.0.1", [child.pid]).get(child.pid) == "T",
                   timeout=10, interval=0.05)
        states = ProcessStates().of("127.0.0.3", [child.pid, os.getpid(), 2**22 + 7])  # loopback is this host
        assert states[child.pid] == "T"
        assert states[os.getpid()] in {"R", "S"}
        assert 2**22 + 7 not in states  # no such process: not known, not guessed
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()


def test_the_state_follows_the_last_parenthesis_of_a_command_name_that_holds_some(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (python) evil) D 1 42 42 0 -1 4194560 0")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "stat").write_text("garbage without a state")
    assert ProcessStates(proc=tmp_path).of("127.0.0.1", [42, 43]) == {42: "D"}


def test_other_nodes_are_asked_through_remote_and_a_failing_remote_means_unknown() -> None:
    asked: list[tuple[str, list[int]]] = []

    def remote(ip: str, pids: list[int]) -> dict[int, str]:
        asked.append((ip, list(pids)))
        if ip == "10.0.0.9":
            raise TimeoutError("ssh timed out")
        return parse_ps_states(" 101 Tl\n 102 S+\nPID STAT\n")

    states = ProcessStates(remote=remote)
    assert states.of("10.0.0.8", [101, 102]) == {101: "T", 102: "S"}
    assert states.of("10.0.0.9", [7]) == {} and states.of(None, [7]) == {}
    assert ProcessStates().of("10.0.0.8", [101]) == {}  # no way to ask: unknown
    assert asked == [("10.0.0.8", [101, 102]), ("10.0.0.9", [7])]


def test_ps_output_that_is_not_ps_output_gives_nothing() -> None:
    assert parse_ps_states("") == {}
    assert parse_ps_states("error: list of process IDs must follow -p\n" + "x" * 100_000) == {}
    assert parse_ps_states(" 12 Z\n 13 1\n") == {12: "Z"}


def test_pyspys_reason_comes_first_however_long_the_command_ray_quotes() -> None:
    from collectors.rank_stacks import _why

    text = ("Failed to execute `['/opt/" + "very-long-venv-path/" * 8 + "bin/py-spy', 'dump', '-p', '14683']`.\n\n"
            "=== stderr ===\nError: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n"
            "    1: unexpected waitpid result PtraceEvent(Pid(14683), SIGSTOP, 128) to 14683\n\nStack backtrace:\n"
            "   0: <E as anyhow::context::ext::StdError>::ext_context\n")
    assert _why(text).startswith("Error: Failed to get stack traces 0: Failed to suspend process 1: unexpected")
    assert _why("HTTP went wrong") == "HTTP went wrong"
