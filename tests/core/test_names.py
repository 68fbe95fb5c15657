"""core.names: a job is named by its submission id with its JobSpec name and owner, a node by its name and IP;
metadata from outside is bounded, one line and printable, whatever it holds."""

from __future__ import annotations

import pytest

from core.names import (
    NAME_MAX,
    Named,
    clean,
    entrypoint_of,
    job_identity,
    job_label,
    job_of,
    label_of,
    node_label,
    node_of,
    placement_of,
)
from core.types import Subject, SubjectKind

SID = "pretrain-20261122T084034Z-eff5"
NODE_ID = "a" * 56
ENTRY = "cd /mnt/shared/common/code/demo && /usr/bin/python gloo_steps.py --steps 100000"


def job(sid: str = SID, name: str | None = None, **attrs) -> Named:
    return Named(Subject(kind=SubjectKind.JOB, id=sid, name=name), attrs)


def node(name: str | None = None, **attrs) -> Named:
    return Named(Subject(kind=SubjectKind.NODE, id=NODE_ID, name=name), attrs)


def test_a_job_with_metadata_is_its_submission_id_with_name_and_owner():
    identity = job_identity({"name": "pretrain", "owner": "alice", "workload": "sft", "argus": "1"})
    assert (identity.name, identity.owner) == ("pretrain", "alice")
    item = job(name=identity.name, owner=identity.owner, entrypoint=ENTRY)
    assert label_of(item) == f"job {SID} (pretrain, owner alice)"
    assert job_of(item) == f"{SID} (pretrain, owner alice)"
    assert job_of(item, with_owner=False) == f"{SID} (pretrain)"
    assert ENTRY not in label_of(item) and entrypoint_of(item) == ENTRY


def test_a_job_without_metadata_is_its_submission_id_alone():
    assert job_identity(None) == job_identity({}) == job_identity("name=x")
    assert label_of(job()) == f"job {SID}"
    assert label_of(job(owner="bob")) == f"job {SID} (owner bob)"
    # other tools' metadata keys: "user" for the owner, "job_name" for the name
    assert job_identity({"user": "carol", "job_name": "eval"}) == job_identity({"owner": "carol", "name": "eval"})
    # a name that is the id says nothing more
    assert label_of(job(name=SID)) == f"job {SID}"


def test_the_name_in_attrs_wins_over_the_subject_and_a_job_named_only_in_attrs_is_found():
    assert label_of(job(name="old", job_name="pretrain")) == f"job {SID} (pretrain)"
    on_node = node("10.0.0.3", submission_id=SID, job_name="pretrain", owner="alice", node_name="gpu-w1")
    assert job_of(on_node) == f"{SID} (pretrain, owner alice)"
    assert label_of(on_node) == "node gpu-w1 (10.0.0.3)"


@pytest.mark.parametrize("value", [
    "pre\ntrain", "pre\rtrain\x00", "pre\u202etrain", "pre\u200btrain", "  pre   train  ", "pre\u2028train",
])
def test_hostile_names_become_one_printable_line(value):
    name = clean(value)
    assert name is not None and name.replace(" ", "") == "pretrain"
    assert all(c.isprintable() for c in name)


def test_huge_and_non_string_metadata_are_bounded_or_ignored():
    huge = "x" * 5_000_000
    identity = job_identity({"name": huge, "owner": {"nested": "dict"}})
    assert identity.name is not None and len(identity.name) == NAME_MAX and identity.name.endswith("…")
    assert identity.owner is None
    assert job_identity({"name": 42, "owner": ["a"]}) == job_identity({})
    label = label_of(job(name=huge, owner="o" * 10_000))
    assert len(label) < 4 + 64 + 2 * NAME_MAX + 20
    # a markup-looking name stays text here; each renderer escapes it for its own markup
    assert clean("<script>@all [x](http://e)") == "<script>@all [x](http://e)"
    assert clean("\n\t ") is None and clean("") is None and clean(None) is None


def test_a_node_is_its_name_and_ip_never_the_bare_ray_id_when_the_ip_is_known():
    assert label_of(node("10.0.0.7", node_name="gpu-worker-3")) == "node gpu-worker-3 (10.0.0.7)"
    # Ray's default node name is the IP: said once
    assert label_of(node("10.0.0.7", node_name="10.0.0.7")) == "node 10.0.0.7"
    assert label_of(node("10.0.0.7")) == "node 10.0.0.7"
    assert label_of(node(None, node_ip="10.0.0.8")) == "node 10.0.0.8"
    assert label_of(node(None, node_name="gpu-worker-3")) == "node gpu-worker-3"
    assert label_of(node()) == f"node {NODE_ID}"  # nothing else known: the id is all there is
    assert NODE_ID not in label_of(node("10.0.0.7"))
    assert node_of(job()) is None and node_of(job(node_id=NODE_ID, node_ip="10.0.0.9")) == "10.0.0.9"
    assert node_label(None, None, None) == "(unknown node)"


def test_other_subjects_and_a_missing_id():
    gpu = Named(Subject(kind=SubjectKind.GPU, id="GPU-1234", name="w1/gpu0"), {})
    assert label_of(gpu) == "gpu w1/gpu0"
    cluster = Named(Subject(kind=SubjectKind.CLUSTER, id="/mnt/shared", name=None), {})
    assert label_of(cluster) == "cluster /mnt/shared"
    assert job_label("\n") == "(no id)"


def test_placement_is_read_back_typed_and_bounded():
    attrs = {"job_placement": [
        {"node_id": NODE_ID, "node_ip": "10.0.0.3", "node_name": "gpu-w1", "gpus": 4},
        {"node_id": "b" * 56, "node_ip": "10.0.0.4", "node_name": None, "gpus": 0.5},
        {"node_ip": "10.0.0.5", "gpus": "4"},  # not a number
        {"node_ip": "10.0.0.6", "gpus": float("nan")},
        {"node_ip": "10.0.0.6", "gpus": -1},
        {"gpus": 2},  # no node
        "10.0.0.7",
    ]}
    placed = placement_of(attrs)
    assert [(p.label, p.gpus) for p in placed] == [("gpu-w1 (10.0.0.3)", 4.0), ("10.0.0.4", 0.5)]
    assert placement_of({"job_placement": "10.0.0.3"}) == placement_of(None) == ()
    assert len(placement_of({"job_placement": [{"node_ip": "10.0.0.3", "gpus": 1}] * 10_000})) == 256
