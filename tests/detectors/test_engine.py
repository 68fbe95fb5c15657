"""The log rule engine: loading and validating rule files, matching, and hostile input.

One file past 400 lines on purpose: the engine's rule files, matching and hostile input share fixtures."""

from __future__ import annotations

import functools
import io
import random
import textwrap
from pathlib import Path

import pytest

from core.errors import RuleError
from core.types import Category, Severity
from detectors.engine import (
    MAX_LINE_BYTES,
    MAX_LINE_CHARS,
    RuleSet,
    RuleType,
    ScanStats,
    builtin_rule_dir,
    load_rules,
)
from rca.analyze import analyze_lines, iter_lines
from tests.cost import GROWTH, assert_linear, shrunk


@functools.cache
def builtin_rules() -> RuleSet:
    """The built-in rules, loaded once for the module: a RuleSet is read-only (its load has its own tests)."""
    return load_rules()


GOOD = """\
source: job-logs
rules:
  - reason: FirstRule
    category: node_lost
    type: permanent
    pattern: 'node \\w+ died'
    priority: 90
    action: drain it
  - reason: SecondRule
    category: gpu_oom
    type: temporary
    pattern: 'CUDA out of memory'
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(RuleError) as info:
        RuleSet.load([path])
    return str(info.value)


# --- loading --------------------------------------------------------------------------------------


def test_good_file_loads_with_defaults_and_locations(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    rules = RuleSet.load([path])
    first, second = rules.rules
    assert first.reason == "FirstRule" and first.category is Category.NODE_LOST
    assert first.type is RuleType.PERMANENT and first.severity is Severity.CRITICAL
    assert first.priority == 90 and first.action == "drain it"
    assert first.sources == ("job-logs",)
    assert (first.file, first.line) == (path, 3)
    assert (second.file, second.line) == (path, 9)
    assert second.type is RuleType.TEMPORARY and second.severity is Severity.WARNING
    assert second.confidence < first.confidence


def test_builtin_rules_load_and_cover_node_lost() -> None:
    rules = load_rules()
    assert (builtin_rule_dir() / "node_lost.yaml").is_file()
    node_lost = [r for r in rules if r.category is Category.NODE_LOST]
    assert any(r.permanent for r in node_lost) and any(not r.permanent for r in node_lost)
    assert all(r.action for r in rules), "every built-in rule says what to do"


def test_extra_rule_folder_is_loaded_and_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "extra.yml")
    rules = load_rules([tmp_path])
    assert rules.get("FirstRule") is not None
    with pytest.raises(RuleError, match="does not exist"):
        load_rules([tmp_path / "nope"])


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            """\
            source: job-logs
            rules:
              - reason: BadRegex
                category: node_lost
                type: permanent
                pattern: 'node (died'
            """,
            6,
            "bad regex: missing ), unterminated subpattern",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: BadCategory
                category: network_weather
                type: permanent
                pattern: 'x'
            """,
            4,
            "unknown category 'network_weather'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Fine
                category: node_lost
                type: permanent
                pattern: 'a'
              - reason: NoPattern
                category: node_lost
                type: permanent
            """,
            7,
            "missing required field 'pattern'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Twice
                category: node_lost
                type: permanent
                pattern: 'a'
              - reason: Twice
                category: node_lost
                type: temporary
                pattern: 'b'
            """,
            7,
            "duplicate rule reason 'Twice'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Extra
                category: node_lost
                type: permanent
                pattern: 'a'
                colour: red
            """,
            7,
            "unknown key 'colour'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: Exponential
                category: node_lost
                type: permanent
                pattern: '(a+)+$'
            """,
            6,
            "nests unbounded repeats",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: EveryLine
                category: node_lost
                type: permanent
                pattern: 'x*'
            """,
            6,
            "matches the empty string",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: WrongType
                category: node_lost
                type: forever
                pattern: 'a'
            """,
            5,
            "unknown type 'forever'",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: lower_case
                category: node_lost
                type: permanent
                pattern: 'a'
            """,
            3,
            "not a CamelCase name",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: BadConfidence
                category: node_lost
                type: permanent
                pattern: 'a'
                confidence: 7
            """,
            7,
            "confidence 7 is not a number from 0 to 1",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: KeyTwice
                category: node_lost
                category: gpu_oom
                type: permanent
                pattern: 'a'
            """,
            5,
            "key 'category' appears twice",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: ExcludesEverything
                category: node_lost
                type: permanent
                pattern: 'a'
                unless: 'b?'
            """,
            7,
            "unless matches the empty string, so no line would be read",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: BadUnless
                category: node_lost
                type: permanent
                pattern: 'a'
                unless: '(retry'
            """,
            7,
            "bad regex",
        ),
        (
            """\
            source: job-logs
            rules:
              - reason: ListUnless
                category: node_lost
                type: permanent
                pattern: 'a'
                unless: [retry]
            """,
            7,
            "unless must be a string",
        ),
        ("- just\n- a list\n", 1, "must be a mapping"),
        ("", 1, "rule file is empty"),
        ("# only a comment\n", 1, "rule file is empty"),
        ("source: job-logs\nrules: [\n", 3, "not valid YAML"),
        ("source: job-logs\nrules: {}\n", 2, "`rules` must be a list"),
        ("rules:\n  - reason: A\n", 1, "missing `source`"),
        ("source: x\nrules:\n  - just a string\n", 3, "a rule must be a mapping"),
    ],
)
def test_bad_rule_files_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    assert f"{path}:{line}" in message
    assert fragment in message


def test_unknown_category_lists_the_allowed_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "source: x\nrules:\n  - {reason: A, category: oops, type: permanent, pattern: a}\n")
    message = load_error(path)
    assert "node_lost" in message and "gpu_oom" in message and "unknown" in message


def test_duplicate_reason_across_files_names_both(tmp_path: Path) -> None:
    one = write(tmp_path, GOOD, "one.yaml")
    two = write(tmp_path, GOOD, "two.yaml")
    with pytest.raises(RuleError) as info:
        RuleSet.load([one, two])
    assert f"{two}:3" in str(info.value) and f"{one}:3" in str(info.value)


def test_duplicate_of_a_builtin_reason_is_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        "source: x\nrules:\n  - {reason: NodeMarkedDeadMissedHeartbeats, category: node_lost, "
        "type: permanent, pattern: a}\n",
    )
    with pytest.raises(RuleError, match="duplicate rule reason 'NodeMarkedDeadMissedHeartbeats'"):
        load_rules([tmp_path])


# --- matching -------------------------------------------------------------------------------------


# Real phrasings from Ray's own messages across versions (Ray source strings and posted logs).
NODE_LOST_LINES = {
    "The node with client ID 1eadc9db2f074bfec34caf25dd5bf1f99fad0d59 has been marked dead because the "
    "monitor has missed too many heartbeats from it.": "NodeMarkedDeadMissedHeartbeats",
    "The node with node id: 75b2eec8a61cdafd37cc8072b1caf9abdeef9c4e74a4f24d5dfce28d and ip: 10.4.4.107 has "
    "been marked dead because the detector has missed too many heartbeats from it.": "NodeMarkedDeadMissedHeartbeats",
    "NodeState(state='DEAD', state_message='Unexpected termination: health check failed due to missing too "
    "many heartbeats')": "NodeHealthCheckFailed",
    "\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats": (
        "NodeHealthCheckFailed"
    ),
    "The actor is dead because its node has died. Node Id: 677df2a9020c5db45e755b00": "ActorDiedNodeDied",
    "The actor died because its node has died. Node Id: b157c93de9603b1458ae4bd2": "ActorDiedNodeDied",
    "ray.exceptions.NodeDiedError: Task failed because the node it was running on is dead or unavailable. "
    "Node IP: 127.0.0.1": "TaskNodeDied",
    "[2022-02-16 12:46:52,789 C 149 149] node_manager.cc:170: This node has beem marked as dead.": (
        "RayletMarkedDeadByGcs"
    ),
    "[Timeout] Exiting because this node manager has mistakenly been marked as dead by the GCS: GCS failed "
    "to check the health of this node for 5 times.": "RayletMarkedDeadByGcs",
    "(raylet) Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL": (
        "RayletTerminatedUnexpectedly"
    ),
    "(raylet, ip=10.244.0.7) [2023-11-22 13:47:00,634 E 24 59] (raylet) agent_manager.cc:70: The raylet exited "
    "immediately because one Ray agent failed, agent_name = dashboard_agent/1015601482.": "RayletExitedWithAgent",
    # `ray status` under "Recent failures:" (legacy and v2 autoscaler), the GCS's node table
    " ray.worker.gpu: NodeTerminated (ip: 10.0.0.2)": "NodeDeathRecorded",
    " gpu-worker: NodeTerminated (instance_id: i-0123456789abcdef0)": "NodeDeathRecorded",
    "death_info: {reason: UNEXPECTED_TERMINATION, reason_message: 'health check failed'}": "NodeDeathRecorded",
    "death_reason: AUTOSCALER_DRAIN_PREEMPTED": "NodeDeathRecorded",
    "The actor 5e3c0a9b4f2d1e0c8a7b6c5d is unavailable: The actor is temporarily unavailable: IOError: "
    "Connection reset. The task may or may not have been executed on the actor.": "ActorUnavailable",
}


@pytest.mark.parametrize(("line", "reason"), sorted(NODE_LOST_LINES.items()))
def test_builtin_rules_match_real_phrasings(line: str, reason: str) -> None:
    assert reason in [r.reason for r in builtin_rules().match(line)]


@pytest.mark.parametrize(
    "line",
    [
        "Raylet is terminated. Termination is graceful.",
        "Node is marked as dead by GCS as it's already shutting down.",
        "death_reason: AUTOSCALER_DRAIN_IDLE",
        "death_info: {reason: EXPECTED_TERMINATION}",
        "The actor is dead because it was killed by `ray.kill`.",
        "The actor is dead because its worker process has died. Worker exit type: USER_ERROR",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB.",
        "step:1 - global_seqlen/min:484245.000 - actor/pg_loss:0.001 - perf/mfu/actor:0.343",
        "INFO worker.py:1852 -- Connected to Ray cluster. View the dashboard at 127.0.0.1:8265",
    ],
)
def test_node_lost_rules_ignore_other_lines(line: str) -> None:
    matched = [r.reason for r in builtin_rules().match(line) if r.permanent and r.category is Category.NODE_LOST]
    assert matched == []


def test_heartbeat_lag_is_only_temporary() -> None:
    line = (
        "node_manager.cc:157: Last heartbeat was sent 6901 ms ago. There might be resource pressure on this "
        "node. If heartbeat keeps lagging, this node can be marked as dead mistakenly."
    )
    matched = builtin_rules().match(line)
    assert matched and all(not r.permanent for r in matched)


def test_scan_numbers_lines_and_labels_source(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, GOOD)])
    lines = ["ok", "node abc died\r\n", "CUDA out of memory", "node x died and CUDA out of memory"]
    found = [(m.rule.reason, m.line_no, m.source) for m in rules.scan(lines, "job.log", start_line=10)]
    assert found == [
        ("FirstRule", 11, "job.log"),
        ("SecondRule", 12, "job.log"),
        ("FirstRule", 13, "job.log"),
        ("SecondRule", 13, "job.log"),
    ]
    assert next(iter(rules.scan(["node abc died\r\n"], "s"))).text == "node abc died"


UNLESS = """\
source: x
rules:
  - reason: LinkDown
    category: nccl_error
    type: permanent
    pattern: 'link \\w+ down'
    unless: '\\bretrying\\b|^\\[W '
  - reason: LinkDownAtEnd
    category: nccl_hang
    type: permanent
    tier: ending
    pattern: 'link \\w+ down'
    unless: '\\bretrying\\b'
"""


def test_unless_keeps_a_rule_off_the_lines_it_names_wherever_they_say_it(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, UNLESS)])
    far = "link ib0 down" + " x" * 2000 + " retrying"  # well past any lookahead's reach
    assert [r.reason for r in rules.match("link ib0 down")] == ["LinkDown"]
    assert rules.match("retrying: link ib0 down") == rules.match(far) == []
    assert rules.match("[W socket.cpp:1] link ib0 down") == []  # `^` is the program's line start, past a head
    assert rules.match("[rank3]:[W socket.cpp:1] link ib0 down") == []
    assert [r.reason for r in rules.match("[rank3]: link ib0 down")] == ["LinkDown"]
    lines = ["link ib0 down", "link ib1 down, retrying", "ok"]
    assert [(m.rule.reason, m.line_no) for m in rules.scan(lines, "x.log")] == [("LinkDown", 1)]
    raw = "\n".join(lines).encode()
    for block in (1, 8, 1 << 20):
        fast, slow, _ = scan_both(rules, raw, block)
        assert fast == slow and [(reason, line) for reason, line, *_ in fast] == [("LinkDown", 1)]
    assert [m.rule.reason for m in rules.ending((3, "link ib0 down"), "x.log")] == ["LinkDownAtEnd"]
    assert rules.ending((3, "link ib0 down, retrying"), "x.log") == []
    loaded = rules.get("LinkDown")
    assert loaded is not None and loaded.unless == "\\bretrying\\b|^\\[W "


def test_builtin_rules_say_a_whole_line_exclusion_with_unless() -> None:
    # "^(?![^\n]{0,600}?retrying)[^\n]*?(?:...)" reads only as far as its bound and buries what the rule reads;
    # `unless:` says it once, for the whole line.
    idiom = [r.reason for r in builtin_rules() if r.pattern.startswith("^(?!")]
    assert idiom == []


def test_for_source_keeps_rules_of_that_stream(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "a.yaml")
    write(
        tmp_path,
        "source: [gcs, raylet]\nrules:\n  - {reason: GcsOnly, category: node_lost, type: permanent, pattern: a}\n"
        "  - {reason: AnyStream, category: node_lost, type: permanent, pattern: b, source: '*'}\n",
        "b.yaml",
    )
    rules = RuleSet.load(sorted(tmp_path.glob("*.yaml")))
    assert {r.reason for r in rules.for_source("gcs")} == {"GcsOnly", "AnyStream"}
    assert {r.reason for r in rules.for_source("job-logs")} == {"FirstRule", "SecondRule", "AnyStream"}


def test_patterns_that_cannot_be_combined_still_match(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "source: x\nrules:\n"
        "  - {reason: Backref, category: user_error, type: permanent, pattern: '(ab)\\1'}\n"
        "  - {reason: Flags, category: user_error, type: permanent, pattern: '(?i)hello'}\n",
    )
    rules = RuleSet.load([path])
    assert [r.reason for r in rules.match("xxababyy")] == ["Backref"]
    assert [r.reason for r in rules.match("HeLLo")] == ["Flags"]


def test_huge_line_is_cut_before_matching(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, GOOD)])
    early = "node abc died " + "x" * (20 * 1024 * 1024)
    late = "x" * (MAX_LINE_CHARS + 10) + " node abc died"
    (match,) = list(rules.scan([early], "big.log"))
    assert match.truncated and len(match.text) == MAX_LINE_CHARS
    assert list(rules.scan([late], "big.log")) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "bait",
    [
        "node " * 13000,
        "Raylet is terminated " * 3000,
        "The node " + " " * 60000 + "has been marked",
        "Health check failed for node " + "a" * 60000 + "g",
        "node manager has mistakenly been marked as " * 1400,
        "(" * 60000,
    ],
)
def test_builtin_rules_stay_linear_on_hostile_lines(bait: str) -> None:
    # A backtracking pattern would take hours on these lines; a linear one takes well under a second.
    assert_matches_quickly(builtin_rules(), bait)


def assert_matches_quickly(rules: RuleSet, bait: str) -> None:
    """Matching the hostile line costs at most linear time in its length (the 120 s timeout stays as the hang
    guard)."""
    assert_linear(rules.match, shrunk(bait), GROWTH)


# Real phrasings of every other fault class, across versions (from posted logs and the projects' sources).
PHRASINGS = {
    # gpu_oom
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB. GPU 0 has a total": "CudaOutOfMemory",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 192.00 MiB. GPU": "CudaOutOfMemory",
    "RuntimeError: CUDA out of memory. Tried to allocate 92.00 MiB (GPU 0; 1.96 GiB total capacity;": "CudaOutOfMemory",
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.": "CudaOutOfMemory",
    "RuntimeError: CUDA error: out of memory": "CudaErrorOutOfMemory",
    "cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp:62": "CudaErrorOutOfMemory",
    "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CUDA_ERROR_OUT_OF_MEMORY: out of memory": "CudaErrorOutOfMemory",
    "node:2134736:2285781 [0] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'": "NcclCudaAllocFailed",
    "node:2134736:2285781 [0] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes": "NcclCudaAllocFailed",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`": "CublasAllocFailed",
    "RuntimeError: cuFFT error: CUFFT_ALLOC_FAILED": "CublasAllocFailed",
    # Go's ENOSPC (Docker, containerd, the kubelet) in its lower case
    "[INFO] write /var/lib/docker/tmp/GetImageBlob403717976: no space left on device": "NoSpaceLeftOnDevice",
    "[WARNING] [stage3.py:1850:step] 4 pytorch allocator cache flushes since last step. this happens when there is "
    "high memory pressure and is detrimental to performance.": "GpuMemoryPressureWarning",
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`": "KvCacheNoMemory",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.": "KvCacheNoMemory",
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_ref_update_actor()": (
        "RayTaskOutOfMemoryError"
    ),
    # host_oom
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.": "RayOomKillerKilledTask",
    # the 2.x kill message's opening, all a cut log kept of it (tests/rca_cases/302)
    "Memory on the node (IP: 10.1.180.84, ID: ba65c80c8aec6b1c406693f640c53f85422d4d73b069747d69875d42) where the "
    "task (task ID: d221d26232c9bae05def6a6d00dbd292d4fc77cc01000000, name=head, rank=0,, pid=4503, memory used": (
        "RayOomKillerKilledTask"
    ),
    "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. Memory on": (
        "RayOomKillerKilledTask"
    ),
    "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY": (
        "RayOomKillerKilledTask"
    ),
    "(raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers": (
        "RayOomKillerSummary"
    ),
    "[12345.678] Out of memory: Killed process 4242 (python) total-vm:123kB, anon-rss:99kB": "KernelOomKiller",
    "[12345.678] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0": "KernelOomKiller",
    # kernels before 4.19 (mm/oom_kill.c) named their victim before killing it
    "[ 8263.991822] Kill process 2398 (python) score 939 or sacrifice child": "KernelOomKiller",
    # a cgroup's limit, in the kernel's lower case
    "[12345.678] Memory cgroup out of memory: Killed process 4242 (python) total-vm:81234kB, anon-rss:7123456kB": (
        "KernelOomKiller"
    ),
    "RuntimeError: DataLoader worker (pid 1562937) is killed by signal: Killed.": "DataLoaderWorkerKilled",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 2410412)": (
        "ProcessSigkilled"
    ),
    "traceback : Signal 9 (SIGKILL) received by PID 36071": "ProcessSigkilled",
    "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)": "ProcessSigkilled",
    # nccl_error
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1296, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1": "NcclSystemError",
    "ncclInternalError: Internal check failed.": "NcclInternalError",
    "RuntimeError: NCCL Error 1: unhandled cuda error (run with NCCL_DEBUG=INFO for details)": "NcclUnhandledCudaError",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.": (
        "NcclRemoteError"
    ),
    "transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<53249> with error 12, opcode 0": (
        "NcclIbTransportError"
    ),
    "NCCL WARN NET/IB : ibv_modify_qp failed with 110 Connection timed out": "NcclIbTransportError",
    "[PG ID 0 PG GUID 0 Rank 3] Process group watchdog thread terminated with exception: NCCL error: remote process "
    "exited or there was a network error": "ProcessGroupWatchdogException",
    "misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer host<1>": "NcclSocketClosedByPeer",
    "misc/socket.cc:484 NCCL WARN socketStartConnect: exceeded retries (20000)": "NcclConnectFailed",
    "node-3:4024:4055 [0] NCCL WARN Connect to 10.0.0.1<45678> failed : No route to host": "NcclConnectFailed",
    "node-3:4024:4055 [0] misc/socket.cc:568 NCCL WARN socketPollConnect: Connect to 10.0.0.1<45678> returned "
    "111(Connection refused) errno 115(Operation now in progress)": "NcclConnectFailed",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:41393": (
        "CollectiveConnectionReset"
    ),
    # nccl_hang
    "[rank1]:[E626 06:24:44.903 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=98, NumelOut=98, Timeout(ms)=600000) ran for 600020 milliseconds "
    "before timing out.": "NcclWatchdogTimeout",
    # PyTorch 1.x, before the watchdog and sequence numbers were named
    "[E ProcessGroupNCCL.cpp:414] Caught collective operation timeout: WorkNCCL(OpType=BROADCAST, "
    "Timeout(ms)=1800000) ran for 1803254 milliseconds before timing out.": "NcclWatchdogTimeout",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, "
    "1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in /envs/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)": (
        "NcclWatchdogTimeoutStack"
    ),
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv "
    "operation to complete": "GlooOperationTimeout",
    "[Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring": (
        "NcclHeartbeatMonitorTimeout"
    ),
    # Horovod's stall inspector (horovod/common/stall_inspector.cc): its warning, and a rank's line of its list
    "[2021-02-02 21:19:07.345988: W horovod/common/stall_inspector.cc:105] One or more tensors were submitted to be "
    "reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 "
    "seconds.": "HorovodStalledRanks",
    "0: [DistributedSGD_Allreduce/cond/HorovodAllreduce_grads_0]": "HorovodStalledRanks",
    "1: [allreduce.layer1.weight, allreduce.layer1.bias]": "HorovodStalledRanks",
    "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/2 clients joined.": (
        "DistributedStoreTimeout"
    ),
    # gpu_hardware
    "NVRM: Xid (PCI:0000:44:00): 79, pid=1234, name=python, GPU has fallen off the bus.": "XidDrainAndReset",
    "NVRM: Xid (PCI:0000:3b:00): 48, pid=4321, name=python3, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 6, subpartition 0.": "XidDrainAndReset",
    "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error": "XidContainedEcc",
    "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.": "GpuFallenOffBus",
    # NCCL's NVLS transport when the NVSwitch fabric (Fabric Manager, IMEX) cannot bind multicast memory
    "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the operation cannot be "
    "performed in the present state'.": "NvlsFabricFailure",
    "node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'": "NvlsFabricFailure",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered": "UncorrectableEcc",
    "Remapping Failure Occurred        : Yes": "RowRemapFailure",
    "NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008": "XidApplicationFault",
    "NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from "
    "status @ kernel_channel.c:2874": "GpuResetRequired",
    "GPU 00000000:18:00.0: GPU requires reset": "GpuResetRequired",
    "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in "
    "KV cache (20480).": "KvCacheNoMemory",
    "E local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out of memory while trying to allocate "
    "1073741824 bytes.": "TensorFlowXlaOutOfMemory",
    "(1) Resource exhausted: Attempting to allocate 96.00M. That was not possible. There are 12.50M free.; "
    "(0x0x0_HBM0)": "TensorFlowXlaOutOfMemory",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Resource exhausted: OOM when allocating tensor": (
        "TensorFlowXlaOutOfMemory"
    ),
    # host_oom
    "slurmstepd: error: Detected 2 oom_kill events in StepId=123456.0. Some of the step tasks have been OOM Killed.": (
        "SlurmCgroupOomKill"
    ),
    "slurmstepd: error: Detected 1 oom-kill event(s) in step 98765.batch cgroup.": "SlurmCgroupOomKill",
    "srun: error: gpu-node-07: task 5: Out Of Memory": "SlurmCgroupOomKill",
    # userspace OOM killers, which act before the kernel's and leave no kernel OOM line
    "Dec 17 10:04:41 ws systemd-oomd[588]: Killed /user.slice/user-1000.slice/session-3.scope due to memory pressure "
    "for /user.slice/user-1000.slice being 71.20% > 50.00% for > 20s with reclaim activity": "UserspaceOomKiller",
    "[   77.752252] systemd[1]: systemd-journald.service: systemd-oomd killed 1 process(es) in this unit.": (
        "UserspaceOomKiller"
    ),
    "earlyoom[712]: low memory! at or below SIGTERM limits: mem 10.00%, swap 10.00%": "UserspaceOomKiller",
    # node_lost
    "slurmstepd: error: *** JOB 4242 ON gpu-node-03 CANCELLED AT 2025-01-02T03:04:05 DUE TO PREEMPTION ***": (
        "SlurmPreemptedOrNodeFailed"
    ),
    "slurmstepd: error: *** STEP 77.0 ON gpu-node-09 CANCELLED AT 2025-01-02T03:04:05 DUE TO NODE FAILURE ***": (
        "SlurmPreemptedOrNodeFailed"
    ),
    "2024-05-02 10:11:12,000 INFO updater.py:320 -- wait_ready aborting because node detected as terminated.": (
        "NodeTerminatedDuringSetup"
    ),
    # disk_full
    "OSError: [Errno 28] No space left on device": "NoSpaceLeftOnDevice",
    "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, message": (
        "NoSpaceLeftOnDevice"
    ),
    "OSError: [Errno 122] Disk quota exceeded": "DiskQuotaExceeded",
    "LustreError: 11-0: scratch-OST0003-osc-ffff8c2b: operation ost_write to node 10.1.0.7@o2ib failed: rc = -28": (
        "NoSpaceLeftOnDevice"
    ),
    "LustreError: 31254:0:(osc_cache.c:2410) scratch-OST0003-osc-ffff8c2b: write error: rc = -122": "DiskQuotaExceeded",
    "ray.exceptions.OutOfDiskError: Local disk is full. The object cannot be created": "RayOutOfDisk",
    "NCCL WARN Error: failed to extend /dev/shm/nccl-ZXAJkT to 9637892 bytes": "SharedMemoryFull",
    "RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed writing file data/176: "
    "file write failed": "CheckpointWriteFailed",
    "tensorflow.python.framework.errors_impl.InternalError: Error writing (tmp) checkpoint file: /ckpt/m.ckpt-9.temp: "
    "Resource exhausted: /ckpt/m.ckpt-9.temp": "TensorFlowWriteResourceExhausted",
    # user_error
    "ModuleNotFoundError: No module named 'transfer_queue'": "PythonImportError",
    "ray.exceptions.RayTaskError(ModuleNotFoundError): ray::main_task() (pid=120207, ip=10.1.109.91)": (
        "PythonImportError"
    ),
    "  SyntaxError: invalid syntax": "PythonSyntaxError",
    "omegaconf.errors.ConfigAttributeError: Key 'ray_init' is not in struct": "HydraConfigError",
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/gsm8k/train.parquet'": "MissingFileOrModel",
    "RuntimeError: CUDA error: an illegal memory access was encountered": "CudaIllegalMemoryAccess",
    "KeyError: 'responses'": "PythonException",
    "(TaskRunner pid=1) ValueError: batch size 7 is not divisible by 8": "PythonException",
    "/tmp/ray/session_2023-06-29_11-21-28_818264_5598 is over 95% full, ": "RayDiskAlmostFull",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: disk quota exceeded [Op:SaveV2]": (
        "DiskQuotaExceeded"
    ),
    "71885 Killed                  PYTHONPATH=$PYTHONPATH:. python -m kauldron.main --cfg=pod_config.py": (
        "ShellReportsKilled"
    ),
    "[1]+  Killed                  python train.py --config llama.yaml": "ShellReportsKilled",
    "[2]   Killed                  python eval.py --config llama.yaml": "ShellReportsKilled",
    "Memory usage on this node: 7.4/7.6 GiB: ***LOW MEMORY*** less than 10% of the memory on this node is available "
    "for use. This can cause unexpected crashes.": "RayLowMemoryWarning",
    "torch.distributed.DistBackendError: [4] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
    "c10d key-value store by key '0', but store->get('0') got error: Socket Timeout": "DistributedStoreTimeout",
    "[rank0]:[E804 23:05:54.816499929 ProcessGroupNCCL.cpp:1849] [PG ID 0 PG GUID 0(default_pg) Rank 0] Observed "
    "flight recorder dump signal from another rank via TCPStore.": "NcclTimeoutDebugDump",
    "The error from device(chipId:5, dieId:0), serial number is 17, hccl fftsplus task timeout occurred during task "
    "execution, stream_id:7, sq_id:7, task_id:9865, stuck notify num:3, timeout:1836.": "HcclNotifyWaitTimeout",
    "[rank4]: \tsize mismatch for output.weight: copying a param with shape torch.Size([128256, 8192]) from "
    "checkpoint, the shape in current model is torch.Size([32000, 8192]).": "PythonException",
    "JobInfo(status=FAILED, error_type='JOB_ENTRYPOINT_COMMAND_ERROR', driver_exit_code=1)": "RayJobEntrypointFailed",
    "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 131072, Hardware limit: 101376. "
    "Reducing block sizes or `num_stages` may help.": "KernelExceedsHardwareLimit",
    "Failed to initialize NVML: Driver/library version mismatch": "DriverLibraryVersionMismatch",
    "pynvml.NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.": (
        "DriverLibraryVersionMismatch"
    ),
    "kernel: NVRM: API mismatch: the client has the version 535.161.08, but": "DriverLibraryVersionMismatch",
    "The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).": "PortAlreadyInUse",
    "OSError: [Errno 98] Address already in use": "PortAlreadyInUse",
    "EJ0003: Failed to bind the IP port. Reason: The IP address and port have been bound already.": "PortAlreadyInUse",
    "slurmstepd: error: *** STEP 55595933.0 ON gpu-17 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***": (
        "JobTimeLimitReached"
    ),
    "=>> PBS: job killed: walltime 3622 exceeded limit 3600": "JobTimeLimitReached",
    "[rank1]:[E1130 ProcessGroupNCCL.cpp:1413] [PG 0 Rank 1] Received a dump signal due to a collective timeout from "
    "this local rank and we will try our best to dump the debug info.": "NcclTimeoutDebugDump",
    "[rank3]:[E1130 ProcessGroupNCCL.cpp:1413] [PG 0 Rank 3] Received a global timeout from another rank and will "
    "start to dump the debug info.": "NcclTimeoutDebugDump",
    "gpu-1:1234:1250 [0] init.cc:1570 NCCL WARN NCCL library is too old. This application was compiled with NCCL "
    "version 22105, but is running with NCCL 21805": "NcclLibraryTooOld",
    "gpu-1:1234:1250 [0] init.cc:112 NCCL WARN CUDA Driver version found is 11040. Minimum requirement is 12000": (
        "NcclLibraryTooOld"
    ),
    "gpu-1:1234:1250 [0] transport/net_ib.cc:181 NCCL WARN NET/IB : mlx5_0:1 async fatal event on CQ (0x7f00) "
    "handle=3 cqe=2: CQ error": "NcclIbAsyncFatalEvent",
    "gpu-1:1234:1250 [0] transport/net_ib.cc:195 NCCL WARN NET/IB : mlx5_0:1 async fatal event: port error": (
        "NcclIbAsyncFatalEvent"
    ),
    "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers": (
        "LaunchTerminalHangup"
    ),
    "torch.distributed.elastic.agent.server.api:[default] Received Signals.SIGHUP death signal, shutting down": (
        "LaunchTerminalHangup"
    ),
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 40321 got signal: 1": (
        "LaunchTerminalHangup"
    ),
    "FileNotFoundError: [Errno 2] No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp', '/root']": (
        "NoUsableTempDirectory"
    ),
    "TERM_RUNLIMIT: job killed after reaching LSF run time limit.": "JobTimeLimitReached",
    "Warning  DeadlineExceeded  job/train  Job was active longer than specified deadline": "JobTimeLimitReached",
    "[E ProcessGroupGloo.cpp:138] [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 1800000 ms": (
        "MonitoredBarrierTimeout"
    ),
    "EI0002: The wait execution of the Notify register times out. Reason: The Notify register has not received the "
    "Notify record from remote rank [3].": "HcclNotifyWaitTimeout",
    # NCCL's /dev/shm segment, where a post wrapped the quoted warning after its first word (tests/rca_cases/501)
    "while creating shared memory segment /dev/shm/nccl-TfciGV (size 31850880), error: No space": "SharedMemoryFull",
    # other accelerators' device OOM: Intel XPU (Unified Runtime, Level Zero), Gaudi, Ascend
    "RuntimeError: level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)": (
        "GenericDeviceOutOfMemory"
    ),
    "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY": "GenericDeviceOutOfMemory",
    "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB": (
        "GenericDeviceOutOfMemory"
    ),
    "EL0004: [PID: 4242] 2025-07-01-00:40:04.135.732 Failed to allocate memory.": "GenericDeviceOutOfMemory",
    # libtorch's own messages (its binary's strings): a rank that waited in the barrier, a TCPStore key never set
    "RuntimeError: Rank 3 timed out in monitoredBarrier after 1800000 ms.": "MonitoredBarrierTimeout",
    "RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from "
    "rank 0. Please check rank 0 logs for faulty rank.": "MonitoredBarrierTimeout",
    # the work's own words, on a line of their own where a post wrapped them
    "  ran for 721595 milliseconds before timing out": "NcclWatchdogTimeout",
    "torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda//0": (
        "DistributedStoreTimeout"
    ),
    # Ray 2.60's own strings (its raylet, GCS and core worker binaries and python/ray): a lost node, the memory
    # monitor's kills, a full spill disk
    "[2025-03-01 10:00:00,000 C 123 123] (raylet) node_manager.cc:1000: GCS consider this node to be dead. This may "
    "happen when GCS is not backed by a DB and restarted or there is data loss in the DB.": "RayletMarkedDeadByGcs",
    "task_manager.cc:900: Task attempt 77fe0a1b2c3d failed with error NODE_DIED Fail immediately? 0, status IOError: "
    "node dead": "TaskNodeDied",
    "task_manager.cc:900: Task attempt 77fe0a1b2c3d failed with error LOCAL_RAYLET_DIED Fail immediately? 0": (
        "LocalRayletDied"
    ),
    "(raylet) node_manager.cc:2000: Drain raylet RPC has received. Deadline is 1740910500000. Drain reason: "
    "DRAIN_NODE_REASON_PREEMPTION. Drain reason message: gce-maintenance": "NodeDeathRecorded",
    "(autoscaler +2m31s) Removing 1 nodes of type ray.worker.gpu (lost contact with raylet).": "NodeDeathRecorded",
    "WARNING autoscaler.py:1288 -- StandardAutoscaler: i-0abc123: No recent heartbeat, restarting Ray to recover...": (
        "NodeDeathRecorded"
    ),
    "Memory on the node (IP: 10.83.10.20) was 957.55GB used / 1006.84GB limit (0.951040), which exceeds the memory "
    "usage threshold of 0.95.": "RayOomKillerKilledTask",
    "Ray killed this worker (ID: 5f1d2e3a) because it was the most recently scheduled task; to see more information "
    "about memory usage on this node, use `ray logs raylet.out -ip 10.83.10.20`.": "RayOomKillerKilledTask",
    "(raylet) Ray killed 1 worker(s) based on the killing policy: [group-by-owner]": "RayOomKillerKilledTask",
    "(raylet) Task _map_task failed due to oom. There are infinite oom retries remaining, so the task will be "
    "retried.": "RayOomKillerKilledTask",
    "(gcs_server) gcs_worker_manager.cc:50: Reporting worker exit, worker id = 5f1d, node id = 3f2a, address = "
    "10.0.0.5, exit_type = NODE_OUT_OF_MEMORY, exit_detail = see raylet.out": "RayOomKillerKilledTask",
    "(raylet) memory_monitor.cc:50: Still waiting for worker eviction to free up memory. worker pid: 4412": (
        "RayOomKillerKilledTask"
    ),
    # Accelerator stacks other than CUDA, in their own words (CANN / torch_npu, HCCL, amdgpu, Synapse, Habana's HCL).
    "[ERROR] DRV(4242,python):2024-05-01-10:00:00.000 hb_host.c:171 device heartbeat lost": "AcceleratorHardwareFault",
    "Heartbeat lost! (device_id=3; old_count=1024; current_count=1024; lost_count=6)": "AcceleratorHardwareFault",
    "[ERROR] RUNTIME(4242,python):2024-05-01 [stars_engine.cc:686] Device[3] lost heartbeat.": (
        "AcceleratorHardwareFault"),
    "EZ9999: Kernel task happen error, retCode=0x5c, [aicore hardware local error].": "AcceleratorHardwareFault",
    "RuntimeError: NPU function error: aclrtSynchronizeStream, error code is 507054": "AcceleratorHardwareFault",
    "amdgpu 0000:c1:00.0: amdgpu: RAS records:512 exceed threshold:448": "AcceleratorHardwareFault",
    "amdgpu 0000:c1:00.0: amdgpu: socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block": (
        "AcceleratorHardwareFault"),
    "RuntimeError: Graph compile failed. synStatus=synStatus 17 [Device in reset]. ": "AcceleratorHardwareFault",
    "EI0013: Execution Error ROCE CQE(EI0013): An error CQE occurred during operator execution.": "HcclTransportError",
    "RuntimeError: HCCL function error: HcclAllreduce, error code is 12": "HcclTransportError",
    "hcclSocketError: Problem with HCCL initialization occurred.": "HcclTransportError",
    "[PID: 4242] EI0005: The arguments for collective communication are inconsistent between ranks: tag "
    "[AllReduce_10.0.0.1%enp_60000_0_1], parameter [count], local [1024], remote [2048]": "HcclConfigurationRejected",
    "EI0008: The HCCL versions are inconsistent: tag [HcomAllReduce], local_version [8.0], remote_version [7.3]": (
        "HcclConfigurationRejected"),
    "[TaskExecStage][Timeout]Cluster Exception Location[IP/ID]:[10.0.0.2/3], ExceptionType:[Stuck Occurred]": (
        "HcclNotifyWaitTimeout"),
    "EZ9999: The error from device(chipId:0, dieId:0), serial number is 7, notify wait timeout occurred during task "
    "execution, stream_id:2": "HcclNotifyWaitTimeout",
    "Communication_Error_Bind_IP_Port(EI0019): Failed to enable listening for the host network adapter socket.": (
        "PortAlreadyInUse"),
    "F0101 10:00:00.000 4242 core_worker.cc:512] Lost connection with local raylet. Error: IOError: Broken pipe": (
        "LocalRayletDied"),
    "[Cycle 0] GPU 3: Requires a node reboot to recover. Reboot the system.": "GpuResetRequired",
    "GPU health check failed for node n7: Node n7 has an unhealthy GPU.": "GpuResetRequired",
    "GPU 2: NVL link 5 is in DISABLED state": "NvlinkFault",
    "GPU 1 unsuccessfully wrote data to GPU 3 over NVLink in a peer-to-peer test: cudaErrorIllegalAddress": (
        "DcgmHealthFault"),
    "Error: 2 or more retired pages have been detected in GPU 3.": "DcgmHealthFault",
    "GPU 0 is running at PCI link width 8X, which is below the minimum allowed link generation of 16 (parameter "
    "'pcie.min_pci_width')": "DcgmHealthFault",
    "[Rerun] rank 12: First rerun: unexpected result is not reproducible within the tolerance (nan != 3.2)! Possible "
    "transient error!!": "SilentDataCorruptionDetected",
    # One entry of the memory monitor's kill report, its header lost.
    "(Actor(9d39): job ID=01000000, task name=WorkerDict.__init__, required resources={CPU: 1}, pid=100348, actual "
    "memory used=10.27GB, worker ID=3cc7f0c8)": "RayOomKillerKilledTask",
    "(raylet) create_request_queue.cc:100: Out-of-disk: Failed to create object 00ffffffffffffffffffffffffffffffffffff"
    "ff0100000001000000 of size 100MB": "RayOutOfDisk",
    "The object cannot be created because the local object store is full and the local disk's utilization is over "
    "capacity (95% by default).": "RayOutOfDisk",
    "ray.exceptions.ObjectLostError: Failed to retrieve object 00ffffffffffffffffffffffffffffffffffffff01000000010000"
    "00. To see information about where this ObjectRef was created in Python, set the environment variable "
    "RAY_record_ref_creation_sites=1": "GenericProcessDiedUnexpectedly",
    # PyTorch's own strings (the 2.13 wheel's Python sources and libtorch: ProcessGroupNCCL.cpp, TraceUtils.h,
    # socket.cpp)
    "[rank1]:[F1003 18:46:01.8 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) Rank 1] Terminating the "
    "process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.": (
        "NcclHeartbeatMonitorTimeout"
    ),
    "[rank1]:[E1003 18:37:01.8 ProcessGroupNCCL.cpp:1595] Rank 1 - To our best knowledge, ranks [3] are the lagging "
    "ranks that caused this timeout. They never joined any collectives": "NcclTimeoutDebugDump",
    "\t   - [3] joined but didn't finish collective #41207 (count from 1)": "NcclTimeoutDebugDump",
    "torch.distributed.DistBackendError: NCCL timeout in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:301, NCCL "
    "operation in progress, NCCL version 2.21.5": "DistributedStoreTimeout",
    "torch.distributed.DistStoreError: barrier timeout after 300000ms, key: torchelastic/agent/terminal_state": (
        "DistributedStoreTimeout"
    ),
    "TimeoutError: timed out waiting for all 16 members to join": "DistributedStoreTimeout",
    "RuntimeError: Socket Timeout": "DistributedStoreTimeout",
    "torch.distributed.DistBackendError: Attempt to perform collective on tensor not on device passed to "
    "init_process_group": "CollectiveTensorOnWrongDevice",
    "[rank0]:[E1003 18:37:01.8 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0] Tensor found on "
    "device cuda:1 but backend constrained to cuda:0": "CollectiveTensorOnWrongDevice",
    "[rank0]:[E501 10:00:00.1 socket.cpp:500] [c10d] The server socket has failed to listen on any local network "
    "address.": "PortAlreadyInUse",
    "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect to "
    "(10.0.0.99, 29500).": "RendezvousUnreachable",
    "ERROR: Unexpected segmentation fault encountered in worker.": "GenericProcessCrashed",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:456] Read timeout [10.0.0.3]:44012": (
        "GenericCollectiveTimeout"
    ),
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Socket closed [10.0.0.3]:44012": (
        "GenericPeerConnectionLost"
    ),
    # NVIDIA's own strings: NCCL's WARN lines (src/init.cc, bootstrap.cc), the CUDA driver API's names, NVML, the GSP
    # firmware, DCGM's health and diagnostic messages (dcgmlib/dcgm_errors.h)
    "host:48213:48213 [0] bootstrap.cc:126 NCCL WARN Bootstrap : no socket interface found": (
        "NcclNetworkInterfaceMissing"
    ),
    "host:48213:48213 [0] init.cc:1043 NCCL WARN Mismatched NCCL version detected : rank 8 version 22105 rank 0 "
    "version 21903": "NcclConfigurationRejected",
    "host:48213:48213 [0] bootstrap.cc:348 NCCL WARN Bootstrap Root : rank 3 of 8 ranks has already checked in": (
        "NcclConfigurationRejected"
    ),
    "host:48213:48213 [0] init.cc:1057 NCCL WARN Multiple Ranks are using the same GPU/Partition. Set "
    "NCCL_MULTI_RANK_GPU_ENABLE=1 to allow it.": "NcclDuplicateGpu",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
    "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5": "NcclInvalidUsage",
    "E cuda_driver.cc:268] failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY: system not yet initialized": (
        "GenericGpuFault"
    ),
    "RuntimeError: CUDA error: system not yet initialized": "GenericGpuFault",
    "cuMemcpyDtoHAsync failed: <CUresult.CUDA_ERROR_NVLINK_UNCORRECTABLE: 220>": "GenericGpuFault",
    "cuLaunchKernel failed: <CUresult.CUDA_ERROR_ASSERT: 710>": "GenericCudaUsageError",
    "failed call to cuInit: CUDA_ERROR_STUB_LIBRARY: CUDA driver is a stub library": "GenericCudaUsageError",
    "pynvml.NVMLError_ResetRequired: GPU requires restart": "GpuResetRequired",
    "GPU 3 requires a reset to recover from a fault. Recovery action: 1 (GPU_RESET).": "GpuResetRequired",
    "Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error": "GpuUnreachable",
    "pynvml.NVMLError_CorruptedInforom: Corrupted infoROM": "GenericGpuFault",
    "nvidia-container-cli: detection error: nvml error: gpu is lost": "GenericGpuFault",
    "[ 5123.456789] NVRM: _issueRpcAndWait: rpcRecvPoll timedout for fn 76!": "GenericGpuFault",
    "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable": "GenericGpuFault",
    "A pending retired page has been detected in GPU 3.": "DcgmHealthFault",
    "GPU 3 had uncorrectable memory errors and row remapping failed.": "DcgmHealthFault",
    "GPU had a contained error.": "DcgmHealthFault",
    "Detected fatal NvSwitch SXID 24007": "DcgmHealthFault",
    "Only 16 NvLinks are up out of the expected 18": "DcgmHealthFault",
    "Found 37 faulty memory elements on GPU 3": "DcgmHealthFault",
    "Detected more than 8 PCIe replays per minute for GPU 3 : 57": "DcgmHealthFault",
    # the launchers' and clouds' own records (Slurm, Kubernetes' kubelet and controllers, Kubeflow, KubeRay, Open MPI /
    # PRRTE help texts, Azure's scheduled events, GCE's audit events, AWS's spot request codes)
    "srun: Exceeded job memory limit": "SlurmCgroupOomKill",
    "  Warning  SystemOOM  2m  kubelet  System OOM encountered, victim process: python, pid: 48213": "KernelOomKiller",
    'I0611 eviction_manager.go:366] "Eviction manager: must evict pod(s) to reclaim" resourceName="memory"': (
        "KubeletMemoryEviction"
    ),
    "  Warning  Evicted  3m  kubelet  The node had condition: [MemoryPressure].": "KubeletMemoryEviction",
    "  Warning  Evicted  3m12s  kubelet  The node was low on resource: inodes.": "KubeletStorageEviction",
    "Message:          Pod ephemeral local storage usage exceeds the total limit of containers 100Gi.": (
        "KubeletStorageEviction"
    ),
    'Message:          Usage of EmptyDir volume "dshm" exceeds the limit "64Gi".': "KubeletStorageEviction",
    "slurmstepd: error: execve(): train.py: Permission denied": "GenericLaunchMistake",
    "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification": "GenericLaunchMistake",
    "  Warning  Failed  3s  kubelet  Error: couldn't find key HF_TOKEN in Secret default/hf": "GenericLaunchMistake",
    "There are not enough slots available in the system to satisfy the 16 slots that were requested by the "
    "application:": "GenericLaunchMistake",
    "   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)": "JobTimeLimitReached",
    "  Normal  PyTorchJobFailed  1m  pytorchjob-controller  Job llama-ft has failed because it was active longer than "
    "specified deadline": "JobTimeLimitReached",
    "  Message:  The RayJob has passed the activeDeadlineSeconds. StartTime: 2024-06-11 03:14:07.": (
        "JobTimeLimitReached"
    ),
    "srun: error: Cannot communicate with node 3.  Aborting job.": "SchedulerRecordedNodeLoss",
    "   JobState=PREEMPTED Reason=None Dependency=(null)": "SchedulerRecordedNodeLoss",
    "    Message:  Preempted in order to admit critical pod": "SchedulerRecordedNodeLoss",
    "    message: 'Taint manager: deleting due to NoExecute taint'": "SchedulerRecordedNodeLoss",
    "    message: 'PodGC: node no longer exists'": "SchedulerRecordedNodeLoss",
    "A critical communication path was lost to:": "SchedulerRecordedNodeLoss",
    '{"Events": [{"EventId": "1", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Description": ""}]}': (
        "SchedulerRecordedNodeLoss"
    ),
    '  "methodName": "compute.instances.hostError", "status": {"message": "Instance terminated by Compute Engine."}': (
        "SchedulerRecordedNodeLoss"
    ),
    "Status: instance-terminated-no-capacity": "SchedulerRecordedNodeLoss",
    # storage services and layers (MinIO's api-errors.go, Ceph RGW, Azure Files, Docker's devicemapper, ext4, the
    # kernel's dquot) and a process out of file descriptors (NCCL's src/os/linux.cc, Python's errno 24)
    "botocore.exceptions.ClientError: An error occurred (XMinioStorageFull) when calling the PutObject operation: "
    "Storage backend has reached its minimum free drive threshold.": "NoSpaceLeftOnDevice",
    "botocore.exceptions.ClientError: An error occurred (QuotaExceeded) when calling the PutObject operation: "
    "Unknown": "DiskQuotaExceeded",
    "Error response from daemon: devmapper: Thin Pool has 1635 free data blocks which is less than minimum required "
    "163840 free data blocks.": "NoSpaceLeftOnDevice",
    "EXT4-fs (dm-0): Delayed block allocation failed for inode 393228 at logical offset 2048 with max blocks 2048 with "
    "error 28": "NoSpaceLeftOnDevice",
    "sda1: write failed, user block limit reached.": "DiskQuotaExceeded",
    "host:1:1 [0] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-Wq3Kz7 (size 9637888), error: Too "
    "many open files (24)": "TooManyOpenFiles",
    "OSError: [Errno 24] Too many open files: '/data/shard_001.bin'": "TooManyOpenFiles",
    # the frameworks' own words (vLLM's gpu_worker.py / executor_base.py, DeepSpeed FastGen's kv_cache.py,
    # Megatron-Core's rerun_state_machine.py and checkpointing.py)
    "ValueError: Free memory on device cuda:0 (7.34/79.19 GiB) on startup is less than desired GPU memory utilization "
    "(0.9, 71.27 GiB).": "KvCacheNoMemory",
    "ValueError: Insufficient memory to allocate KV-caches. Required: 2097152, Available: 1048576": "KvCacheNoMemory",
    "INFO executor_base.py:110] # CUDA blocks: 0, # CPU blocks: 2048": "KvCacheNoMemory",
    "Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely incorrect (nan != "
    "2.3104)": "SilentDataCorruptionDetected",
    "Rank 3, node gpu-node-12, device 3, iteration #1201: Possible persistent error!!": "SilentDataCorruptionDetected",
    ">> '--exit-on-missing-checkpoint' is set but no checkpoint was found under load directory '/ckpt/gpt'.": (
        "GenericLaunchMistake"
    ),
    # the kernel's and systemd's own words (mm/oom_kill.c, memcontrol.c, panic.c, mce, GHES, bonding, pcie/err.c)
    "[ 1234.5678] Tasks state (memory values in pages):": "KernelOomKiller",
    "[ 1234.5678] memory: usage 104857600kB, limit 104857600kB, failcnt 1234": "KernelOomKiller",
    "[ 1234.5678] Out of Memory: Kill process 48213 (python) score 1234567 and children.": "KernelOomKiller",
    "Nov 30 10:00:00 gpu-7 systemd[1]: Reached target System Shutdown.": "HostWentDown",
    "Nov 30 10:00:00 gpu-7 systemd-shutdown[1]: Sending SIGTERM to remaining processes...": "HostWentDown",
    "[ 1234.5678] reboot: Restarting system": "HostWentDown",
    "[ 1234.5678] mce: [Hardware Error]: Machine check: Processor context corrupt": "HostWentDown",
    "[ 1234.5678] bond0: now running without any active interface!": "HostWentDown",
    "=>> PBS: job killed: mem 33554432kb exceeded limit 33554432kb": "SchedulerMemoryLimitKill",
    "PBS: job killed: vmem 68719476736b exceeded limit 68719476736b": "SchedulerMemoryLimitKill",
    "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.": "SchedulerMemoryLimitKill",
    "=>> PBS: job killed: mem job total 67108864 kb exceeded limit 33554432 kb": "SchedulerMemoryLimitKill",
    "TERM_SWAP: job killed after reaching LSF swap usage limit.": "SchedulerMemoryLimitKill",
    "Cgroup mem limit exceeded: ": "SchedulerMemoryLimitKill",
    "Error from slot1_3@node12: Job has gone over cgroup memory limit of 16384 megabytes.": "SchedulerMemoryLimitKill",
    "Error from slot1_3@node12: Worker node is out of memory": "SchedulerMemoryLimitKill",
    "OutOfMemoryError: Container killed due to memory usage": "SchedulerMemoryLimitKill",
    "MemoryError: ResourceExhaustedError: Fail to alloc memory of 4294967296 size, error code is 12.": (
        "HostAllocatorFailed"
    ),
    "ggml_aligned_malloc: insufficient memory (attempted to allocate 24576.00 MB)": "HostAllocatorFailed",
    "=>> PBS: job killed: cput job total 7300 secs exceeded limit 7200 secs": "JobTimeLimitReached",
    "06/30/2024 10:00:00|execd|node1|W|job 123.1 exceeded hard wallclock time - initiate terminate method": (
        "JobTimeLimitReached"
    ),
    'job 123 exceeds job hard limit "h_cpu" of queue "all.q@node1" (7201.00000 > limit:7200.00000) - sending SIGKILL': (
        "JobTimeLimitReached"
    ),
    "The job exceeded allowed execute duration of 3+00:00:00": "JobTimeLimitReached",
    "3.127s: job.exception f2Q5Wj8dXq type=timeout severity=0 resource allocation expired": "JobTimeLimitReached",
    "Job requeued, execution node r1i0n3 down": "SchedulerRecordedNodeLoss",
    "TERM_RC_RECLAIM: job killed and requeued by LSF due to execution host reclaim.": "SchedulerRecordedNodeLoss",
    "Job disconnected too long: JobLeaseDuration (2400 seconds) expired": "SchedulerRecordedNodeLoss",
    "Workload was evicted as there was no replacement for unhealthy node(s): gke-tpu-v5p-pool-a1b2-node-3": (
        "SchedulerRecordedNodeLoss"
    ),
    "Preempted to accommodate a workload (UID: 5c1d2e3f-1111, JobUID: 9f8e7d6c-2222) due to prioritization in the "
    "ClusterQueue; preemptor path: /team-a; preemptee path: /team-b": "SchedulerRecordedNodeLoss",
    "Deleting node gke-a3-pool-5f6e-abcd because it does not exist in the cloud provider": "SchedulerRecordedNodeLoss",
    "Marking for deletion Pod llama-ft-worker-1 from Node gke-a3-pool-5f6e-abcd": "SchedulerRecordedNodeLoss",
    "[ 1234.5678] mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count": (
        "Mlx5AdapterFault"
    ),
    "[ 1234.5678] mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak of a "
    "command resource": "Mlx5AdapterFault",
    "[ 1234.5678] mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x10: High temperature": (
        "Mlx5AdapterFault"
    ),
    "Job has exceeded allocated disk (20.0 GB). Consider increasing the value of request_disk.": "DiskQuotaExceeded",
    "torch.OutOfMemoryError: out of resource: triton_tem_fused_0 Required: 147456 Hardware limit:101376 Reducing "
    "block sizes or `num_stages` may help.": "KernelExceedsHardwareLimit",
    # a TensorFlow / JAX job's remote task gone (TensorFlow's ClusterCoordinator reads these as the task's failure)
    "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed": "RemoteTaskUnreachable",
    "tensorflow.python.framework.errors_impl.UnavailableError: From /job:worker/replica:0/task:3:": (
        "RemoteTaskUnreachable"
    ),
    "jaxlib.xla_extension.XlaRuntimeError: UNAVAILABLE: Stream removed": "RemoteTaskUnreachable",
    "E0926 17:26:32.000000  157988 coordination_service.cc:1100] Use error polling to propagate the following error "
    "to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):": (
        "RemoteTaskUnreachable"
    ),
    "jaxlib._jax.XlaRuntimeError: FAILED_PRECONDITION: Task with incarnation id 3446767950926952 is not connected": (
        "RemoteTaskUnreachable"
    ),
    "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown.": (
        "DriverLibraryVersionMismatch"
    ),
    "Nov 30 10:00:00 gpu-7 systemd-networkd[1021]: ibp94s0: Lost carrier": "InfinibandPortDown",
    "[ 1234.5678] nvidia 0000:3b:00.0: AER: can't recover (no error_detected callback)": "PcieUncorrectedError",
    "[ 1234.5678] pcieport 0000:00:03.0: AER: Uncorrectable (Fatal) error received: 0000:3b:00.0": (
        "PcieUncorrectedError"
    ),
    # the other stacks' own words (XLA / TensorFlow, ROCm's runtime and amdgpu, torch_npu and CANN, Habana's driver,
    # the Neuron runtime, Intel's XCCL and oneCCL, libtpu)
    "ValueError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 8.00M. That was not "
    "possible. There are 6.32M free.": "TensorFlowXlaOutOfMemory",
    "ValueError: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.": (
        "TensorFlowXlaOutOfMemory"
    ),
    "Internal: Failed copying input tensor from /job:localhost/replica:0/task:0/device:CPU:0 to "
    "/job:localhost/replica:0/task:0/device:GPU:0 in order to run _EagerConst: Dst tensor is not initialized.": (
        "TensorFlowXlaOutOfMemory"
    ),
    "OOM when allocating tensor with shape[1024,1024] and type float on /job:localhost/replica:0/task:0/device:CPU:0 "
    "by allocator cpu": "TensorFlowHostOutOfMemory",
    "Memory access fault by GPU node-2 (Agent handle: 0x55d0) on address 0x7f95. Reason: DRAM ECC failure.": (
        "AcceleratorHardwareFault"
    ),
    "[ 1234.5678] amdgpu 0000:c3:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block": (
        "AcceleratorHardwareFault"
    ),
    "RuntimeError: NPU function error: HBM MULTI BIT ECC ERROR, error code is 507054": "AcceleratorHardwareFault",
    "habanalabs hl0: Device heartbeat failed! PCI link is healthy": "AcceleratorHardwareFault",
    "Uncorrectable HBM memory error is detected. Execution results may be invalid.": "AcceleratorHardwareFault",
    "[ 1234.5678] amdgpu 0000:c3:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=123, emitted seq=125": (
        "GenericGpuFault"
    ),
    "RuntimeError: Allocation failed : Device memory : required :4294967296 | free :1073741824": (
        "GenericDeviceOutOfMemory"
    ),
    "E39999: aclrtMalloc failed, error code is 207001": "GenericDeviceOutOfMemory",
    "2024-Jun-11 03:14:07.123 TDRV:log_dev_mem Failed to allocate 4.000GB (usage: tensors) on ND 0:NC 4": (
        "GenericDeviceOutOfMemory"
    ),
    "RuntimeError: HIP error: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!": (
        "GenericCudaUsageError"
    ),
    "torch.distributed.DistBackendError: Work timed out after 1800123 milliseconds.": "NcclWatchdogTimeout",
    "|CCL_ERROR| KVS get error: timeout limit: 121 > 120, prefix: CCL_POD_ADDR0, key 0": "DistributedStoreTimeout",
    # host-memory allocators (PyTorch's CPU allocator, NumPy, Arrow's memory_pool.cc, Rust's std alloc, CPython's
    # errors.c, ENOMEM), a DataLoader's fd sharing, the datasets library's disk check
    "RuntimeError: [enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: not enough memory: you tried to "
    "allocate 34359738368 bytes.": "HostAllocatorFailed",
    "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 12.0 GiB for an array with shape (40000, 40000)": (
        "HostAllocatorFailed"
    ),
    "pyarrow.lib.ArrowMemoryError: Out of memory: realloc of size 4294967296 failed": "HostAllocatorFailed",
    "memory allocation of 34359738368 bytes failed": "HostAllocatorFailed",
    "Fatal Python error: Cannot recover from MemoryErrors while normalizing exceptions.": "HostAllocatorFailed",
    "OSError: [Errno 12] Cannot allocate memory": "HostAllocatorFailed",
    "Error: fork/exec /usr/bin/python3: cannot allocate memory": "GenericHostOutOfMemory",
    "RuntimeError: received 0 items of ancdata": "TooManyOpenFiles",
    "OSError: Not enough disk space. Needed: 120.00 GiB (download: 50.00 GiB, generated: 70.00 GiB)": (
        "NoSpaceLeftOnDevice"
    ),
}


@pytest.mark.parametrize(("line", "reason"), sorted(PHRASINGS.items()))
def test_every_fault_class_matches_its_real_phrasings(line: str, reason: str) -> None:
    assert reason in [r.reason for r in builtin_rules().match(line)]


@pytest.mark.parametrize("line", [
    # Node.js says ENOSPC for "too many file watchers" too, and Python's watchdog errno 28; the disk has room
    "Error: ENOSPC: System limit for number of file watchers reached, watch '/app/src'",
    "OSError: [Errno 28] inotify watch limit reached",
])
def test_the_inotify_limit_is_no_full_disk(line: str) -> None:
    assert [r.reason for r in builtin_rules().match(line) if r.category.value == "disk_full"] == []


@pytest.mark.parametrize("line", [
    "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 40321 got signal: 15",
    "Received 10 death signal, shutting down workers",
])
def test_only_a_hangup_is_read_as_the_launching_terminal_closing(line: str) -> None:
    # SIGTERM may come from a scheduler, a preemption or a person: which one, the line does not say
    assert "LaunchTerminalHangup" not in [r.reason for r in builtin_rules().match(line)]


# Lines that look close to a fault but are not that fault.
NOT_THIS = [
    # the store answered with a refusal, not a timeout: no wait that ran out
    ("[4] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', "
     "but store->get('0') got error: Connection reset by peer", Category.NCCL_HANG),
    # Lustre's other negated errnos: -2 is ENOENT, -280 no errno of a full disk
    ("LustreError: 3456:0:(file.c:4123) lookup failed: rc = -2", Category.DISK_FULL),
    ("LustreError: 3456:0:(file.c:4123) failed: rc = -280", Category.DISK_FULL),
    # the NPU's heartbeat, lost between the host's driver and the device, is the device's fault, not a lost node
    ("[ERROR] DRV(4242,python):2024-05-01-10:00:00.000 hb_host.c:171 device heartbeat lost", Category.NODE_LOST),
    # a job named after the library is no failure of it
    ("MPIJob default/nccl-tests has failed", Category.NCCL_ERROR),
    # HCCL's EI0007 is a resource it could not allocate (device memory or notify registers): no configuration error
    ("EI0007: Failed to allocate resource[notify] with info [rank 3]. Reason: Memory resources are exhausted.",
     Category.USER_ERROR),
    # PyTorch's allocator refusing a size no GPU has is no GPU out of memory
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory.", Category.GPU_OOM),
    # a wrong address at start-up answers the same way; a client that retries has not lost its peer
    ("tensorflow.python.framework.errors_impl.UnavailableError: failed to connect to all addresses",
     Category.NODE_LOST),
    ("W grpc_client.cc:88] UNAVAILABLE: Socket closed, retrying in 2 s", Category.NODE_LOST),
    (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600013 "
        "milliseconds before timing out.",
        Category.NCCL_ERROR,
    ),
    (
        "[PG 0 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=GATHER) ran for 600027 milliseconds before timing out.",
        Category.NCCL_ERROR,
    ),
    (
        "(raylet) node_manager.cc:3069: 0 Workers (tasks / actors) killed due to memory pressure (OOM), 1 Workers "
        "crashed due to other reasons",
        Category.HOST_OOM,
    ),
    ("NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, MMU Fault", Category.GPU_HARDWARE),
    ("NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE; OOB enp61s0f0:10.21.18.45<0>", Category.NCCL_ERROR),
    ("(raylet) Spilled 6144 MiB, 12 objects, write throughput 1257 MiB/s.", Category.DISK_FULL),
    (
        "step:12 - actor/pg_loss:0.001 - perf/max_memory_allocated_gb:62.4 - perf/cpu_memory_used_gb:102.4",
        Category.GPU_OOM,
    ),
    ("we handle a KeyError here by retrying", Category.USER_ERROR),
    # Slurm cancelling a step without a reason (scancel, a time limit) says nothing of the node
    ("slurmstepd: error: *** STEP 4242.0 ON gpu-node-03 CANCELLED AT 2025-01-02T03:04:05 ***", Category.NODE_LOST),
    ("slurmstepd: error: *** JOB 4242 ON gpu-node-03 CANCELLED AT 2025-01-02T03:04:05 DUE TO TIME LIMIT ***",
     Category.NODE_LOST),
    # a GPU allocation that TensorFlow reports as exhausted names no path: not a full disk
    ("Resource exhausted: OOM when allocating tensor with shape[1024,4096]", Category.DISK_FULL),
    ("INFO: ValueError handling is enabled", Category.USER_ERROR),
    # PyTorch's warning that one address family would not bind (the other did), and a bind that will be retried
    ("[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in "
     "use).", Category.USER_ERROR),
    ("gRPC server bind failed: Address already in use, retrying on another port", Category.USER_ERROR),
    # a userspace OOM killer that only reports memory pressure has killed nothing
    ("systemd-oomd[588]: Swap used (92.1%) over threshold, no candidates to kill", Category.HOST_OOM),
]


@pytest.mark.parametrize(("line", "category"), NOT_THIS)
def test_near_misses_are_not_that_fault(line: str, category: Category) -> None:
    assert [r.reason for r in builtin_rules().match(line) if r.permanent and r.category is category] == []


def scan_both(rules: RuleSet, raw: bytes, block: int) -> tuple[list, list, ScanStats]:
    stats = ScanStats()
    fast = [
        (m.rule.reason, m.line_no, m.text, m.truncated)
        for m in rules.scan_stream(io.BytesIO(raw), "x.log", stats=stats, block_bytes=block)
    ]
    slow = [(m.rule.reason, m.line_no, m.text, m.truncated) for m in rules.scan(iter_lines(io.BytesIO(raw)), "x.log")]
    return fast, slow, stats


@pytest.mark.parametrize("block", [1, 7, 64, 4096, 1 << 22])
def test_stream_scan_equals_line_scan_on_awkward_input(block: int) -> None:
    rules = builtin_rules()
    raw = (
        b"\xff\xfe garbage \x80\r\n"
        b"ok line\r\n"
        b"RuntimeError: CUDA out of memory. Tried to allocate 2 GiB\r\n"
        b"\n\n"
        b"NVRM: Xid (PCI:0000:44:00): 79, pid=1, GPU has fallen off the bus.\n"
        b"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 9 "
        b"milliseconds before timing out.\n"
        b"The actor died because its node has died. Node Id: 1f2e\xc3\n"
        b"last line without newline: OSError: [Errno 28] No space left on device"
    )
    fast, slow, stats = scan_both(rules, raw, block)
    assert fast == slow
    assert [reason for reason, *_ in fast if reason in {"CudaOutOfMemory", "NoSpaceLeftOnDevice"}] == [
        "CudaOutOfMemory",
        "NoSpaceLeftOnDevice",
    ]
    assert stats.lines == len(list(iter_lines(io.BytesIO(raw)))) and stats.bytes == len(raw)


@pytest.mark.parametrize("block", [1000, 1 << 20])
def test_stream_scan_cuts_huge_lines_like_the_line_reader(block: int) -> None:
    rules = builtin_rules().signatures()  # the exact matches below are signatures' (generic rules read shapes)
    early = b"ModuleNotFoundError: No module named 'x' " + b"z" * (3 * MAX_LINE_BYTES) + b"\n"
    late = b"y" * (MAX_LINE_BYTES + 10) + b" ModuleNotFoundError: No module named 'x'\n"
    tail = b"a" * (2 * MAX_LINE_BYTES)  # a huge last line without a newline
    raw = b"first\n" + early + late + b"KeyError: 'k'\n" + tail
    fast, slow, stats = scan_both(rules, raw, block)
    assert fast == slow
    assert [(reason, line, truncated) for reason, line, _, truncated in fast] == [
        ("PythonImportError", 2, True),
        ("PythonException", 4, False),
    ]
    assert stats.lines == 5


def test_stream_scan_equals_line_scan_on_a_random_mix() -> None:
    rules = builtin_rules()
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
    pool = [line for p in sorted(fixtures.glob("*/*.log")) for line in p.read_bytes().splitlines()]
    rng = random.Random(3)
    noise = [b"step:%d - loss:0.1 - lr:1e-6" % i for i in range(50)] + [b"NCCL INFO Channel 00 : 0 -> 1 via P2P"]
    raw = b"\n".join(rng.choice(pool) if rng.random() < 0.2 else rng.choice(noise) for _ in range(3000))
    fast, slow, _ = scan_both(rules, raw, 8192)
    assert fast == slow and len(fast) > 100


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "bait",
    [
        "NET/IB : " * 7000,
        "gloo " * 12000 + "Connection",
        "NVRM: Xid (" * 5000,
        "OSError: " + "x" * 60000,
        "nvlink " * 9000,
        "PytorchStreamWriter failed writing file " * 1500,
        "Key '" + "a" * 60000,
        "DataLoader worker (pid " * 2500,
        "ERROR 03-05 00:25:45 [core.py:1094] " * 1500 + "Traceback",
        "16.42ba/s]: Traceback (most recent call last) " * 1200,
        "ray.exceptions.RayTaskError: ray::" * 1800,
        'exec: \\"' * 8000,
        "LustreError: rc = -2 " * 3000,
        "libfabric:1:1::efa:cq:" * 2500,
        "This thread has been waiting for " * 1800,
        "retrieving ncclUniqueId from [0] via c10d key-value store by key '" * 800,
    ],
)
def test_new_rules_stay_linear_on_hostile_lines(bait: str) -> None:
    assert_matches_quickly(builtin_rules(), bait)


# --- the hyperscan gate (native=True) and the regex gate (native=False) give the same matches ---------

FIXTURE_LOGS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "logs").glob("*/*.log"))


def scan_gates(rules: RuleSet, raw: bytes, block: int) -> tuple[list, list, list]:
    """Matches of the native gate, the regex gate and the line API, as comparable tuples."""

    def stream(native: bool) -> list:
        stats = ScanStats()
        found = [
            (m.rule.reason, m.line_no, m.text, m.truncated)
            for m in rules.scan_stream(io.BytesIO(raw), "x.log", stats=stats, block_bytes=block, native=native)
        ]
        assert stats.bytes == len(raw)
        return found

    lines = [(m.rule.reason, m.line_no, m.text, m.truncated) for m in rules.scan(iter_lines(io.BytesIO(raw)), "x")]
    return stream(True), stream(False), lines


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("block", [97, 1 << 22])
def test_native_and_regex_gates_agree_on_every_fixture(path: Path, block: int) -> None:
    rules = builtin_rules()
    native, regex, lines = scan_gates(rules, path.read_bytes(), block)
    assert native == regex == lines


ICASE_RULES = """\
source: '*'
rules:
  - reason: ShoutedLink
    category: gpu_hardware
    type: temporary
    pattern: '(?i)nvlink (down|error)'
  - reason: InlineFold
    category: unknown
    type: temporary
    pattern: 'disk (?i:quota) exceeded'
  - reason: NonAscii
    category: unknown
    type: temporary
    pattern: 'Speicher (voll|erschöpft)'
  - reason: Spanning
    category: unknown
    type: permanent
    pattern: 'abc\\ndef|plain tail'
"""


def test_native_and_regex_gates_agree_across_block_boundaries() -> None:
    # every gate literal split at every offset: the block size walks the cut through each literal
    rules = builtin_rules()
    raw = (
        b"x\nOSError: [Errno 28] No space left on device\nNVRM: Xid (PCI:0000:44:00): 79, pid=1, GPU has fallen "
        b"off the bus.\nRemapping Failure Occurred        : Yes\nKeyError: 'responses'\n"
    )
    for block in range(1, 64):
        native, regex, lines = scan_gates(rules, raw, block)
        assert native == regex == lines and len(native) >= 4, block


def test_native_and_regex_gates_agree_on_case_and_non_ascii(tmp_path: Path) -> None:
    rules = RuleSet.load([write(tmp_path, ICASE_RULES)])
    raw = "\n".join(
        [
            "NVLINK ERROR on gpu 3",
            "nvLink Down",
            "nvlink fine",
            "disk QUOTA exceeded",
            "DISK quota exceeded",  # the fold covers `quota` only
            "Speicher erschöpft",
            "SPEICHER ERSCHÖPFT",
            "abc",
            "def plain tail",
        ]
    ).encode("utf-8")
    for block in (1, 5, 4096):
        native, regex, lines = scan_gates(rules, raw, block)
        assert native == regex == lines, block
    assert [(reason, line) for reason, line, *_ in native] == [
        ("ShoutedLink", 1),
        ("ShoutedLink", 2),
        ("InlineFold", 4),
        ("NonAscii", 6),
        ("Spanning", 9),
    ]


@pytest.mark.parametrize("block", [1000, 1 << 20])
def test_native_and_regex_gates_agree_on_very_long_lines(block: int) -> None:
    rules = builtin_rules().signatures()  # the exact matches below are signatures' (generic rules read shapes)
    hit = b"OSError: [Errno 28] No space left on device"
    raw = b"".join(
        [
            b"z" * (MAX_LINE_CHARS - len(hit)) + hit + b"\n",  # ends right at the matched part's end: kept
            b"z" * (MAX_LINE_CHARS - 5) + hit + b"\n",  # the cut falls inside the phrase: no match
            b"y" * (MAX_LINE_BYTES - 5) + hit + b"\n",  # cut while reading, inside the phrase
            b"x" * (3 * MAX_LINE_BYTES) + hit + b"\n",  # far past the cut
            hit + b"q" * (2 * MAX_LINE_BYTES) + b"\n",
            b"KeyError: 'k'" + b"w" * 70_000 + b" ValueError: v\n",
        ]
    )
    native, regex, lines = scan_gates(rules, raw, block)
    assert native == regex == lines
    assert [(reason, line, cut) for reason, line, _, cut in native] == [
        ("NoSpaceLeftOnDevice", 1, False),
        ("NoSpaceLeftOnDevice", 5, True),
        ("PythonException", 6, True),
    ]


def test_native_and_regex_gates_agree_on_non_utf8_bytes() -> None:
    rules = builtin_rules().signatures()  # the exact matches below are signatures' (generic rules read shapes)
    raw = (
        b"\xffKeyError: 'a'\xfe\n"
        b"OSError: [Err\x80no 28] No space\x80left on device\n"  # bad bytes inside the phrases: no match
        b"\xc3OSError: [Errno 28] No space left on device\xc3\r\n"
        b"NVRM: Xid (\xe2\x82PCI:0000:44:00): 79, pid=1, GPU has fallen off the bus.\n"
        b"\x00\x00\x00Remapping Failure Occurred : yes\x00\n"
        b"\xf0\x9f\x98KeyError: 'b'"
    )
    for block in (1, 3, 16, 4096):
        native, regex, lines = scan_gates(rules, raw, block)
        assert native == regex == lines, block
    assert {line for _, line, *_ in native} == {1, 3, 4, 5, 6}


def test_native_and_regex_gates_agree_on_a_random_mix_of_literals() -> None:
    # lines built from the gate's own literals in random case, cut and glued to bad bytes: most are near
    # misses, so the gate finds many lines whose rules then fail
    rules = builtin_rules()
    pool = [line for p in FIXTURE_LOGS for line in p.read_bytes().splitlines() if line.strip()]
    rng = random.Random(11)
    junk = [b"\xff", b"\xc3", b"\r", b" ", b"Error", b"KILL", b"Xid ", b"nvlink", b"yes", b"map"]

    def mangle(line: bytes) -> bytes:
        cut = rng.randrange(len(line))
        line = line[:cut] + rng.choice(junk) + line[cut:]
        if rng.random() < 0.3:
            line = line.swapcase() if rng.random() < 0.5 else line.lower()
        return line

    raw = b"\n".join(mangle(rng.choice(pool)) if rng.random() < 0.6 else rng.choice(pool) for _ in range(4000))
    for block in (333, 1 << 16):
        native, regex, lines = scan_gates(rules, raw, block)
        assert native == regex == lines and len(native) > 500, block


# What launchers and log stores put in front of a line (core.line_shapes): rules read the line after it, so a rule
# anchored at a line's start reads a torchrun rank's traceback as it reads a bare one.
HEADS = [
    "2024-05-01T10:00:00.123456789Z stderr F ",  # CRI (containerd, CRI-O)
    "2024-05-01T10:00:00.123456789Z ",  # kubectl logs --timestamps
    "May  1 10:00:00 gpu-node-3 python[4242]: ",  # syslog / journald
    "(RayTrainWorker pid=1234, ip=10.0.0.7) ",  # Ray's worker prefix
    "[rank3]:",  # torchrun
    "[default3]:",
    "[1,3]<stderr>:",  # mpirun --tag-output
    "3: ",  # srun -l, horovodrun
    "worker-3: ",  # pdsh
    "2024-05-01T10:00:00Z stdout F (TaskRunner pid=9, ip=10.0.0.8) [rank0]: ",
    # a log pasted into an issue or a mail: quoted, quoted twice, indented as a markdown code block, or both
    "> ",
    "> > ",
    "    ",
    "\t",
    ">     ",
    "    2024-05-01T10:00:00Z stderr F [rank1]:",
    # kubectl logs --prefix, docker compose logs, journalctl -o short-iso, grep -Hn over a job's logs, cat -n
    "(worker1, rank=1, pid=2345, ip=10.0.0.2) ",  # SkyPilot
    "[3]<stderr>:",  # Horovod
    "[pod/trainer-worker-0/pytorch] ",
    "trainer-1  | ",
    "2024-05-01T10:00:00+0000 gpu-node-3 python[4242]: ",
    "logs/worker-3.log:1234:",
    "    12\t",
]
ANCHORED = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce',
    "0: [HorovodAllreduce_gradients_AddN_0, HorovodAllreduce_gradients_AddN_1]",
    "Cuda failure 'out of memory'",
    "[W socket.cpp:601] [c10d] The client socket has failed to connect to [n]:22456 (errno: 22 - Invalid argument).",
]
ANCHORED_LAST = [
    "#  Rank  0 Group  0 Pid  12345 on     node-1 device  0 [0x07] NVIDIA A100-SXM4-80GB",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw",
]


@pytest.mark.parametrize("head", HEADS)
def test_rules_read_a_line_past_the_head_a_launcher_put_on_it(head: str) -> None:
    rules = builtin_rules()
    assert all(rules.match(line) for line in ANCHORED[:-1])  # each is some rule's line when bare
    for line in ANCHORED:
        assert [r.reason for r in rules.match(head + line)] == [r.reason for r in rules.match(line)], line
    for line in ANCHORED_LAST:  # read only as a finished log's last line
        assert [m.rule.reason for m in rules.ending((7, head + line), "x.log")] == ["LogEndsInCollectiveBenchmark"]


def test_a_whole_line_exclusion_reads_past_the_head() -> None:
    # A torch warning about a retried connect is no communication failure, whatever rank printed it.
    warning = ANCHORED[-1]
    rules = builtin_rules()
    assert "GenericCommunicationFailure" not in [r.reason for r in rules.match(warning)]
    assert "GenericCommunicationFailure" not in [r.reason for r in rules.match("[rank0]:" + warning)]


def _read_alike_by_both_scans(raw: bytes, block: int, lines: int) -> tuple[set[tuple[str, int]], dict[int, str]]:
    """The (rule, line) matches and each matched line's text, once both scans agreed and counted `lines` lines."""
    fast, slow, stats = scan_both(builtin_rules(), raw, block)
    assert fast == slow
    assert stats.lines == lines
    return {(reason, line) for reason, line, *_ in fast}, {line: text for _, line, text, _ in fast}


@pytest.mark.parametrize("block", [1, 64, 1 << 22])
def test_a_log_copied_off_a_web_page_is_read_through_its_entities_and_spaces_by_both_scans(block: int) -> None:
    raw = (
        b"gpu-1:4242:4300 [0] NCCL INFO transport/net_socket.cc:342 -&gt; 2\n"
        b"RuntimeError: unable to write to file &lt;/torch_123_456_0&gt;: No space left on device (28)\n"
        b"a lone &amp; and a URL's ?a=1&amp;notify=2 &#10; stay one line each\n"
        + "torch.OutOfMemoryError:\u00a0CUDA\u00a0out\u00a0of\u00a0memory.\u00a0Tried\n".encode()  # off a page
    )
    found, texts = _read_alike_by_both_scans(raw, block, lines=4)
    assert {("GenericNcclErrorTrail", 1), ("NoSpaceLeftOnDevice", 2), ("CudaOutOfMemory", 4)} <= found
    assert set(texts) == {1, 2, 4}
    assert texts[1].endswith("-&gt; 2")  # the evidence is the line as written


@pytest.mark.parametrize("block", [1, 64, 1 << 22])
def test_colours_and_json_around_lines_are_read_through_by_both_scans(block: int) -> None:
    raw = (
        b"\x1b[1m\x1b[31mtorch.OutOfMemoryError\x1b[0m: CUDA \x1b[1mout of memory\x1b[0m. Tried to allocate 2 GiB\n"
        b'{"log":"OSError: [Errno 28] No space left on device\\n","stream":"stderr","time":"2024-05-01T10:00:00Z"}\n'
        b"{'loss': 0.5}\n"
        b"\x1b[36m(TaskRunner pid=2)\x1b[0m Traceback (most recent call last):\n"
    )
    found, texts = _read_alike_by_both_scans(raw, block, lines=4)
    assert {("CudaOutOfMemory", 1), ("NoSpaceLeftOnDevice", 2)} <= found
    assert texts[1].startswith("\x1b[1m\x1b[31mtorch.OutOfMemoryError")  # the evidence is the line as written
    assert texts[2].startswith('{"log":"OSError')


@pytest.mark.parametrize("line", [
    # every rank prints it once rank 0's store is gone, at the end of a healthy run too
    '[rank3]:[W501 ProcessGroupNCCL.cpp:1400] Failed to check the "should dump" flag on TCPStore, (maybe TCPStore '
    "server has shut down too early), with error: Connection reset by peer",
    # start-up noise at scale: the client says it retries
    "W0501 TCPStore.cpp:343] [c10d] TCP client failed to connect/validate to host node-1:29500 - retrying (try=0, "
    "timeout=1800000ms, delay=1532ms): Connection reset by peer",
    # torchrun killing a worker that ignored its SIGTERM: the agent's kill, not the kernel's
    "torch.distributed.elastic.multiprocessing.api: [WARNING] Unable to shutdown process 36072 via Signals.SIGTERM, "
    "forcefully exiting via Signals.SIGKILL",
    # the GCS's housekeeping on any node's removal
    "(gcs_server) gcs_job_manager.cc:300: Node is dead, marking all jobs with drivers on this node as finished.",
    # NCCL retrying a verbs call, at INFO
    "host:48213:48213 [0] NCCL INFO Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, "
    "retrying 1/5 after 100 msec of sleep",
    # torch.multiprocessing.spawn's teardown of the others after one failed; a finaliser at exit; Python's resource
    # tracker restarting on the same (live) host
    "Unable to shutdown process 48213 via SIGTERM , forcefully exiting via SIGKILL",
    "AssertionError: can only test a child process",
    "UserWarning: resource_tracker: process died unexpectedly, relaunching.  Some resources might leak.",
    # what healthy nodes, pods and runs print, read by no rule (nvidia-smi, Slurm <= 17.02, the fabric manager, docker,
    # SkyPilot, a termination handler, Ray's metrics exporter, kubectl describe, the kubelet, NFS, c10d, vLLM)
    "NVML: Unable to retrieve NVLink information as all links are inActive",
    "slurmstepd: error: Exceeded job memory limit at some point.",
    "Double Bit ECC                    : N/A",
    "Double Bit ECC : 0",
    "[    4.123] NVRM: GPU 0000:07:00.0: Failed to enable MSI; falling back to PCIe virtual-wire "
    "interrupts.",
    "[ERROR] [tid 1234] request to query NVSwitch device information from NVSwitch driver failed with "
    "error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
    "Nov 30 nvidia-fabricmanager: fabric manager failed with error:WARNING Nothing to do "
    "[NV_WARN_NOTHING_TO_DO]",
    "\"OOMKilled\": false,",
    "Launching a spot job that does not automatically recover from preemptions. To get automatic "
    "recovery, use managed job instead: sky jobs launch.",
    "enable-spot-interruption-draining: true,",
    "[2024-06-11 03:14:07,123 W 123 456] metric_exporter.cc:105: [1] Export metrics to agent failed: "
    "RpcError: RPC Error message: failed to connect to all addresses; RPC Error code: 14. This won't "
    "affect Ray, but you can lose metrics from the cluster.",
    "DiskPressure     False   Mon, 11 Jun 2024 03:14:07 +0000   KubeletHasNoDiskPressure     kubelet has "
    "no disk pressure",
    "Conditions:   OutOfDisk        False   Mon, 11 Jun 2024 03:14:07 +0000   KubeletHasSufficientDisk   "
    "  kubelet has sufficient disk space available",
    "Tolerations:     node.kubernetes.io/not-ready:NoExecute op=Exists for 300s",
    "Warning  FailedScheduling  5s  default-scheduler  0/4 nodes are available: 1 node(s) had "
    "untolerated taint {node.kubernetes.io/not-ready: }, 3 Insufficient nvidia.com/gpu.",
    "I0611 03:14:07.123 nodeshutdown_manager_linux.go:137] \"Creating node shutdown manager\" "
    "shutdownGracePeriodRequested=\"0s\"",
    "[12345.678] nfs: server nfs01 not responding, still trying",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [node-1]:29500 (errno: 111 - "
    "Connection refused).",
    "WARNING 06-11 03:14:07 utils.py:1234] Found ulimit of 2048 and failed to automatically increase "
    "with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: "
    "[Errno 24] Too many open files`. Consider increasing with ulimit -n",
    # a device taint (DRA) deletes a pod for a device, not for its node
    "    message: 'Device Taint manager: deleting due to NoExecute taint'",
    # a Lustre client's kernel line is no exception of the job; a soft quota's warning let the write through
    "LustreError: 167-0: fs-MDT0000-mdc-ffff: This client was evicted by fs-MDT0000; in progress operations using this "
    "service will fail.",
    "sda1: warning, user block quota exceeded.",
])
def test_teardown_and_healthy_notes_are_read_by_no_permanent_rule(line: str) -> None:
    assert [r.reason for r in builtin_rules().match(line) if r.permanent] == []


def test_a_missing_interface_stays_a_communication_failure_when_nccl_then_says_invalid_usage() -> None:
    # NCCL answers a wrong NCCL_SOCKET_IFNAME with invalid usage; the cases' threads settle it as nccl_error
    lines = [
        "host:1:1 [0] bootstrap.cc:126 NCCL WARN Bootstrap : no socket interface found",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage (run with "
        "NCCL_DEBUG=WARN for details), NCCL version 2.21.5",
    ]
    assert analyze_lines("job.log", lines, builtin_rules())["category"] == "nccl_error"
    assert analyze_lines("job.log", lines[1:], builtin_rules())["category"] == "user_error"
