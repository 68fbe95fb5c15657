"""A report names the job by its submission id, JobSpec name and owner, and its Impact lists where the job's GPUs
were (the placement the loop saw, kept in the incident's attrs); what is not known is said plainly."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from markdown_it import MarkdownIt

from core.types import Category, Subject, SubjectKind
from detectors.engine import load_rules
from rca.engine import RcaEngine
from rca.evidence import LogSource
from rca.redact import Redactor
from tests.support import make_finding, make_incident

RULES = load_rules([])
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
SID = "pretrain-20261122T084034Z-eff5"
ENTRY = "cd /mnt/shared/common/code/demo && python train.py --steps 100000"
PLACEMENT = [
    {"node_id": "a" * 56, "node_ip": "10.0.0.3", "node_name": "gpu-w1", "gpus": 2.0},
    {"node_id": "b" * 56, "node_ip": "10.0.0.4", "node_name": "10.0.0.4", "gpus": 1.0},
]
OOM = LogSource("rank0.log", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."])


def incident(**attrs: Any):
    return make_incident(id="inc-0000000000cd", category=Category.GPU_OOM, reason="CudaOutOfMemory",
                         subject=Subject(kind=SubjectKind.JOB, id=SID, name=attrs.get("job_name")),
                         summary=f"CUDA OOM (job {SID})", first_seen=T0, detected_at=T0 + timedelta(minutes=30),
                         attrs=attrs)


def report(inc, findings=(), *, redactor=Redactor, job=None):
    return RcaEngine(RULES, redactor).report(inc, list(findings), [OOM], job=job)


def impact_lines(markdown: str) -> list[str]:
    section = markdown.split("## Impact", 1)[1].split("## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("- ")]


def test_impact_lists_the_jobs_nodes_and_gpus_from_placement():
    r = report(incident(job_name="pretrain", owner="alice", entrypoint=ENTRY, job_placement=PLACEMENT))
    md = r.markdown
    assert md.startswith(f"# gpu_oom on job {SID} (pretrain, owner alice) (inc-0000000000cd)")
    assert impact_lines(md)[:3] == [
        f"- Job: `{SID}` (pretrain, owner alice)",
        "- Nodes (where the job's GPUs were): `gpu-w1 (10.0.0.3)` (2 GPUs), `10.0.0.4` (1 GPU)",
        "- GPUs: 3",
    ]
    assert "GPU-hours lost: 1.5 (3 GPUs × 0.50 h from the failure to detection" in md
    assert ENTRY not in md  # the command is a detail of the incident, not a name
    impact = r.data["impact"]
    assert (impact["job"], impact["job_name"], impact["owner"]) == (SID, "pretrain", "alice")
    assert impact["label"] == f"job {SID} (pretrain, owner alice)"
    assert impact["nodes"] == ["gpu-w1 (10.0.0.3)", "10.0.0.4"] and impact["gpus"] == 3
    assert impact["placement"] == [{"node": "gpu-w1 (10.0.0.3)", "gpus": 2.0}, {"node": "10.0.0.4", "gpus": 1.0}]


def test_a_placement_known_only_to_a_later_finding_is_used():
    later = make_finding("OOM again", category=Category.GPU_OOM, reason="CudaOutOfMemory",
                         subject=Subject(kind=SubjectKind.JOB, id=SID), attrs={"job_placement": PLACEMENT[:1]})
    md = report(incident(job_name="pretrain"), [later]).markdown
    assert "- Nodes (where the job's GPUs were): `gpu-w1 (10.0.0.3)` (2 GPUs)" in md and "- GPUs: 2" in md


def test_the_job_folder_names_a_job_the_attrs_do_not():
    job = {"submission_id": SID, "owner": "bob", "spec": {"name": "sft", "owner": "bob", "nnodes": 1,
                                                           "gpus_per_node": 4}}
    md = report(incident(), job=job).markdown
    assert md.startswith(f"# gpu_oom on job {SID} (sft, owner bob)")
    lines = impact_lines(md)
    assert lines[0] == f"- Job: `{SID}` (sft, owner bob)"
    assert lines[1].startswith("- Nodes: not known") and lines[2] == "- GPUs: 4"


def test_unknown_placement_is_said_plainly():
    lines = impact_lines(report(incident()).markdown)
    assert lines[0] == f"- Job: `{SID}`"
    assert lines[1] == "- Nodes: not known (Argus did not see the job hold GPUs, and the evidence names no node)"
    assert lines[2] == "- GPUs: not known (no placement seen and no job spec with nnodes and gpus_per_node)"
    # a node the evidence names, without a placement, is shown for what it is
    lines = impact_lines(report(incident(node_ip="10.0.0.9", node_name="gpu-w9")).markdown)
    assert lines[1] == ("- Nodes: `gpu-w9 (10.0.0.9)` (where the evidence was seen; Argus did not see where the "
                        "job's GPUs were)")


def test_names_are_redacted_and_escaped_like_any_text():
    def masking() -> Redactor:
        return Redactor(mask_ips=True, mask_users=True, users=["alice"])

    r = report(incident(job_name="pretrain", owner="alice", job_placement=PLACEMENT), redactor=masking)
    assert "10.0.0.3" not in r.markdown and "alice" not in r.markdown
    assert "gpu-w1 (ip-" in r.data["impact"]["nodes"][0]
    hostile = report(incident(job_name="[click](http://evil.example) # `x`", owner="*bold*")).markdown
    html = MarkdownIt("commonmark").render(hostile)
    assert "<a " not in html and "<em>" not in html and html.count("<h1>") == 1
    assert hostile.startswith(f"# gpu_oom on job {SID} (")
