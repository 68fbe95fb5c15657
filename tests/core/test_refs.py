"""core.refs: which jobs, node and GPU a finding or an incident is about.

The job-id rule is pinned to argus.correlate's `jobs_of` (copied below as it stood when core.refs was made),
so correlate can switch to core.refs.jobs_of without changing which incidents it joins.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from core.refs import Refs, jobs_of, refs_from, refs_of
from core.types import Category, Finding, Incident, IncidentState, Severity, Subject, SubjectKind

AT = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)


def correlate_jobs_of(subject_kind: SubjectKind, subject_id: str, attrs: dict[str, Any]) -> set[str]:
    """argus/correlate.py's rule, verbatim: the reference core.refs.jobs_of must match."""
    jobs: set[str] = set()
    if subject_kind is SubjectKind.JOB:
        jobs.add(subject_id)
    for job in attrs.get("jobs") or []:
        if isinstance(job, dict):
            jobs.update(str(v) for k in ("submission_id", "job_id") if (v := job.get(k)))
        elif isinstance(job, str):
            jobs.add(job)
    if isinstance(attrs.get("submission_id"), str):
        jobs.add(attrs["submission_id"])
    return jobs


def incident(kind: SubjectKind, sid: str, name: str | None = None, **attrs: Any) -> Incident:
    return Incident(id="inc-1", fingerprint="f", category=Category.NODE_LOST,
                    subject=Subject(kind=kind, id=sid, name=name), state=IncidentState.OPEN,
                    severity=Severity.CRITICAL, summary="s", reason="r", first_seen=AT,
                    last_seen=AT, detected_at=AT, attrs=attrs)


LOST_NODE_JOBS = [{"job_id": "02000000", "submission_id": "raysubmit_a", "status": "RUNNING"},
                  {"job_id": "03000000", "submission_id": None, "status": "FAILED"},
                  "raysubmit_plain", {"job_id": 7}, {"other": "x"}, 42, None]

CASES: list[tuple[SubjectKind, str, dict[str, Any]]] = [
    (SubjectKind.JOB, "raysubmit_j", {}),
    (SubjectKind.JOB, "raysubmit_j", {"submission_id": "raysubmit_j"}),
    (SubjectKind.JOB, "raysubmit_j", {"submission_id": "raysubmit_other"}),
    (SubjectKind.NODE, "n1", {"jobs": LOST_NODE_JOBS}),
    (SubjectKind.NODE, "n1", {"jobs": []}),
    (SubjectKind.NODE, "n1", {"jobs": None, "submission_id": None}),
    (SubjectKind.NODE, "n1", {"submission_id": 5}),
    (SubjectKind.NODE, "n1", {"submission_id": ""}),  # kept as correlate keeps it
    (SubjectKind.GPU, "GPU-1", {"submission_id": "raysubmit_g"}),
    (SubjectKind.CLUSTER, "ray", {}),
]


@pytest.mark.parametrize(("kind", "subject_id", "attrs"), CASES)
def test_job_ids_are_correlates_rule(kind: SubjectKind, subject_id: str, attrs: dict[str, Any]) -> None:
    assert jobs_of(kind, subject_id, attrs) == correlate_jobs_of(kind, subject_id, attrs)
    assert refs_of(incident(kind, subject_id, **attrs)).job_ids == correlate_jobs_of(kind, subject_id, attrs)


def test_a_lost_node_names_every_id_of_its_jobs_and_acts_on_submission_ids_only() -> None:
    refs = refs_of(incident(SubjectKind.NODE, "n1", "10.0.0.3", node_ip="10.0.0.3", jobs=LOST_NODE_JOBS))
    assert refs.job_ids == {"02000000", "raysubmit_a", "03000000", "raysubmit_plain", "7"}
    # steps act on submission ids that dicts name: never Ray's job ids, never bare strings
    assert refs.submission_ids == ("raysubmit_a",) and refs.actionable_submission_ids == ["raysubmit_a"]
    assert refs.submission_id is None
    assert (refs.node_id, refs.node_ip, refs.gpu) == ("n1", "10.0.0.3", None)


def test_submission_ids_keep_their_order_and_drop_repeats_and_unsafe_ids() -> None:
    jobs = [{"submission_id": "b"}, {"submission_id": "../../etc"}, {"submission_id": "a"}, {"submission_id": "b"}]
    refs = refs_of(incident(SubjectKind.JOB, "a", submission_id="c", jobs=jobs))
    assert refs.submission_ids == ("a", "c", "b", "../../etc")
    assert refs.actionable_submission_ids == ["a", "c", "b"]


def test_the_job_it_is_about_is_named_in_attrs_first_then_by_a_job_subject() -> None:
    assert refs_of(incident(SubjectKind.JOB, "raysubmit_j")).submission_id == "raysubmit_j"
    assert refs_of(incident(SubjectKind.JOB, "raysubmit_j", submission_id="x")).submission_id == "x"
    assert refs_of(incident(SubjectKind.JOB, "raysubmit_j", submission_id="")).submission_id == "raysubmit_j"
    assert refs_of(incident(SubjectKind.NODE, "n1", submission_id="x")).submission_id == "x"
    assert refs_of(incident(SubjectKind.NODE, "n1")).submission_id is None


def test_the_node_is_the_subject_or_what_attrs_name() -> None:
    assert refs_of(incident(SubjectKind.NODE, "n1", "10.0.0.3")) == Refs(
        node_id="n1", node_ip="10.0.0.3", affected_node_id="n1", affected_node_ip="10.0.0.3")
    # attrs name the IP over the subject's name (a Prometheus instance carries its port)
    scraped = incident(SubjectKind.NODE, "10.0.0.3:9400", "10.0.0.3:9400", node_ip="10.0.0.3")
    assert refs_of(scraped).node_ip == "10.0.0.3"
    log_line = refs_of(incident(SubjectKind.JOB, "raysubmit_j", node_id="n2", node_ip="10.0.0.4"))
    assert (log_line.node_id, log_line.node_ip) == ("n2", "10.0.0.4")
    # a GPU's incident names no node: draining on a GPU claim needs the node named in attrs
    gpu = refs_of(incident(SubjectKind.GPU, "GPU-1", "host/gpu0"))
    assert (gpu.gpu, gpu.node_id, gpu.node_ip) == ("GPU-1", None, None)


def test_values_of_the_wrong_type_are_ignored() -> None:
    refs = refs_of(incident(SubjectKind.CLUSTER, "ray", node_id=3, node_ip=["10.0.0.1"], jobs="raysubmit_a",
                            submission_id={"x": 1}))
    assert refs == Refs()


def test_a_finding_reads_the_same_as_its_incident() -> None:
    finding = Finding(category=Category.NODE_LOST, reason="RayNodeDead",
                      subject=Subject(kind=SubjectKind.NODE, id="n1"), summary="s",
                      attrs={"node_ip": "10.0.0.3", "jobs": LOST_NODE_JOBS})
    assert refs_of(finding) == refs_from(finding.subject, finding.attrs)
    assert refs_of(finding) == refs_of(incident(SubjectKind.NODE, "n1", node_ip="10.0.0.3", jobs=LOST_NODE_JOBS))


def test_huge_attrs_are_read_in_one_pass() -> None:
    jobs = [{"submission_id": f"raysubmit_{i}", "job_id": f"{i:08x}"} for i in range(50_000)]
    refs = refs_of(incident(SubjectKind.NODE, "n1", jobs=jobs, node_ip="x" * 1_000_000))
    assert len(refs.submission_ids) == 50_000 and len(refs.job_ids) == 100_000
    assert refs.node_ip is not None and len(refs.node_ip) == 1_000_000


# --- the node a fault struck -----------------------------------------------------------------------------------

STRUCK = "9" * 56


def test_a_jobs_host_oom_names_the_node_it_struck_apart_from_where_it_was_written() -> None:
    refs = refs_of(incident(SubjectKind.JOB, "job-1", node_id="h" * 56, node_ip="10.0.0.1",
                            affected_node_id=STRUCK, affected_node_ip="10.0.0.4"))
    assert (refs.node_id, refs.node_ip) == ("h" * 56, "10.0.0.1")
    assert (refs.affected_node_id, refs.affected_node_ip) == (STRUCK, "10.0.0.4")


def test_a_node_subject_is_the_node_it_struck() -> None:
    refs = refs_of(incident(SubjectKind.NODE, STRUCK, "10.0.0.4"))
    assert (refs.affected_node_id, refs.affected_node_ip) == (STRUCK, "10.0.0.4")


def test_a_node_subject_named_by_another_nodes_line_does_not_take_the_writers_ip() -> None:
    written_by_head = incident(SubjectKind.NODE, STRUCK, "10.0.0.4", node_id="h" * 56, node_ip="10.0.0.1")
    assert refs_of(written_by_head).node_ip == "10.0.0.4"
    its_own = incident(SubjectKind.NODE, STRUCK, None, node_id=STRUCK, node_ip="10.0.0.4")
    assert refs_of(its_own).node_ip == "10.0.0.4"


@pytest.mark.parametrize("bad", [5, "", None, ["x"], {"id": STRUCK}])
def test_malformed_struck_node_attrs_are_ignored(bad: object) -> None:
    refs = refs_of(incident(SubjectKind.JOB, "job-1", affected_node_id=bad, affected_node_ip=bad))
    assert refs.affected_node_id is None and refs.affected_node_ip is None
