"""LogRuleDetector: log lines to findings with rules loaded from a real YAML file in tmp_path.

The last test runs the real JobLogsCollector over real files, so the line numbers in the evidence are
the ones a person would find in the file.
"""

from __future__ import annotations

import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from core.types import Category, Severity, Signal, SignalKind, Subject, SubjectKind, fingerprint_of
from detectors.engine import RuleSet
from detectors.log_rules import LogRuleDetector

RULES = """\
source: [job-logs, worker]
rules:
  - reason: CudaOutOfMemory
    category: gpu_oom
    type: permanent
    priority: 70
    pattern: 'torch\\.(?:cuda\\.)?OutOfMemoryError: CUDA out of memory|RuntimeError: CUDA out of memory'
    action: resume from the last checkpoint with a smaller micro-batch
  - reason: CudaOomUnderNccl
    category: gpu_oom
    type: permanent
    priority: 90
    pattern: 'NCCL error.*CUDA out of memory'
  - reason: MemoryPressureWarning
    category: host_oom
    type: temporary
    pattern: 'memory usage is high'
  - reason: KernelOomKill
    category: host_oom
    type: permanent
    pattern: 'Killed process \\d+'
  - reason: RayletOnly
    category: node_lost
    type: permanent
    source: raylet
    pattern: 'marked dead'
"""

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
JOB = Subject(kind=SubjectKind.JOB, id="raysubmit_A")


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(RULES))
    return RuleSet.load([path])


def line(text: str, n: int, *, subject: Subject = JOB, stream: str = "job-logs", source: str = "/s/train.log"):
    return Signal(
        kind=SignalKind.LOG_LINE, source=source, subject=subject, text=text, line=n, observed_at=NOW,
        attrs={"stream": stream, "file": source, "truncated": False},
    )


def test_permanent_match_is_one_finding_with_context_and_line_numbers(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, context_lines=2, clock=lambda: NOW)
    signals = [line(f"step {i}", i) for i in range(1, 5)]
    signals.append(line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 5))
    signals.append(line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 6))
    findings = detector.detect(signals)
    assert len(findings) == 1
    (f,) = findings
    assert (f.category, f.reason, f.subject) == (Category.GPU_OOM, "CudaOutOfMemory", JOB)
    assert f.severity is Severity.CRITICAL
    assert [(e.source, e.line, e.text) for e in f.evidence] == [
        ("/s/train.log", 3, "step 3"),
        ("/s/train.log", 4, "step 4"),
        ("/s/train.log", 5, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ]
    assert f.recommended_action == "resume from the last checkpoint with a smaller micro-batch"
    assert f.fingerprint == fingerprint_of(Category.GPU_OOM, JOB)
    assert f.attrs["line"] == 5 and f.attrs["rule_location"].endswith("rules.yaml:3")
    assert detector.detect([line("RuntimeError: CUDA out of memory", 9)]) == []  # same subject and category


def test_fingerprint_is_stable_across_detector_instances(rules: RuleSet) -> None:
    oom = line("RuntimeError: CUDA out of memory.", 1)
    first = LogRuleDetector(rules).detect([oom])[0]
    second = LogRuleDetector(rules).detect([oom])[0]
    assert first.fingerprint == second.fingerprint


def test_each_subject_and_category_gets_its_own_finding(rules: RuleSet) -> None:
    other = Subject(kind=SubjectKind.JOB, id="raysubmit_B")
    detector = LogRuleDetector(rules)
    findings = detector.detect([
        line("RuntimeError: CUDA out of memory", 1),
        line("RuntimeError: CUDA out of memory", 1, subject=other, source="/s/b.log"),
        line("Killed process 4242 (python)", 2),
    ])
    assert sorted((f.subject.id, f.category.value) for f in findings) == [
        ("raysubmit_A", "gpu_oom"), ("raysubmit_A", "host_oom"), ("raysubmit_B", "gpu_oom"),
    ]


def test_highest_priority_rule_names_the_finding(rules: RuleSet) -> None:
    text = "NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled cuda error, NCCL version 2.18: CUDA out of memory"
    (f,) = LogRuleDetector(rules).detect([line(text, 7)])
    assert f.reason == "CudaOomUnderNccl"


def test_temporary_match_is_no_finding_but_becomes_evidence(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, context_lines=1)
    assert detector.detect([line("host memory usage is high: 95%", 10), line("step 11", 11)]) == []
    (f,) = detector.detect([line("Killed process 777 (python) total-vm:1000kB", 12)])
    assert f.category is Category.HOST_OOM
    assert [(e.line, e.text) for e in f.evidence] == [
        (10, "[MemoryPressureWarning] host memory usage is high: 95%"),
        (11, "step 11"),
        (12, "Killed process 777 (python) total-vm:1000kB"),
    ]
    assert f.attrs["temporary_before"] == ["MemoryPressureWarning"]


def test_rules_only_read_their_streams(rules: RuleSet) -> None:
    node = Subject(kind=SubjectKind.NODE, id="abc123")
    detector = LogRuleDetector(rules)
    assert detector.detect([line("node abc was marked dead", 1)]) == []  # a raylet rule, a job log line
    assert detector.detect([line("RuntimeError: CUDA out of memory", 1, subject=node, stream="raylet")]) == []
    (f,) = detector.detect([line("node abc was marked dead", 2, subject=node, stream="raylet", source="raylet.out")])
    assert (f.reason, f.subject) == ("RayletOnly", node)


def test_evidence_is_bounded_for_hostile_lines(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, evidence_chars=100, context_lines=3)
    noise = [line("z" * 60_000, i) for i in range(1, 100)]
    oom = line("RuntimeError: CUDA out of memory " + "q" * 60_000, 100)
    (f,) = detector.detect(noise + [oom])
    assert len(f.evidence) == 4
    assert all(len(e.text) <= 100 + len(" [...]") for e in f.evidence)
    assert len(f.summary) < 600


def test_state_is_bounded(rules: RuleSet) -> None:
    detector = LogRuleDetector(rules, max_sources=10, max_subjects=10, max_reported=10)
    for i in range(1000):
        subject = Subject(kind=SubjectKind.JOB, id=f"job{i}")
        detector.detect([
            line("memory usage is high", 1, subject=subject, source=f"/s/{i}.log"),
            line("RuntimeError: CUDA out of memory", 2, subject=subject, source=f"/s/{i}.log"),
        ])
    assert len(detector._context) == 10 and len(detector._temporary) == 10 and len(detector._reported) == 10


def test_real_files_through_the_collector(rules: RuleSet, tmp_path: Path) -> None:
    log = tmp_path / "shared" / "jobs" / "raysubmit_X" / "logs" / "rank3.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\nstep 2\n  File \"train.py\", line 9, in forward\n"
                   "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    collector = JobLogsCollector(tmp_path / "shared", OffsetStore(tmp_path / "offsets.json"))
    (f,) = LogRuleDetector(rules).detect(collector.collect())
    assert f.subject == Subject(kind=SubjectKind.JOB, id="raysubmit_X")
    assert (f.evidence[-1].source, f.evidence[-1].line) == (str(log), 4)
    assert f.attrs["stream"] == "job-logs"


def test_gcs_line_about_another_node_is_filed_under_that_node():
    """Real GCS text (Ray 2.60, this machine): the head logs the death of worker b056...; the finding
    must be about that node, so it shares the fingerprint of Ray's node-state verdict."""
    from core.types import Signal, SignalKind, Subject, SubjectKind
    from detectors.engine import load_rules
    from detectors.log_rules import LogRuleDetector

    dead = "b056380d7039cc26e38e58e948dd18a29be332d4ccee1e52592ea007"
    head = Subject(kind=SubjectKind.NODE, id="e" * 56, name="127.0.0.2")
    line = ("[2026-11-22 02:39:53,435 W 11279 11279] (gcs_server) gcs_health_check_manager.cc:88: "
            f"Node is dead because the health check failed. node_id={dead}")
    signal = Signal(kind=SignalKind.LOG_LINE, source="ray://127.0.0.2/gcs_server.out", subject=head, text=line,
                    line=293, attrs={"stream": "gcs"})
    [finding] = LogRuleDetector(load_rules()).detect([signal])
    assert finding.subject == Subject(kind=SubjectKind.NODE, id=dead)
    assert finding.category.value == "node_lost"


# --- node-scoped faults: filed under the node the line names ------------------------------------------------------

WORKER2 = "99417ec8d7b1e36e562b13b943ed85a5055c6e79cd586bb99034beb5"
KILLED_WORKER = "6a28c3f1e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7"
HEAD = Subject(kind=SubjectKind.NODE, id="3d17" + "0" * 52, name="127.0.0.2")
KILL = (f"1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 127.0.0.4, ID: "
        f"{WORKER2}) was 2.99GB used / 23.54GB limit (0.126893)")


def ray_line(text: str, subject: Subject, stream: str) -> Signal:
    return Signal(kind=SignalKind.LOG_LINE, source=f"ray://{subject.name}/x.log", subject=subject, text=text, line=9,
                  observed_at=NOW, attrs={"stream": stream, "node_id": HEAD.id, "node_ip": HEAD.name})


def test_the_gcs_reporting_an_oom_kill_on_another_node_files_it_under_that_node():
    """The head's gcs_server.out line the soak recorded: the worker id (same shape as a node id) comes first."""
    from core.refs import refs_of
    from detectors.engine import load_rules

    text = (f"[2026-11-25 09:57:18,089 W 30488 30488] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, "
            f"worker id = {KILLED_WORKER}, node id = {WORKER2}, address = 127.0.0.4, exit_type = NODE_OUT_OF_MEMORY, "
            f"exit_detail = {KILL}")
    [finding] = LogRuleDetector(load_rules()).detect([ray_line(text, HEAD, "gcs")])
    assert finding.category is Category.HOST_OOM
    assert finding.subject == Subject(kind=SubjectKind.NODE, id=WORKER2, name="127.0.0.4")
    assert finding.attrs["node_id"] == HEAD.id  # where the line was written, kept
    refs = refs_of(finding)
    assert (refs.node_id, refs.node_ip) == (WORKER2, "127.0.0.4")  # not the writer's IP beside the named node


def test_a_job_line_of_a_host_oom_records_the_node_it_struck():
    from detectors.engine import load_rules

    job = Subject(kind=SubjectKind.JOB, id="dataprep-1")
    [finding] = LogRuleDetector(load_rules()).detect([ray_line(f"ray.exceptions.OutOfMemoryError: {KILL}", job,
                                                               "job-logs")])
    assert finding.subject == job
    assert (finding.attrs["affected_node_id"], finding.attrs["affected_node_ip"]) == (WORKER2, "127.0.0.4")
    assert (finding.attrs["node_id"], finding.attrs["node_ip"]) == (HEAD.id, "127.0.0.2")


def test_a_line_naming_its_own_node_stays_under_it_and_gains_its_ip():
    from detectors.engine import load_rules

    me = Subject(kind=SubjectKind.NODE, id=WORKER2)
    text = (f"(raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
            f"crashed due to other reasons at node (ID: {WORKER2}, IP: 127.0.0.4) over the last time period.")
    [finding] = LogRuleDetector(load_rules()).detect([ray_line(text, me, "raylet")])
    assert finding.subject == Subject(kind=SubjectKind.NODE, id=WORKER2, name="127.0.0.4")


@pytest.mark.parametrize("text", [
    f"Reporting worker exit, worker id = {KILLED_WORKER}, exit_type = NODE_OUT_OF_MEMORY, exit_detail = 1 worker(s) "
    "were killed due to the node running low on memory.",  # only a worker id: not a node
    f"1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 1.2.3.4, ID: {'z' * 56})",
    "1 worker(s) were killed due to the node running low on memory. " + "node id = " * 50_000 + WORKER2,
])
def test_a_line_naming_no_well_formed_node_stays_with_its_writer(text: str):
    from detectors.engine import load_rules

    [finding] = LogRuleDetector(load_rules()).detect([ray_line(text, HEAD, "gcs")])
    assert finding.subject == HEAD
    assert len(finding.summary) < 1000


def test_a_job_line_naming_no_node_records_no_struck_node():
    from detectors.engine import load_rules

    job = Subject(kind=SubjectKind.JOB, id="dataprep-2")
    line_ = ray_line("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
                     job, "job-logs")
    [finding] = LogRuleDetector(load_rules()).detect([line_])
    assert "affected_node_id" not in finding.attrs


def test_ray_advice_ending_the_gcs_report_of_an_oom_kill_is_about_the_node_the_report_named():
    """The GCS's report of an OOM kill spans forty lines: the stamped first one names the node, the top memory
    users follow, and Ray's advice ends it, naming no node (recorded in a soak, head 127.0.0.2, worker 127.0.0.4).
    The advice is the same fault on the same node, not a host OOM of the head that wrote it; after a new stamped
    message that names no node, the advice is the writer's again."""
    from detectors.engine import load_rules

    detector = LogRuleDetector(load_rules())
    report = (f"[2026-11-25 12:14:33,230 W 16812 16812] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, "
              f"worker id = {KILLED_WORKER}, node id = {WORKER2}, address = 127.0.0.4, exit_type = NODE_OUT_OF_MEMORY, "
              f"exit_detail = {KILL}")
    advice = ("Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/"
              "ray-observability/user-guides/debug-apps/debug-memory.html. Consider provisioning more memory on this "
              "node or reducing task parallelism by requesting more CPUs per task.")
    lines = [report, "Top 10 memory users: PID\tMEM(GB)\tCOMMAND", "16794\t0.08\t/usr/bin/python ray start --head",
             advice]
    findings = detector.detect([ray_line(text, HEAD, "gcs") for text in lines])
    assert [f.subject for f in findings] == [Subject(kind=SubjectKind.NODE, id=WORKER2, name="127.0.0.4")]

    other = LogRuleDetector(load_rules())
    plain = "[2026-11-25 12:20:01,000 I 16812 16812] (gcs_server) gcs_server.cc:300: periodic stats"
    [finding] = other.detect([ray_line(text, HEAD, "gcs") for text in (plain, advice)])
    assert finding.subject == HEAD
