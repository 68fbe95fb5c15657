"""Reports without an LLM: every section, the decision about an LLM's category, impact in GPU-hours, and
log text that cannot turn into Markdown."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from markdown_it import MarkdownIt

from core.types import (
    Action,
    ActionState,
    Category,
    Finding,
    Incident,
    Subject,
    SubjectKind,
)
from detectors.engine import load_rules
from rca.classify import Classification
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.llm import LlmAnalysis, LlmOutcome
from rca.redact import Redactor
from rca.report import STEP_TEXT_MAX, with_actions
from rca.verdict import decide
from tests.support import job, make_finding, make_incident

RULES = load_rules([])
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
SECTIONS = ("## Summary", "## Root cause", "## Evidence", "## Timeline", "## Impact", "## Recommended actions",
            "## What Argus did", "## About this report")


def incident(category: Category = Category.UNKNOWN, reason: str = "JobFailed", **attrs: Any) -> Incident:
    return make_incident(id="inc-0000000000ab", category=category, reason=reason, subject=job("sft-7"),
                         summary="job sft-7 failed", detected_at=T0 + timedelta(minutes=3), attrs=attrs)


def finding(reason: str, category: Category, text: str, confidence: float = 1.0) -> Finding:
    return make_finding(text, source="ray.state", category=category, reason=reason, confidence=confidence,
                        subject=Subject(kind=SubjectKind.NODE, id="n1", name="10.0.0.7"))


OOM_LOG = LogSource("rank3.log", [
    "2026-05-01 11:59:50,000 INFO step:41 - actor/loss:0.31",
    "2026-05-01 11:59:58,000 ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 "
    "has a total capacity of 79.10 GiB",
    "2026-05-01 12:00:30,000 [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, "
    "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
])


def engine(writer=None) -> RcaEngine:
    return RcaEngine(RULES, Redactor, writer=writer)


def test_a_deterministic_report_has_every_section_and_its_facts() -> None:
    job = {"submission_id": "sft-7", "owner": "alice", "spec": {"nnodes": 2, "gpus_per_node": 8}}
    action = Action(id="act-1", incident_id="inc-0000000000ab", kind="keep_scene",
                    target=Subject(kind=SubjectKind.JOB, id="sft-7"), state=ActionState.SUCCEEDED,
                    idempotency_key="k", requested_by="policy", reason="before stopping anything")
    report = engine().report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")], [OOM_LOG], job=job,
                             actions=[action], last_checkpoint_at=T0 - timedelta(hours=1))
    md = report.markdown
    for section in SECTIONS:
        assert section in md, section
    assert report.category is Category.GPU_OOM and report.generator == "deterministic"
    assert "Tried to allocate 2.00 GiB" in md and "rank3.log:2" in md
    assert "step:41" in md  # the last progress line
    assert "no LLM is configured" in md
    assert "GPU-hours lost: 16.8" in md  # 16 GPUs x 1.05 h from the checkpoint to detection
    assert "keep_scene" in md and "succeeded" in md
    assert report.data["impact"]["gpus"] == 16 and report.data["rule"] == "CudaOutOfMemory"
    assert report.data["evidence"][0]["text"].startswith("2026-05-01 11:59:58,000 ERROR torch.OutOfMemoryError")


def test_an_observed_lost_node_beats_the_nccl_errors_it_caused() -> None:
    nccl = LogSource("rank0.log", ["NCCL WARN socketProgress: Connection closed by remote peer 10.0.0.7<51159>",
                                   "RuntimeError: NCCL communicator was aborted on rank 0."])
    lost = finding("RayNodeDead", Category.NODE_LOST, "Ray node 10.0.0.7 died: health check failed")
    report = engine().report(incident(Category.NODE_LOST, "RayNodeDead", node_ip="10.0.0.7"), [lost], [nccl])
    assert report.category is Category.NODE_LOST
    assert "read as its consequence" in report.markdown
    # ... but an OOM in the logs says why the node died: the root-cause signature wins
    oom = LogSource("raylet.out", ["Out of memory: Killed process 4242 (raylet) total-vm:123kB"])
    report = engine().report(incident(Category.NODE_LOST, "RayNodeDead"), [lost], [oom, nccl])
    assert report.category is Category.HOST_OOM


def test_log_text_cannot_become_markdown() -> None:
    hostile = LogSource("driver.log", [
        "# Heading from a log", "[click me](http://evil.example/x) ![img](http://evil.example/i.png)",
        "``` fence break", "<script>alert(1)</script>",
        "RuntimeError: CUDA out of memory. `code` | table | *bold* _em_",
    ])
    md = engine().report(incident(), [finding("JobFailed", Category.UNKNOWN, "[x](http://evil.example)")],
                         [hostile]).markdown
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<a href" not in html and "<img" not in html and "<script" not in html
    assert "<h1>Heading from a log" not in html
    assert md.count("```") % 2 == 0  # fences stay balanced


VERDICT = Classification(category=Category.GPU_OOM, reason="CudaOutOfMemory", summary="gpu_oom: ...",
                         evidence=[("rank3.log", 2, "torch.OutOfMemoryError: CUDA out of memory")], confidence=0.95)


def _strong(verdict: Classification) -> Classification:
    match = next(RULES.scan(["torch.OutOfMemoryError: CUDA out of memory."], source="x"))
    return replace(verdict, winner=match)


@pytest.mark.parametrize(
    ("verdict", "llm", "cited", "detected", "category", "accepted", "note"),
    [
        (_strong(VERDICT), "gpu_oom", ["x"], False, Category.GPU_OOM, True, "agrees"),
        (_strong(VERDICT), "nccl_error", ["NCCL WARN x"], False, Category.GPU_OOM, False, "does not overrule"),
        (VERDICT, "nccl_hang", ["Watchdog timeout"], True, Category.GPU_OOM, False, "observed directly"),
        (Classification(Category.UNKNOWN, None, "none"), "disk_full", ["OSError: [Errno 28] No space left on device"],
         False, Category.DISK_FULL, True, "capped at 0.5"),
        (Classification(Category.UNKNOWN, None, "none"), "gpu_hardware", [], False, Category.UNKNOWN, False,
         "cites no evidence line"),
        (Classification(Category.UNKNOWN, None, "none"), "gpu_hardware", ["step 12 loss 0.5"], False,
         Category.UNKNOWN, False, "cites no line that shows gpu_hardware"),
        (Classification(Category.UNKNOWN, None, "none"), "banana", ["x"], False, Category.UNKNOWN, False,
         "not a category"),
    ],
)
def test_whose_category_stands(verdict, llm, cited, detected, category, accepted, note) -> None:
    decision = decide(verdict, llm, 0.9, cited, RULES, detected=detected)
    assert decision.category is category and decision.accepted is accepted and note in decision.note
    if accepted and verdict.category is Category.UNKNOWN:
        assert decision.confidence <= 0.5


class FixedWriter:
    """An LLM stand-in for rendering tests only: the real server is exercised in test_llm_real.py."""

    model = "fixed"

    def __init__(self, analysis: LlmAnalysis | None, error: str | None = None) -> None:
        self.analysis, self.error = analysis, error

    def analyze(self, bundle):
        ok = self.analysis is not None
        return LlmOutcome(ok=ok, model=self.model, seconds=1.5, analysis=self.analysis, error=self.error)


def test_an_overruled_llm_leaves_the_rule_engines_report_and_says_why() -> None:
    wrong = LlmAnalysis(category="nccl_hang", summary="The collective hung.", root_cause="NCCL hang on rank 0.",
                        timeline=[], next_steps=["Set NCCL_DEBUG=INFO"], evidence_refs=[2], confidence=0.9)
    report = engine(FixedWriter(wrong)).report(incident(), [finding("JobFailed", Category.UNKNOWN, "x")], [OOM_LOG])
    assert report.category is Category.GPU_OOM and report.generator == "deterministic"
    assert "LLM review: the LLM proposed nccl_hang; rejected" in report.markdown
    assert "NCCL_DEBUG" not in report.markdown
    assert report.data["llm"] == {"model": "fixed", "ok": True, "seconds": 1.5, "error": None,
                                  "category": "nccl_hang", "confidence": 0.9, "cited": report.data["llm"]["cited"],
                                  "accepted": False, "note": report.data["llm"]["note"], "left_out": [],
                                  "refused_steps": []}


def test_an_agreeing_llm_writes_the_prose_and_its_citations_are_marked() -> None:
    good = LlmAnalysis(category="gpu_oom", summary="Rank 3 ran out of GPU memory after step 41.",
                       root_cause="A 2.00 GiB allocation failed on GPU 3; the other ranks then timed out.",
                       timeline=[{"at": "11:59:58", "event": "rank 3 CUDA OOM"}], next_steps=["Halve the micro-batch"],
                       evidence_refs=[1, 99], confidence=0.9)
    report = engine(FixedWriter(good)).report(incident(), [finding("JobFailed", Category.UNKNOWN, "x")], [OOM_LOG])
    assert report.generator == "llm:fixed" and report.category is Category.GPU_OOM
    assert "Rank 3 ran out of GPU memory after step 41." in report.markdown
    assert "LLM prose check" not in report.markdown and report.data["llm"]["left_out"] == []
    assert "(cited by the LLM)" in report.markdown
    # a free-text next step is no id of the action catalog: left out, and the report says so
    assert "1 of the LLM's next steps was left out: not in the action catalog" in report.markdown
    assert report.data["llm"]["refused_steps"] == ["Halve the micro-batch"]
    assert "Halve the micro" not in report.markdown.split("## Recommended actions")[1].split("left out")[0]


def test_a_failed_llm_gives_the_complete_deterministic_report() -> None:
    report = engine(FixedWriter(None, error="ConnectError: connection refused")).report(
        incident(), [finding("JobFailed", Category.UNKNOWN, "x")], [OOM_LOG])
    assert report.generator == "deterministic" and report.category is Category.GPU_OOM
    for section in SECTIONS:
        assert section in report.markdown
    assert "connection refused" in report.markdown


def test_the_same_input_gives_the_same_report() -> None:
    e = engine()
    assert e.report(incident(), [], [OOM_LOG]).markdown == e.report(incident(), [], [OOM_LOG]).markdown


CANNOT = ("job raysubmit_AbCdEf123456 cannot be resubmitted safely: its runtime_env package "
          "gcs://_ray_pkg_0123456789abcdef.zip is gone from the GCS (Ray drops a package once no job uses it)")
RESUMED = ("resubmitted sft-7 as sft-7-r1 from checkpoint global_step_40 (step 40), given as ARGUS_RESUME_FROM "
           "(the trainer reads it)")


def step(kind: str, state: ActionState, n: int, *, dry_run: bool = False, **result: Any) -> Action:
    return Action(id=f"act-{n}", incident_id="inc-0000000000ab", kind=kind, state=state, dry_run=dry_run,
                  target=Subject(kind=SubjectKind.JOB, id="sft-7"), idempotency_key=f"k{n}", requested_by="policy",
                  reason="policy rule lost-node", result={"step": n, **result})


def test_what_argus_did_tells_each_steps_outcome_or_preview_and_where_a_job_resumed() -> None:
    actions = [
        step("resubmit_job", ActionState.SUCCEEDED, 0, message=RESUMED, preview="would resubmit ...",
             jobs=[{"job": "sft-7", "state": "submitted", "new": "sft-7-r1", "resumes": True, "step": 40,
                    "checkpoint": "/mnt/shared/jobs/sft-7/checkpoints/global_step_40", "how": "env"}]),
        step("resubmit_job", ActionState.SKIPPED, 1, message=CANNOT,
             jobs=[{"job": "raysubmit_AbCdEf123456", "state": "skipped", "message": CANNOT}]),
        step("drain_node", ActionState.PLANNED, 2, preview="would drain node 10.0.0.7"),
        step("stop_job", ActionState.PLANNED, 3, dry_run=True),  # no preview came
    ]
    report = engine().report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")], [OOM_LOG],
                             actions=actions)
    section = report.markdown.split("## What Argus did")[1].split("## About this report")[0]
    lines = [x for x in section.splitlines() if x.startswith("- ")]
    assert lines[0] == ("- `resubmit_job` on job `sft-7`: succeeded (policy rule lost-node). Outcome: resubmitted "
                        "sft-7 as sft-7-r1 from checkpoint global\\_step\\_40 (step 40), given as "
                        "ARGUS\\_RESUME\\_FROM (the trainer reads it)")
    assert lines[1].startswith("- `resubmit_job` on job `sft-7`: skipped (policy rule lost-node). Outcome: job "
                               "raysubmit\\_AbCdEf123456 cannot be resubmitted safely: its runtime\\_env package")
    assert lines[2] == ("- `drain_node` on job `sft-7`: waits for approval (policy rule lost-node). Preview: would "
                        "drain node 10.0.0.7")
    assert lines[3] == "- `stop_job` on job `sft-7`: dry run (policy rule lost-node)"
    data = {a["id"]: a for a in report.data["actions"]}
    assert data["act-0"]["message"] == RESUMED and data["act-0"]["jobs"][0]["step"] == 40
    assert data["act-0"]["jobs"][0]["checkpoint"].endswith("global_step_40") and data["act-0"]["jobs"][0]["resumes"]
    assert data["act-1"]["message"] == CANNOT and data["act-1"]["state"] == "skipped"
    assert data["act-2"]["message"] is None and data["act-2"]["preview"] == "would drain node 10.0.0.7"


def test_a_hostile_step_message_stays_text_and_is_cut() -> None:
    hostile = "[click](http://evil.example/x) ![i](http://evil.example/i.png) <script>x</script>\n# Heading " \
              + "A" * 10_000
    report = engine().report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")],
                             actions=[step("resubmit_job", ActionState.FAILED, 0, message=hostile)])
    html = MarkdownIt("commonmark").enable("table").render(report.markdown)
    assert "<a href" not in html and "<img" not in html and "<script" not in html and "<h1>Heading" not in html
    line = next(x for x in report.markdown.splitlines() if x.startswith("- `resubmit_job`"))
    assert len(line) < STEP_TEXT_MAX + 200 and line.endswith("…")
    assert len(report.data["actions"][0]["message"]) == STEP_TEXT_MAX


def test_with_actions_rewrites_only_what_argus_did() -> None:
    planned = step("resubmit_job", ActionState.PLANNED, 0, dry_run=True, preview="would resubmit sft-7 ...")
    report = engine().report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")], [OOM_LOG],
                             actions=[planned])
    ended = planned.model_copy(update={"state": ActionState.SKIPPED, "result": {**planned.result, "message": CANNOT}})
    again = with_actions(report, [ended])
    before, after = report.markdown.split("## What Argus did"), again.markdown.split("## What Argus did")
    assert before[0] == after[0]  # everything before the section as it was
    assert before[1].split("## About this report")[1] == after[1].split("## About this report")[1]
    assert "Preview: would resubmit sft-7" in before[1] and "Preview" not in after[1]
    assert "dry run (policy rule lost-node). Outcome: job raysubmit\\_AbCdEf123456 cannot be resubmitted" in after[1]
    assert "\n\n## About this report" in again.markdown
    assert again.data["actions"][0]["message"] == CANNOT and again.data["summary"] == report.data["summary"]
    assert with_actions(again, [ended]).markdown == again.markdown  # the same steps: the same report
