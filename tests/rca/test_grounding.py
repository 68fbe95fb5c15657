"""The LLM's prose says only what the evidence shows: a sentence with a number, duration, rank, IP, time or file
the evidence does not contain is left out of the report, and the report says so."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from core.types import Category
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.grounding import Evidence, ground
from rca.llm import LlmAnalysis, LlmOutcome
from rca.redact import Redactor
from tests.support import job, make_finding, make_incident

RULES = load_rules([])
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
OOM_LOG = LogSource("rank3.log", [
    "2026-05-01 11:59:50,000 INFO step:41 - actor/loss:0.31",
    "2026-05-01 11:59:58,000 ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 "
    "has a total capacity of 79.10 GiB",
])


class FixedWriter:
    model = "fixed"

    def __init__(self, analysis: LlmAnalysis) -> None:
        self.analysis = analysis

    def analyze(self, bundle):
        return LlmOutcome(ok=True, model=self.model, seconds=1.0, analysis=self.analysis)


def report_for(summary: str, root_cause: str):
    analysis = LlmAnalysis(category="gpu_oom", summary=summary, root_cause=root_cause, evidence_refs=[1],
                           confidence=0.9)
    incident = make_incident(id="inc-0000000000ef", category=Category.UNKNOWN, reason="JobFailed",
                             subject=job("sft-7"), summary="job sft-7 failed", detected_at=T0 + timedelta(minutes=3))
    return RcaEngine(RULES, Redactor, writer=FixedWriter(analysis)).report(
        incident, [make_finding("job failed", subject=job("sft-7"))], [OOM_LOG])


def test_an_invented_duration_is_left_out_and_the_report_says_so() -> None:
    report = report_for("Rank 3 ran out of GPU memory. It was likely due to a timeout of 10 minutes.",
                        "A 2.00 GiB allocation failed on GPU 3 after step 41.")
    assert report.generator == "llm:fixed"
    assert "10 minutes" not in report.data["summary"] and "Rank 3 ran out of GPU memory." in report.markdown
    assert ("1 sentence of the LLM's summary was left out: it stated '10 minutes', which no evidence shows"
            in report.markdown)
    assert report.data["llm"]["left_out"] == [{"field": "summary", "claims": ["10 minutes"],
                                               "sentence": "It was likely due to a timeout of 10 minutes."}]
    # the sentence whose numbers all are in the evidence stays
    assert report.data["root_cause"] == "A 2.00 GiB allocation failed on GPU 3 after step 41."


def test_prose_left_with_nothing_falls_back_to_the_rule_engines_words() -> None:
    report = report_for("Node 10.0.0.9 crashed at 11:59:30.", "Rank 5 hit the limit on rank5.log.")
    assert "10.0.0.9" not in report.data["summary"] and "rank5.log" not in report.data["root_cause"]
    assert "crashed" not in report.markdown and "hit the limit" not in report.markdown
    assert report.data["summary"].startswith("gpu_oom") or "out of memory" in report.data["summary"].lower()
    assert "of the LLM's root-cause analysis was left out" in report.markdown


def test_claims_compare_as_numbers_durations_and_times() -> None:
    ev = Evidence(["2026-05-01 12:00:30,000 WorkNCCL ran for 600000 milliseconds before timing out",
                   "GPU 3 at 10.0.0.7 wrote /mnt/shared/jobs/a/logs/rank3.log"],
                  [T0, T0 + timedelta(seconds=185)])
    for sentence in ("The watchdog fired after 10 minutes.", "GPU 3.0 on 10.0.0.7 stopped at 12:00:30.",
                     "It hung for about 3 minutes.", "See rank3.log."):
        assert ground("summary", sentence, ev)[1] == [], sentence
    for sentence, claim in (("It hung for 20 minutes.", "20 minutes"), ("Rank 7 died.", "7"),
                            ("Node 10.0.0.8 died.", "10.0.0.8"), ("It stopped at 12:00:31.", "12:00:31"),
                            ("See rank4.log.", "rank4.log")):
        [dropped] = ground("summary", sentence, ev)[1]
        assert claim in dropped.claims, sentence
