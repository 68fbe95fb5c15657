"""argus.naming through the real loop: a finding made from a log line knows only the job's submission id; the loop
adds the JobSpec name, owner, entrypoint and where the job's GPUs were from Ray's job state and the placement it
collected, so the incident is named like one made from Ray's state. The fingerprint never changes."""

from __future__ import annotations

from datetime import datetime, timezone

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.naming import Directory
from argus.pipeline import Pipeline
from core.names import label_of, placement_of
from core.types import Category, Finding, Signal, SignalKind, Subject, SubjectKind, fingerprint_of
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector

NOW = datetime.now(timezone.utc)
SID = "pretrain-20261122T084034Z-eff5"
NODE_ID = "c" * 56
ENTRY = "cd /mnt/shared/common/code/demo && python train.py --steps 100000"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"


def job_state(status: str = "RUNNING", metadata: object = None) -> Signal:
    """What collectors/ray_state.py emits for a job (its subject named by the JobSpec name)."""
    metadata = {"name": "pretrain", "owner": "alice", "workload": "sft", "argus": "1"} if metadata is None else metadata
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", observed_at=NOW,
                  subject=Subject(kind=SubjectKind.JOB, id=SID, name=name),
                  attrs={"job_id": "02000000", "submission_id": SID, "status": status, "entrypoint": ENTRY,
                         "job_name": name, "owner": metadata.get("owner") if isinstance(metadata, dict) else None,
                         "metadata": metadata})


def node_state() -> Signal:
    return Signal(kind=SignalKind.NODE_STATE, source="ray.state", observed_at=NOW,
                  subject=Subject(kind=SubjectKind.NODE, id=NODE_ID, name="10.0.0.3"),
                  attrs={"state": "ALIVE", "node_ip": "10.0.0.3", "node_name": "gpu-w1", "jobs": []})


def job_gpus(gpus: float = 2.0) -> Signal:
    """What collectors/placement.py emits for a job holding GPUs."""
    return Signal(kind=SignalKind.METRIC, source="ray.placement", observed_at=NOW, value=gpus,
                  subject=Subject(kind=SubjectKind.JOB, id=SID, name="pretrain"),
                  attrs={"metric": "argus_job_gpus", "job_id": "02000000", "submission_id": SID, "owner": "alice",
                         "job_name": "pretrain", "entrypoint": ENTRY, "status": "RUNNING",
                         "nodes": [{"node_id": NODE_ID, "node_ip": "10.0.0.3", "node_name": "gpu-w1", "gpus": gpus,
                                    "node_gpus_total": 4.0, "whole_node": False}] if gpus else []})


def log_line(text: str = OOM) -> Signal:
    """A job log line as the log collectors emit it: the job's submission id, nothing more."""
    return Signal(kind=SignalKind.LOG_LINE, source=f"/mnt/shared/jobs/{SID}/logs/rank0.log", observed_at=NOW,
                  subject=Subject(kind=SubjectKind.JOB, id=SID), text=text, line=7,
                  attrs={"stream": "job-logs", "node_id": NODE_ID})


class Feed:
    name = "feed"

    def __init__(self, *batches: list[Signal]) -> None:
        self.batches = list(batches)

    def collect(self) -> list[Signal]:
        return self.batches.pop(0) if self.batches else []


def test_a_log_line_finding_is_filed_named_and_placed(store):
    # tick 1: the job runs and holds 2 GPUs on gpu-w1; tick 2: its GPUs are released and its log shows the OOM
    feed = Feed([job_state(), node_state(), job_gpus(2.0)], [job_state("FAILED"), job_gpus(0.0), log_line()])
    desk = IncidentDesk(store, events=EventBus().start([]), correlator=Correlator(store))
    pipeline = Pipeline(collectors=[feed], detectors=[LogRuleDetector(load_rules())], incidents=desk)
    try:
        assert pipeline.run_once().opened == []
        [incident] = pipeline.run_once().opened
    finally:
        desk.events.close()
    assert incident.category is Category.GPU_OOM
    assert label_of(incident) == f"job {SID} (pretrain, owner alice)"
    assert incident.subject.name == "pretrain" and incident.attrs["entrypoint"] == ENTRY
    assert incident.attrs["node_name"] == "gpu-w1" and incident.attrs["node_ip"] == "10.0.0.3"
    # where the GPUs were while the job held them, though it held none when the failure was filed
    assert [(p.label, p.gpus) for p in placement_of(incident.attrs)] == [("gpu-w1 (10.0.0.3)", 2.0)]
    assert incident.fingerprint == fingerprint_of(Category.GPU_OOM, Subject(kind=SubjectKind.JOB, id=SID))
    assert store.get_incident(incident.id).attrs["job_name"] == "pretrain"  # stored, so a restart keeps it


def test_what_a_detector_said_is_kept_and_unknown_jobs_are_left_alone():
    names = Directory()
    names.learn([job_state(), node_state()])
    own = Finding(category=Category.GPU_OOM, reason="X", summary="s", fingerprint="fp",
                  subject=Subject(kind=SubjectKind.JOB, id=SID, name="given"),
                  attrs={"owner": "bob", "submission_id": SID})
    named = names.name(own)
    assert named.subject.name == "given" and named.attrs["owner"] == "bob" and named.attrs["job_name"] == "pretrain"
    assert named.fingerprint == "fp"
    stranger = Finding(category=Category.GPU_OOM, reason="X", summary="s",
                       subject=Subject(kind=SubjectKind.JOB, id="raysubmit_other"))
    assert names.name(stranger) is stranger


def test_a_node_known_only_by_its_ray_id_gets_its_ip_and_name():
    names = Directory()
    names.learn([node_state()])
    gcs = Finding(category=Category.NODE_LOST, reason="GcsNodeDead", summary="s",
                  subject=Subject(kind=SubjectKind.NODE, id=NODE_ID))
    named = names.name(gcs)
    assert named.subject.name == "10.0.0.3" and label_of(named) == "node gpu-w1 (10.0.0.3)"
    assert named.fingerprint == gcs.fingerprint


def test_hostile_metadata_and_memory_are_bounded():
    names = Directory(max_jobs=3)
    names.learn([job_state(metadata={"name": "x\n" * 100_000, "owner": ["not", "a", "string"]})])
    facts = names.job(SID)
    assert facts is not None and len(facts.name or "") <= 64 and "\n" not in (facts.name or "")
    assert facts.owner is None
    names.learn([job_state(metadata="not a dict")])
    for i in range(10):
        names.learn([Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", observed_at=NOW,
                            subject=Subject(kind=SubjectKind.JOB, id=f"job-{i}"), attrs={"owner": "o"})])
    assert names.job(SID) is None and names.job("job-9") is not None
