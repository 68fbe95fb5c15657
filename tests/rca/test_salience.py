"""When no rule explains a failure, the LLM reads the lines a person would (rca/salience.py): a traceback's end and
last frames, failure words, the log's last lines; and the prompt no longer anchors it on "unknown"."""

from __future__ import annotations

from core.types import Category
from detectors.engine import RuleSet, load_rules
from rca.engine import RcaEngine
from rca.evidence import EvidenceBuilder, LogSource
from rca.llm import LlmWriter
from rca.redact import Redactor
from rca.salience import salient_lines
from tests.rca.test_report import finding, incident

RULES = load_rules()
# A failure no rule reads: the program's own exception at the end of a traceback. The built-in rules read a traceback's
# header as the generic "a traceback without a known exception" (user_error, low confidence); without that one rule,
# nothing reads QUIET_FAILURE, which is what these tests need.
RULES_BUT_THE_TRACEBACK_SHAPE = RuleSet([r for r in (*RULES.rules, *RULES.endings)
                                         if r.reason != "GenericTracebackWithoutException"])

# Worded so no rule (signature or generic) reads it: the failure is visible only to a reader.
QUIET_FAILURE = [
    "2026-05-01 11:59:40,000 INFO step:40 - actor/loss:0.33",
    "2026-05-01 11:59:50,000 INFO step:41 - actor/loss:0.31",
    *[f"2026-05-01 11:59:5{i},000 INFO rollout batch {i} done" for i in range(5)],
    "(TaskRunner pid=77) Traceback (most recent call last):",
    '(TaskRunner pid=77)   File "/app/main.py", line 12, in <module>',
    "(TaskRunner pid=77)     run()",
    '(TaskRunner pid=77)   File "/app/trainer.py", line 88, in run',
    "(TaskRunner pid=77)     self.reward_fn(batch)",
    "(TaskRunner pid=77) rewards.Mismatch: reward model returned 7 scores for 8 samples",
    "2026-05-01 12:00:01,000 INFO shutting down workers",
    "2026-05-01 12:00:02,000 INFO bye",
]


def test_the_pass_picks_a_tracebacks_end_its_last_frames_and_the_end_of_the_log() -> None:
    picked = {s.line_no: s for s in salient_lines(QUIET_FAILURE, limit=10)}
    assert picked[13].why == "traceback end" and "rewards.Mismatch" in picked[13].text
    assert {10, 11} <= set(picked) and picked[10].why == "last frame"  # the frame that raised, and its source line
    assert 15 in picked and picked[15].why == "end of log"
    assert 1 not in picked  # a plain progress line early in the log is not salient
    assert [s.line_no for s in salient_lines(QUIET_FAILURE, limit=10)] == sorted(picked)


def test_the_pass_is_bounded_on_a_huge_noisy_log() -> None:
    noisy = [f"ERROR retry {i} failed" for i in range(100_000)]
    picked = salient_lines(noisy, limit=25)
    assert len(picked) == 25 and picked[-1].line_no == 100_000  # the end of the log is always among them
    assert salient_lines([], limit=5) == [] and salient_lines(["", "  "], limit=5) == []


def test_with_no_rule_match_the_bundle_carries_the_salient_lines_and_the_prompt_does_not_anchor_on_unknown() -> None:
    builder = EvidenceBuilder(RULES_BUT_THE_TRACEBACK_SHAPE, Redactor(), token_budget=3000)
    bundle, verdict = builder.build(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")],
                                    [LogSource("driver.log", QUIET_FAILURE)])
    assert verdict.category is Category.UNKNOWN and verdict.winner is None
    salient = [e for e in bundle.evidence if e.why.startswith("salient")]
    assert any("rewards.Mismatch" in e.text for e in salient) and any(e.line == 15 for e in salient)
    writer = LlmWriter("http://127.0.0.1:9/v1", "m")  # nothing is sent: the prompt is only rendered
    system, human = (text for _, text in writer.messages(bundle))
    assert "Rule engine verdict: none." in human and "Rule engine verdict: unknown" not in human
    assert "(salient: traceback end) :: (TaskRunner pid=77) rewards.Mismatch" in human
    assert "no hint at all" in system


def test_a_matched_rule_keeps_the_bundle_to_its_own_lines() -> None:
    builder = EvidenceBuilder(RULES, Redactor(), token_budget=3000)
    log = [*QUIET_FAILURE, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    bundle, verdict = builder.build(incident(), [], [LogSource("driver.log", log)])
    assert verdict.category is Category.GPU_OOM
    assert not any(e.why.startswith("salient") for e in bundle.evidence)


def test_the_llm_category_replaces_only_no_failure_found() -> None:
    """Rules-only and LLM-assisted from the same reports: an LLM category is kept only where the rules found
    nothing, so the LLM can add to the rules' accuracy and never take from it."""
    from rca.classify import classify
    from rca.verdict import decide

    nothing = classify([])
    generic = classify(list(RULES.scan(["pydantic_core._pydantic_core.ValidationError: 1 validation error"], "x")))
    cited = ["(TaskRunner pid=77) Traceback (most recent call last):",
             "(TaskRunner pid=77) rewards.Mismatch: reward model returned 7 scores for 8 samples"]
    assert not decide(nothing, "user_error", 0.9, cited[1:], RULES).accepted  # no line of it shows a failure
    assert decide(nothing, "user_error", 0.9, cited, RULES).accepted
    assert decide(nothing, "user_error", 0.9, cited, RULES).confidence == 0.5
    refused = decide(generic, "gpu_oom", 0.9, ["CUDA out of memory"], RULES)
    assert not refused.accepted and refused.category is Category.USER_ERROR and "generic rule" in refused.note


def test_an_offline_report_of_a_quiet_failure_names_what_the_log_shows() -> None:
    from rca.offline import report_logs

    report = report_logs(RcaEngine(RULES_BUT_THE_TRACEBACK_SHAPE, Redactor), "quiet",
                         [LogSource("driver.log", QUIET_FAILURE)])
    assert report.category is Category.UNKNOWN and report.data["llm"] is None
    assert "rewards.Mismatch" in report.markdown  # the salient lines are the report's evidence too


def test_a_cited_line_must_show_the_failure_not_only_name_the_subsystem() -> None:
    """Measured: the small LLM called three healthy NCCL logs nccl_error, citing NCCL INFO and harmless WARN lines;
    a line that names NCCL (or a node, or a timeout setting) shows no failure of it."""
    from rca.classify import classify
    from rca.verdict import decide

    nothing = classify([])
    healthy = ["ip-172-31-13-103:9740:9740 [2] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v3 symbol.",
               "full-debug2-test-1:4024:4055 [0] net_fastsocket.cc:674 NCCL WARN Maximum retry reached for connect 3.",
               "gpu1:1050:1315 [0] NCCL INFO Channel 10/0 : 0[90000] -> 1[1000] [send] via NET/Socket/2"]
    assert not decide(nothing, "nccl_error", 0.9, healthy, RULES).accepted
    assert not decide(nothing, "nccl_hang", 0.9, ["trainer.timeout=1800 nccl_timeout: 600"], RULES).accepted
    assert not decide(nothing, "node_lost", 0.9, ["node_rank=0 nnodes=2 master_addr=10.0.0.1"], RULES).accepted
    # NCCL falling back to sockets, and Ray's object store using /tmp because /dev/shm is small: runs that go on
    assert not decide(nothing, "nccl_error", 0.9, ["v100-gpu-1:14926:14926 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to "
                                                   "open libibverbs.so[.1]"], RULES).accepted
    assert not decide(nothing, "disk_full", 0.9, ["WARNING services.py:2159 -- WARNING: The object store is using /tmp "
                                                  "instead of /dev/shm because /dev/shm has only 5368709120 bytes "
                                                  "available. This will harm performance!"], RULES).accepted
    assert decide(nothing, "disk_full", 0.9, ["NCCL WARN Error: failed to extend /dev/shm/nccl-ZX to 9637892 bytes"],
                  RULES).accepted
    failing = "gpu1:1050:1316 [0] NCCL WARN Net : Connect to 10.0.0.2<43215> failed : No route to host"
    assert decide(nothing, "nccl_error", 0.9, [*healthy, failing], RULES).accepted
    assert decide(nothing, "node_lost", 0.9, ["worker node 10.0.0.9 went down at step 12; node is dead"],
                  RULES).accepted


def test_what_only_an_observation_shows_and_routine_lines_do_not_make_the_llm_stand() -> None:
    """Measured on the test fold: where no rule saw a failure, the small LLM turned a Ray warning that a task "cannot
    be scheduled right now" into unschedulable and the autoscaler's INFO line ending an idle node into idle_gpu; both
    runs went on. Idle GPUs and unschedulable jobs are observed (metrics, Ray's state), never read from a log, and a
    line logged at INFO, or a warning without a failure word, shows the run going on."""
    from rca.classify import classify
    from rca.verdict import decide

    nothing = classify([])
    waiting = ["2020-12-30 06:30:42,910 WARNING worker.py:1034 -- The actor or task with ID ffff cannot be scheduled "
               "right now. It requires {CPU: 4.000000} for placement", ". The required resources may be added as "
               "autoscaling takes place or placement groups are scheduled."]
    assert not decide(nothing, "unschedulable", 0.9, waiting, RULES).accepted
    idle = ["example-cluster,default:2022-01-26 08:16:21,856\tINFO autoscaler.py:437 -- StandardAutoscaler: "
            "Terminating the node with id example-cluster-ray-worker-x: idle for 5 min, GPU utilization 0"]
    assert not decide(nothing, "idle_gpu", 0.9, idle, RULES).accepted
    routine = ["[2025-02-11 20:08:00,117 I 4121 4121] main.cc:284: Raylet graceful shutdown triggered, reason = "
               "EXPECTED_TERMINATION; node 14ce9f is down"]
    refused = decide(nothing, "node_lost", 0.9, routine, RULES)
    assert not refused.accepted and "INFO" in refused.note
    # a line with no level, or an error or a warning in failure words, still shows its category
    assert decide(nothing, "node_lost", 0.9, ["Message: TFJob myjob has failed because 1 Worker replica(s) failed. "
                                              "Node gke-pool-1 was preempted"], RULES).accepted
    assert decide(nothing, "node_lost", 0.9, ["[2025-02-11 20:08:00,117 E 4121 4121] node 10.0.0.9 is dead"],
                  RULES).accepted


def test_a_line_that_says_it_is_no_failure_and_glogs_routine_letters_do_not_make_the_llm_stand() -> None:
    """Measured on rounds 15-16 of the evaluation set: the small LLM called a healthy TensorFlow run gpu_oom from its
    allocator's warning, which reads "ran out of memory" and then says it is not a failure."""
    from rca.classify import classify
    from rca.verdict import decide

    nothing = classify([])
    disclaimed = ["W tensorflow/core/common_runtime/bfc_allocator.cc:237] Allocator (GPU_0_bfc) ran out of memory "
                  "trying to allocate 2.39GiB with freed_by_count=0. The caller indicates that this is not a failure, "
                  "but may mean that there could be performance gains if more memory were available."]
    assert not decide(nothing, "gpu_oom", 0.9, disclaimed, RULES).accepted
    assert not decide(nothing, "user_error", 0.9, ["2018-11-29 13:20:56.276236: W tensorflow/core/framework/"
                                                   "op_kernel.cc:1192] Out of range: End of sequence"], RULES).accepted
    assert not decide(nothing, "node_lost", 0.9, ["I0512 10:00:00.123456 4242 coordinator.cc:88] worker 3 is down "
                                                  "for maintenance, as planned"], RULES).accepted
    # a part named is not a part failed, a feature named is not the event, a figure reported is no OOM
    assert not decide(nothing, "gpu_hardware", 0.9, ["GPU 0: NVLink 4 links active, PCIe Gen4 x16, ECC enabled"],
                      RULES).accepted
    assert not decide(nothing, "node_lost", 0.9, ["Using preemptible nodes for the rollout workers"], RULES).accepted
    assert not decide(nothing, "host_oom", 0.9, ["CPU Virtual Memory: used = 26.4 GB, memory usage 84.6%"],
                      RULES).accepted
    assert not decide(nothing, "nccl_hang", 0.9, ["ProcessGroupNCCL heartbeat watchdog thread started"],
                      RULES).accepted
    assert decide(nothing, "gpu_hardware", 0.9, ["GPU 3: NVLink error on link 2, replay count rising"], RULES).accepted
    assert decide(nothing, "node_lost", 0.9, ["worker-7 was preempted by the cloud provider"], RULES).accepted
    # advice that guesses shows nothing: vLLM prints it for every slow step (dev case 313, a healthy model load)
    slow_step = ("No available shared memory broadcast block found in 60 seconds. This typically happens when some "
                 "processes are hanging or doing some time-consuming work (e.g. compilation).")
    assert not decide(nothing, "nccl_hang", 0.9, [slow_step], RULES).accepted
    # glog's E and F letters are failures as much as ERROR is
    assert decide(nothing, "gpu_oom", 0.9, ["E0512 10:00:00.123456 4242 allocator.cc:12] CUDA error: out of memory "
                                            "allocating 2.0GiB"], RULES).accepted
