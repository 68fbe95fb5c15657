"""The LLM path against a real local model (llama-server with the pinned Qwen2.5-Coder-1.5B, `make llm`):
the answer fits the schema, and the category is kept or rejected with a reason. (An instruction planted in a
log line is tested on the real model in tests/rca/test_hang_report.py, whose one answer serves both questions.)
A small model's answers vary, so the assertions hold for every answer the design allows, not for one model's
wording."""

from __future__ import annotations

from typing import Any

import pytest

from core.types import Category, Report
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.evidence import EvidenceBundle, LogSource
from rca.llm import LlmOutcome, LlmWriter
from rca.redact import Redactor
from tests.rca.test_report import OOM_LOG, finding, incident

pytestmark = pytest.mark.llm
RULES = load_rules([])


@pytest.fixture(scope="module")
def writer(llm_server) -> LlmWriter:
    return LlmWriter(llm_server.base_url, llm_server.model, timeout_s=240, max_retries=0)


class Recording(LlmWriter):
    """The real writer, keeping each answer it gave: one call to a small model on two cores takes about 100 s, so
    the OOM report's one answer serves both the schema test and the category test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: list[LlmOutcome] = []

    def analyze(self, bundle: EvidenceBundle) -> LlmOutcome:
        outcome = super().analyze(bundle)
        self.outcomes.append(outcome)
        return outcome


@pytest.fixture(scope="module")
def oom_report(llm_server) -> tuple[Report, LlmOutcome, str]:
    recording = Recording(llm_server.base_url, llm_server.model, timeout_s=240, max_retries=0)
    engine = RcaEngine(RULES, Redactor, writer=recording)
    report = engine.report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")], [OOM_LOG])
    [outcome] = recording.outcomes
    return report, outcome, recording.model


def test_the_answer_fits_the_schema(oom_report: tuple[Report, LlmOutcome, str]) -> None:
    _, outcome, _ = oom_report
    assert outcome.ok, outcome.error
    analysis = outcome.analysis
    assert analysis is not None and Category(analysis.category)
    assert analysis.summary.strip() and analysis.root_cause.strip() and 0 <= analysis.confidence <= 1
    assert outcome.seconds > 0


def test_the_category_is_kept_or_rejected_with_a_reason(oom_report: tuple[Report, LlmOutcome, str]) -> None:
    report, _, model = oom_report
    llm = report.data["llm"]
    assert llm["ok"], llm["error"]
    assert report.category is Category.GPU_OOM  # a matched OOM signature is never overruled
    if llm["category"] == "gpu_oom":
        assert llm["accepted"] and report.generator == f"llm:{model}"
    else:
        assert not llm["accepted"] and "rejected" in llm["note"] and report.generator == "deterministic"
        assert "LLM review: the LLM proposed" in report.markdown


def test_where_the_rules_see_nothing_a_supported_llm_category_is_accepted_and_capped(writer: LlmWriter) -> None:
    # No rule matches this wording (not even a generic one); the bundle carries the line as salient, and the LLM may
    # read it as a GPU OOM and cite it, which shows it ("alloc failed").
    unknown = LogSource("rank0.log", [
        "2026-05-01 11:59:50,000 INFO step:41 - actor/loss:0.31",
        "2026-05-01 11:59:58,000 ERROR engine: KV cache alloc failed on GPU 3 (needed 2048 MiB, 0 MiB free); "
        "the engine cannot continue",
    ])
    engine = RcaEngine(RULES, Redactor, writer=writer)
    report = engine.report(incident(), [finding("JobFailed", Category.UNKNOWN, "job failed")], [unknown])
    assert report.data["deterministic"]["category"] == "unknown"
    assert any(e["why"].startswith("salient") and "alloc failed" in e["text"] for e in report.data["evidence"])
    llm = report.data["llm"]
    assert llm["ok"], llm["error"]
    if llm["accepted"] and llm["category"] != "unknown":
        assert report.confidence <= 0.5 and report.category.value == llm["category"]
    else:
        assert report.category is Category.UNKNOWN and llm["note"]
