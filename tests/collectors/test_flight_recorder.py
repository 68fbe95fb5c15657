"""PyTorch flight recorder dumps for the hang scene (collectors/flight_recorder.py): which variables turn it on,
what a real dump says (tests/fixtures/flight_recorder), hostile and broken files, and finding and copying dumps on
this host (/proc of real processes) and on a remote node (the same shell commands SSH would run, run here)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from collectors.flight_recorder import DEFAULT_PREFIX, FlightRecorderReader, FlightRecords, recorder_of, summarize
from control.local import LocalRunner

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
REMOTE_IP = "10.255.0.7"  # never contacted: the remote commands run on this host through LocalRunner


def real_dump(rank: int) -> bytes:
    return (FIXTURES / f"trace_rank_{rank}").read_bytes()


def test_the_recorder_is_on_only_with_a_buffer_and_dumps_where_its_variables_say() -> None:
    assert recorder_of({}, "env") is None
    assert recorder_of({"TORCH_FR_BUFFER_SIZE": "0"}, "env") is None
    assert recorder_of({"TORCH_FR_BUFFER_SIZE": "lots"}, "env") is None
    on = recorder_of({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, "env")  # the older names still work
    assert on is not None and (on.buffer, on.prefix) == (2000, DEFAULT_PREFIX)
    on = recorder_of({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/nfs/fr/rank_"}, "env")
    assert on is not None and on.prefix == "/nfs/fr/rank_"
    # a prefix that names no file in a known folder is no place to look
    assert recorder_of({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "fr/rank_"}, "env") is None
    assert recorder_of({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "/tmp/"}, "env") is None


def test_a_real_dump_says_which_collective_each_rank_entered_last() -> None:
    assert summarize(real_dump(0)) == {"entries": 4, "last_seq": 4, "last_op": "gloo:all_reduce",
                                       "last_state": "scheduled"}
    assert summarize(real_dump(1))["last_seq"] == 3


def test_a_hostile_or_broken_file_is_refused_without_running_anything(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    for data in (pickle.dumps(Evil()), pickle.dumps({"entries": [Evil()]}), real_dump(0)[:200], b"",
                 b"\x80\x05" + os.urandom(4096), pickle.dumps(["not", "a", "dump"]), pickle.dumps({"entries": 3})):
        with pytest.raises(ValueError, match="not a flight recorder dump"):
            summarize(data)
    assert not marker.exists()


@pytest.fixture
def process_with_recorder(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A real process whose environment turns the recorder on, dumping under tmp_path/fr/trace_rank_."""
    (tmp_path / "fr").mkdir()
    prefix = tmp_path / "fr" / "trace_rank_"
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200", "TORCH_FR_DUMP_TEMP_FILE": str(prefix)}
    # The child says when it runs: until its exec, /proc/<pid>/environ is still this process's, without the recorder.
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], env=env,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    try:
        yield child.pid, prefix
    finally:
        child.kill()
        child.wait()


def test_dumps_on_this_host_are_found_from_the_process_environment_and_copied(
        process_with_recorder: tuple[int, Path]) -> None:
    pid, prefix = process_with_recorder
    for rank in (0, 1):
        Path(f"{prefix}{rank}").write_bytes(real_dump(rank))
    old = Path(f"{prefix}7")  # another job's dump, from before this job started
    old.write_bytes(real_dump(0))
    started = datetime.now(timezone.utc) - timedelta(minutes=5)
    os.utime(old, (started.timestamp() - 3600, started.timestamp() - 3600))
    Path(f"{prefix}1.part").write_bytes(b"half written")

    records = FlightRecorderReader().read([(pid, "127.0.0.1"), (pid, None)], since=started)
    assert records.recorders["127.0.0.1"].source == "process environment"
    by_rank = {d.rank: d for d in records.dumps if d.rank is not None}
    assert set(by_rank) == {0, 1}, records.dumps
    assert by_rank[0].data == real_dump(0) and by_rank[1].last_seq == 3
    [part] = [d for d in records.dumps if d.rank is None]  # kept, said to be no dump it can read
    assert part.error is not None and "not a flight recorder dump" in part.error
    assert records.sentence() == ("flight recorder: rank 1 last entered collective #3 (gloo:all_reduce, scheduled), "
                                  "behind rank 0 at #4 (gloo:all_reduce, scheduled)")
    as_json = records.as_json()
    assert as_json["sentence"] == records.sentence() and len(as_json["dumps"]) == 3


def test_no_recorder_no_dump_and_limits_are_said(tmp_path: Path, process_with_recorder: tuple[int, Path]) -> None:
    pid, prefix = process_with_recorder
    assert not FlightRecorderReader().read([(os.getpid(), "127.0.0.1")]).enabled  # this process has no recorder
    on_but_quiet = FlightRecorderReader().read([(pid, "127.0.0.1")])
    assert on_but_quiet.enabled and on_but_quiet.dumps == ()
    assert "no rank has dumped it yet" in on_but_quiet.sentence()
    # a process gone: its job's runtime_env says where the dumps would be
    gone = FlightRecorderReader().read([(2**22 + 9, "127.0.0.1")], job_env={
        "TORCH_FR_BUFFER_SIZE": "5", "TORCH_FR_DUMP_TEMP_FILE": str(prefix)})
    assert gone.recorders["127.0.0.1"].source == "job runtime_env"
    for n in range(5):
        Path(f"{prefix}{n}").write_bytes(real_dump(n % 2))
    Path(f"{prefix}9").write_bytes(b"x" * 5000)
    limited = FlightRecorderReader(max_files=3, max_file_bytes=4000).read([(pid, "127.0.0.1")])
    assert len(limited.dumps) == 3 and any("the first 3 kept" in p for p in limited.problems)
    big = FlightRecorderReader(max_file_bytes=4000).read([(pid, "127.0.0.1")])
    [too_big] = [d for d in big.dumps if d.rank == 9]
    assert too_big.data is None and too_big.error is not None and "left on the node" in too_big.error


def on_node_here(calls: list[tuple[str, list[str]]]) -> object:
    runner = LocalRunner()

    def run(ip: str, argv: Sequence[str]) -> str | None:
        calls.append((ip, list(argv)))
        outcome = runner.run(list(argv), timeout_s=30)
        return outcome.stdout if outcome.ok or outcome.stdout else None

    return run


def test_dumps_on_a_remote_node_come_through_its_commands(process_with_recorder: tuple[int, Path]) -> None:
    pid, prefix = process_with_recorder
    Path(f"{prefix}0").write_bytes(real_dump(0))
    Path(f"{prefix}1").write_bytes(real_dump(1))
    calls: list[tuple[str, list[str]]] = []
    records = FlightRecorderReader(on_node_here(calls)).read([(pid, REMOTE_IP)])  # type: ignore[arg-type]
    assert {ip for ip, _ in calls} == {REMOTE_IP}
    assert records.recorders[REMOTE_IP].prefix == str(prefix)
    assert sorted((d.rank, d.data) for d in records.dumps) == [(0, real_dump(0)), (1, real_dump(1))]
    assert "rank 1 last entered collective #3" in records.sentence()
    # a prefix with shell words in it is one argument, never a command
    hostile = f"{prefix}$(touch {prefix}pwned);"
    records = FlightRecorderReader(on_node_here(calls)).read(  # type: ignore[arg-type]
        [(2**22 + 9, REMOTE_IP)], job_env={"TORCH_FR_BUFFER_SIZE": "5", "TORCH_FR_DUMP_TEMP_FILE": hostile})
    assert records.dumps == () and not Path(f"{prefix}pwned").exists()
    # a node that cannot be reached: nothing found, and said so
    unreachable = FlightRecorderReader(lambda ip, argv: None).read(
        [(pid, REMOTE_IP)], job_env={"TORCH_FR_BUFFER_SIZE": "5", "TORCH_FR_DUMP_TEMP_FILE": str(prefix)})
    assert unreachable.dumps == () and any("cannot list" in p for p in unreachable.problems)


def test_without_a_way_to_the_node_a_remote_rank_says_nothing() -> None:
    assert FlightRecorderReader().read([(1, REMOTE_IP)]) == FlightRecords()


def test_a_dump_seen_from_several_nodes_is_kept_once(process_with_recorder: tuple[int, Path]) -> None:
    # The loopback cluster's nodes share this host's files, and a prefix on NFS is seen from every node alike.
    pid, prefix = process_with_recorder
    Path(f"{prefix}0").write_bytes(real_dump(0))
    local = FlightRecorderReader().read([(pid, "127.0.0.2"), (pid, "127.0.0.3"), (pid, "127.0.0.4")])
    assert [d.rank for d in local.dumps] == [0]
    calls: list[tuple[str, list[str]]] = []
    shared = FlightRecorderReader(on_node_here(calls)).read(  # type: ignore[arg-type]
        [(pid, "10.255.0.7"), (pid, "10.255.0.8")])
    assert [d.rank for d in shared.dumps] == [0] and {ip for ip, _ in calls} == {"10.255.0.7", "10.255.0.8"}
