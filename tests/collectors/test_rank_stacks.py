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


class _Dashboard:
    """Stands in for Ray's dashboard route /logical/actors?ids=... with the shape Ray 2.60 answers on a GPU node
    (ray/dashboard/modules/node/datacenter.py: each actor's `gpus` are the node's GPUs whose NVML process list
    holds its pid); on this machine, without NVML, the real route answers `gpus: []` (checked live)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get_json(self, path: str) -> dict[str, object]:
        self.asked.append(path)
        gpu = {"index": 3, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5f1c", "utilizationGpu": 0,
               "memoryUsed": 70312, "memoryTotal": 81559, "processesPids": [{"pid": 4242, "gpuMemoryUsage": 70000}]}
        return {"result": True, "data": {"actors": {
            "a1": {"pid": 4242, "gpus": [gpu]},
            "a2": {"pid": 4243, "gpus": []},
            "a3": {"pid": 4244, "gpus": [{"index": "x"}, "junk"]},
        }}}


def test_a_ranks_gpu_comes_from_rays_view_of_its_process_on_the_nodes_gpus() -> None:
    from collectors.rank_stacks import actor_gpus
    from collectors.ray_api import RayStateApi
    from detectors.hang_stacks import ranks_of, who

    dashboard = _Dashboard()
    api = RayStateApi("http://127.0.0.1:1", 1, state_api=dashboard)
    actors = [{"actor_id": "a1", "pid": 4242, "state": "ALIVE", "required_resources": {"GPU": 1.0}},
              {"actor_id": "a2", "pid": 4243, "state": "ALIVE", "required_resources": {"GPU_group_abc": 1.0}},
              {"actor_id": "a3", "pid": 4244, "state": "ALIVE", "required_resources": {"GPU": 1}},
              {"actor_id": "a4", "pid": 4245, "state": "ALIVE", "required_resources": {"CPU": 1}},  # asks no GPU
              {"actor_id": "a5", "pid": 4246, "state": "DEAD", "required_resources": {"GPU": 1}}]
    assert actor_gpus(api, actors) == {4242: "3"}
    [asked] = dashboard.asked
    assert asked == "/logical/actors?ids=a1,a2,a3"
    assert actor_gpus(api, actors[3:]) == {} and len(dashboard.asked) == 1  # nothing to ask: no request
    [rank] = ranks_of([{"label": "Rank", "pid": 4242, "node_ip": "10.0.0.7", "dump": "", "gpu": "3"}])
    assert who(rank) == "Rank pid 4242 (node 10.0.0.7, GPU 3)"


def test_a_stopped_process_is_not_handed_to_py_spy_and_stays_stopped() -> None:
    """py-spy's ptrace attach and detach can set a SIGSTOPped process running again (a CI run read a stopped rank as
    R right after py-spy failed on it): the sample reads states first and asks for no stack of a stopped process."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from collectors.rank_stacks import take_job_stacks

    asked: list[int] = []

    class Dashboard(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            asked.append(int(parse_qs(urlparse(self.path).query)["pid"][0]))
            body = b"Thread 1 (idle): \"MainThread\"\n    all_reduce (distributed_c10d.py:3252)\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stopped, running = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_until("the child to stop", lambda: ProcessStates().of("127.0.0.1", [stopped.pid]).get(stopped.pid) == "T",
                   timeout=10, interval=0.05)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ranks = [("rank", stopped.pid, "n1", "127.0.0.1"), ("rank", running.pid, "n1", "127.0.0.1")]
        taken = take_job_stacks(url, ranks, states=ProcessStates())
        assert asked == [running.pid]
        assert (taken[0].state, taken[0].dump) == ("T", None)
        assert taken[0].error is not None and "stopped (state T)" in taken[0].error
        assert taken[1].dump is not None and "all_reduce" in taken[1].dump and taken[1].state in {"S", "R"}
        assert ProcessStates().of("127.0.0.1", [stopped.pid]) == {stopped.pid: "T"}
    finally:
        server.shutdown()
        for child in (stopped, running):
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
