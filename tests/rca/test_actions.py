"""Recommended actions come from a catalog (rca/actions.yaml), checked at load; the LLM chooses and orders its
ids for the verdict's category and cannot add its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.types import Category
from detectors.engine import load_rules
from rca.actions import CATALOG, CatalogError, load_catalog
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.llm import LlmAnalysis, LlmOutcome, LlmWriter
from rca.redact import Redactor
from tests.support import job, make_finding, make_incident

RULES = load_rules([])
OOM_LOG = LogSource("rank3.log", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."])


class FixedWriter:
    model = "fixed"

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.seen: list[dict[str, str]] = []

    def analyze(self, bundle):
        self.seen = bundle.actions
        analysis = LlmAnalysis(category="gpu_oom", summary="Rank 3 ran out of GPU memory.", root_cause="An OOM.",
                               next_steps=self.steps, evidence_refs=[1], confidence=0.9)
        return LlmOutcome(ok=True, model=self.model, seconds=1.0, analysis=analysis)


def report(writer=None):
    incident = make_incident(category=Category.UNKNOWN, subject=job("sft-7"), summary="job sft-7 failed")
    return RcaEngine(RULES, Redactor, writer=writer).report(incident, [make_finding(subject=job("sft-7"))], [OOM_LOG])


def test_the_shipped_catalog_covers_every_category() -> None:
    catalog = load_catalog()
    assert all(catalog.for_verdict(c) for c in Category)


def test_the_deterministic_report_lists_the_rules_action_then_the_catalogs() -> None:
    r = report()
    catalog = load_catalog().for_verdict(Category.GPU_OOM, "CudaOutOfMemory")
    assert r.data["recommended_action_ids"] == [a.id for a in catalog]
    assert r.data["recommended_actions"][1:] == [a.text for a in catalog]
    assert r.data["recommended_actions"][0] == RULES.rules[[x.reason for x in RULES.rules].index(
        "CudaOutOfMemory")].action


def test_the_llm_is_shown_the_ids_and_its_order_stands_but_its_own_words_do_not() -> None:
    writer = FixedWriter(["gpu-oom-check-leak", "Buy more GPUs", "gpu-oom-smaller-batch", "host-oom-fewer-workers"])
    r = report(writer)
    assert [a["id"] for a in writer.seen][:1] == ["gpu-oom-smaller-batch"]
    assert r.data["recommended_action_ids"] == ["gpu-oom-check-leak", "gpu-oom-smaller-batch"]
    assert r.data["llm"]["refused_steps"] == ["Buy more GPUs", "host-oom-fewer-workers"]
    assert "2 of the LLM's next steps were left out: not in the action catalog" in r.markdown
    prompt = LlmWriter("http://127.0.0.1:9/v1", "m").messages(_bundle_of(writer))[1][1]
    assert "- gpu-oom-smaller-batch: " in prompt.split("RECOMMENDED ACTIONS")[1]


def _bundle_of(writer: FixedWriter):
    from rca.evidence import EvidenceBundle
    return EvidenceBundle(incident={"id": "i", "severity": "critical", "detected_at": "t", "summary": "s",
                                    "subject": {"label": "job x"}},
                          findings=[], verdict={"category": "gpu_oom", "confidence": 1, "reason": None,
                                                "summary": "s"}, token_budget=6000, actions=writer.seen)


@pytest.mark.parametrize(("text", "error"), [
    ("gpu_oomm:\n  - {id: a, text: b}\n", "key 'gpu_oomm' is not a category"),
    ("gpu_oom: []\n", "key 'gpu_oom' needs a list of at least one action"),
    ("gpu_oom:\n  - {id: a}\n", "key gpu_oom[0]: id and text must be non-empty strings"),
    ("gpu_oom:\n  - {id: a, text: b}\n", "no actions for the categories host_oom"),
])
def test_a_bad_catalog_is_refused_naming_the_file_and_key(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "actions.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError) as exc:
        load_catalog(path)
    assert str(path) in str(exc.value) and error in str(exc.value)


def test_a_repeated_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "actions.yaml"
    path.write_text(CATALOG.read_text().replace(
        "id: host-oom-fewer-workers", "id: gpu-oom-smaller-batch"))
    with pytest.raises(CatalogError, match="used twice"):
        load_catalog(path)
