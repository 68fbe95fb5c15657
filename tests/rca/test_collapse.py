"""Repeated evidence lines collapse into one with a count and the range of what changed: in the bundle (what the
LLM is given), the Markdown report and its JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from core.types import Category, Evidence
from detectors.engine import load_rules
from rca.collapse import shape, varies
from rca.engine import RcaEngine
from rca.evidence import EvidenceBuilder
from rca.llm import LlmWriter
from rca.redact import Redactor
from tests.support import job, make_finding, make_incident

RULES = load_rules([])
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def hang_findings(seconds: list[int]) -> list:
    return [make_finding(f"no progress for {s} s", source="argus.stall", category=Category.NCCL_HANG,
                         reason="TrainingStalled", subject=job("grpo-1"), first_seen=T0 + timedelta(seconds=s),
                         evidence=(Evidence(source="argus.stall", at=T0 + timedelta(seconds=s),
                                            text=f"no progress for {s} s; step interval estimate 5.00 s from "
                                                 f"12 progress events; stall threshold 20 s"),))
            for s in seconds]


def incident():
    return make_incident(id="inc-0000000000cd", category=Category.NCCL_HANG, reason="TrainingStalled",
                         subject=job("grpo-1"), summary="job grpo-1 made no progress", detected_at=T0)


def test_lines_differing_only_in_numbers_and_timestamps_have_one_shape() -> None:
    assert (shape("2026-05-01 12:00:01,000 no progress for 21 s")
            == shape("2026-05-01 12:00:04,000 no progress for 24 s"))
    assert shape("no progress for 21 s") != shape("progress resumed after 21 s")
    assert varies(["no progress for 21 s; threshold 20 s", "no progress for 24 s; threshold 20 s",
                   "no progress for 22 s; threshold 20 s"]) == "21–24 s"
    assert varies(["12:00:01 stuck", "12:00:02 stuck"]) is None  # only the time changed


def test_a_hang_reports_four_near_identical_lines_as_one_with_a_count() -> None:
    findings = hang_findings([21, 22, 23, 24])
    bundle, _ = EvidenceBuilder(RULES, Redactor()).build(incident(), findings)
    stall = [e for e in bundle.evidence if e.source == "argus.stall"]
    assert len(stall) == 1
    line = stall[0]
    assert line.repeats == 4 and line.varies == "21–24 s" and "21 s" in line.text
    assert line.at == T0 + timedelta(seconds=21) and line.last_at == T0 + timedelta(seconds=24)
    assert [e.ref for e in bundle.evidence] == list(range(1, len(bundle.evidence) + 1))

    report = RcaEngine(RULES, Redactor).report(incident(), findings)
    assert "no progress for 22 s;" not in report.markdown and "no progress for 24 s;" not in report.markdown
    assert "(×4, 21–24 s; the first shown)" in report.markdown
    [data] = [e for e in report.data["evidence"] if e["source"] == "argus.stall"]
    assert data["repeats"] == 4 and data["varies"] == "21–24 s"


def test_the_llm_is_given_the_collapsed_line() -> None:
    bundle, _ = EvidenceBuilder(RULES, Redactor()).build(incident(), hang_findings([21, 22, 23, 24]))
    writer = LlmWriter("http://127.0.0.1:9/v1", "m")
    prompt = writer.messages(bundle)[1][1]
    assert "(×4, 21–24 s; the first shown)" in prompt
    assert "no progress for 22 s" not in prompt and "no progress for 24 s" not in prompt


def test_lines_from_different_sources_or_of_different_shapes_stay_apart() -> None:
    findings = hang_findings([21]) + [make_finding("NCCL WARN rank 3 timeout", source="rank3.log"),
                                      make_finding("NCCL WARN rank 4 timeout", source="rank4.log")]
    bundle, _ = EvidenceBuilder(RULES, Redactor()).build(incident(), findings)
    assert all(e.repeats == 1 for e in bundle.evidence)
    assert {"rank3.log", "rank4.log"} <= {e.source for e in bundle.evidence}
