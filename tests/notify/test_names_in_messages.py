"""Every IM channel names the job by its submission id with its JobSpec name and owner, and the node by its name and
IP, in the payload the platform receives (a real local receiver checking each documented format); the entrypoint
command is never the name."""

from __future__ import annotations

import json

import pytest

from argus.notify.message import build_message
from argus.store.store import Store
from core.types import Category, Finding, Report, Severity, Subject, SubjectKind
from tests.notify.conftest import KINDS, OOM, PUBLIC_URL, send
from tests.notify.platforms import texts

SID = "pretrain-20261122T084034Z-eff5"
ENTRY = "cd /mnt/shared/common/code/demo && /opt/venv/bin/python gloo_steps.py --steps 100000"
NODE_ID = "d" * 56


def named_incident(store: Store, **extra):
    attrs = {"submission_id": SID, "job_name": "pretrain", "owner": "alice", "entrypoint": ENTRY,
             "node_id": NODE_ID, "node_ip": "10.0.0.3", "node_name": "gpu-w1", **extra}
    finding = Finding(category=Category.GPU_OOM, reason="CudaOutOfMemory", severity=Severity.CRITICAL,
                      subject=Subject(kind=SubjectKind.JOB, id=SID, name="pretrain"), summary=f"{OOM} (job {SID})",
                      attrs=attrs)
    incident, created = store.record_finding(finding)
    assert created
    return incident


@pytest.mark.parametrize("kind", KINDS)
def test_each_channel_names_the_submission_id_name_owner_and_node(kind, platforms, store, clock, sleeps, client):
    platform = platforms[kind]
    incident = named_incident(store)
    body = send(platform, build_message(incident, "opened", public_url=PUBLIC_URL), clock, sleeps, client)
    if kind == "webhook":  # machines read the incident itself, plus what it is about as people name it
        about = body["about"]
        assert about["label"] == f"job {SID} (pretrain, owner alice)"
        assert (about["job"], about["node"], about["owner"]) == (f"{SID} (pretrain, owner alice)",
                                                                  "gpu-w1 (10.0.0.3)", "alice")
        assert about["entrypoint"] == ENTRY  # a detail, apart from every name
        assert body["incident"]["subject"] == {"kind": "job", "id": SID, "name": "pretrain"}
        return
    shown = "\n".join(texts(body))
    assert f"job {SID} (pretrain, owner alice)" in shown  # the title
    assert f"{SID} (pretrain)" in shown and "alice" in shown and "gpu-w1 (10.0.0.3)" in shown
    assert ENTRY not in shown and "gloo_steps.py" not in shown
    assert NODE_ID not in shown


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_without_metadata_and_a_node_without_name_still_read_well(kind, platforms, store, clock, sleeps,
                                                                         client):
    finding = Finding(category=Category.NODE_LOST, reason="RayNodeDead", severity=Severity.CRITICAL,
                      subject=Subject(kind=SubjectKind.NODE, id=NODE_ID, name="10.0.0.7"),
                      summary="Ray node 10.0.0.7 died", attrs={"node_id": NODE_ID, "node_ip": "10.0.0.7"})
    incident, _ = store.record_finding(finding)
    body = send(platforms[kind], build_message(incident, "opened", public_url=PUBLIC_URL), clock, sleeps, client)
    shown = json.dumps(body["about"]) if kind == "webhook" else "\n".join(texts(body))
    assert "node 10.0.0.7" in shown and NODE_ID not in shown


def test_the_reports_job_folder_names_a_job_the_incident_does_not(store):
    finding = Finding(category=Category.GPU_OOM, reason="CudaOutOfMemory", summary="CUDA OOM",
                      subject=Subject(kind=SubjectKind.JOB, id=SID), attrs={"owner": None})
    incident, _ = store.record_finding(finding)
    report = store.add_report(Report(
        id="", incident_id=incident.id, category=incident.category, confidence=0.9, generator="deterministic",
        summary="OOM", markdown="# r\n",
        data={"impact": {"job": SID, "job_name": "sft", "owner": "bob", "nodes": ["gpu-w2 (10.0.0.4)"]}}))
    m = build_message(incident, "report_ready", report=report)
    assert m.title.endswith(f"gpu_oom on job {SID} (sft, owner bob)")
    assert (m.job, m.owner, m.node) == (f"{SID} (sft)", "bob", "gpu-w2 (10.0.0.4)")


def test_hostile_names_are_cleaned_once_for_every_channel(store):
    incident = named_incident(store, job_name="@all <!channel> http://evil.example\u202e\n# x", owner="a" * 10_000)
    m = build_message(incident, "opened")
    assert "@all" not in m.title and "http://" not in m.title and "\u202e" not in m.title and "\n" not in m.title
    assert len(m.title) <= 150 and m.owner is not None and len(m.owner) <= 200
