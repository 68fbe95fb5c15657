"""The LLM's prose says only what the evidence shows: a sentence with a number, duration, rank, IP, time or file
the evidence does not contain is left out of the report, and the report says so. The LLM's answer comes from a fake
writer (FixedWriter) or through the real one (LlmWriter) from a loopback server (served_report)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from core.types import Category
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.grounding import Evidence, ground
from rca.llm import LlmAnalysis, LlmOutcome, LlmWriter
from rca.redact import Redactor
from tests.rca.test_llm_failures import completion, serve
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


def test_spelled_out_counts_and_durations_are_claims_too() -> None:
    ev = Evidence(["WorkNCCL ran for 600000 milliseconds before timing out", "GPU 3 on 10.0.0.7 at step:41",
                   "two ranks waited for thirty seconds"])
    for sentence in ("The watchdog fired after ten minutes.", "A ten-minute timeout fired.", "Three ranks wait.",
                     "It waited for thirty seconds.", "Forty-one steps ran.", "Two other ranks wait.",
                     # a spelled number that counts or measures nothing is prose, not a claim
                     "One of the ranks is stuck.", "At one point the job stopped.", "It waited half a minute."):
        assert ground("summary", sentence, ev)[1] == [], sentence
    for sentence, claim in (("It hung for twenty minutes.", "twenty minutes"), ("Seven other ranks wait.",
                            "Seven other ranks"), ("Forty-two steps ran.", "Forty-two steps"),
                            ("It hung for twenty-five minutes.", "twenty-five minutes"),
                            ("A twenty-minute timeout fired.", "twenty-minute"), ("It ran a hundred steps.",
                            "a hundred steps"), ("Fifteen GPUs idle.", "Fifteen GPUs")):
        [dropped] = ground("summary", sentence, ev)[1]
        assert dropped.claims == (claim,), sentence


def served_report(answer: dict):
    """A report whose LLM answer comes through the real writer (rca/llm.py's LlmWriter and its structured output)
    from an OpenAI-compatible server on loopback that answers `answer`."""
    server = serve(lambda: (200, completion(json.dumps(answer))))
    base_url = next(server)
    try:
        incident = make_incident(id="inc-0000000000ef", category=Category.UNKNOWN, reason="JobFailed",
                                 subject=job("sft-7"), summary="job sft-7 failed",
                                 detected_at=T0 + timedelta(minutes=3))
        writer = LlmWriter(base_url, "served", timeout_s=10, max_retries=0)
        return RcaEngine(RULES, Redactor, writer=writer).report(
            incident, [make_finding("job failed", subject=job("sft-7"))], [OOM_LOG])
    finally:
        server.close()


@pytest.mark.parametrize("duration", ["10 minutes", "ten minutes"])
def test_the_llm_writers_answer_with_an_invented_duration_loses_that_sentence(duration: str) -> None:
    invented = f"The hang is due to a timeout of {duration}."
    report = served_report({"category": "gpu_oom", "summary": "Rank 3 ran out of GPU memory.",
                            "root_cause": f"A 2.00 GiB allocation failed on GPU 3 after step 41. {invented}",
                            "timeline": [], "next_steps": [], "evidence_refs": [1], "confidence": 0.9})
    assert report.generator == "llm:served" and report.data["llm"]["ok"]
    assert report.data["root_cause"] == "A 2.00 GiB allocation failed on GPU 3 after step 41."
    assert duration not in report.markdown.replace("\\", "").split("LLM prose check")[0]
    assert (f"LLM prose check: 1 sentence of the LLM's root-cause analysis was left out: it stated '{duration}', "
            "which no evidence shows." in report.markdown)
    assert report.data["llm"]["left_out"] == [{"field": "root_cause", "sentence": invented, "claims": [duration]}]
