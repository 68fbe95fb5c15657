"""Names people use, end to end on a real Ray cluster: a job submitted with JobSpec metadata (name, owner) dies of a
CUDA OOM; the incident, its report and the webhook delivery name it by its submission id, name and owner, never by
its entrypoint command, and the report's Impact lists the node its GPU was on.

Real: the session Ray cluster (head + 2 workers on loopback advertising 4 GPUs each), the job through the Jobs API
with metadata, its rank holding 1 GPU on worker 1 through Ray, Ray's job state and placement read by
RayStateCollector and GpuPlacementCollector, the JobFailureDetector with the shipped rules, the incident desk, the
report service and the webhook subscriber as argus.wiring builds them, and a real HTTP receiver.
Simulated: the OOM itself (stage/localstack/jobs/cuda_oom.py raises PyTorch's exception: there is no GPU here).
"""

from __future__ import annotations

import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from argus.incidents.bus import EventBus
from argus.wiring import build_incidents, build_pipeline, build_reports, open_store
from collectors.placement import GpuPlacementCollector
from collectors.ray_state import RayStateCollector
from core.names import label_of, placement_of
from core.settings import load_settings
from core.types import Category
from detectors.engine import load_rules
from detectors.job_failure import JobFailureDetector
from stage.localstack.jobs import JOBS_DIR
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

SCRIPT = JOBS_DIR / "cuda_oom.py"


def test_a_failed_job_is_named_by_submission_id_name_and_owner_everywhere(ray_cluster, webhook_receiver,
                                                                          tmp_path: Path):
    from ray.job_submission import JobSubmissionClient

    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "shared",
                             ray_dashboard_url=ray_cluster.dashboard_url, webhook_urls=[webhook_receiver.url])
    store = open_store(settings)
    bus = EventBus()
    reports = build_reports(settings, store, events=bus)
    reports.start()
    desk = build_incidents(settings, store, events=bus, reports=reports)
    url = ray_cluster.dashboard_url
    pipeline = build_pipeline(settings, desk, collectors=[RayStateCollector(url), GpuPlacementCollector(url)],
                              detectors=[JobFailureDetector(load_rules(settings.rules_dirs))])

    sid = f"pretrain-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:4]}"
    entrypoint = f"{sys.executable} {SCRIPT} --node worker1 --steps 30"
    client = JobSubmissionClient(url)
    client.submit_job(entrypoint=entrypoint, submission_id=sid,
                      metadata={"name": "pretrain", "owner": "alice", "workload": "sft"})
    worker = ray_cluster.worker(1)
    try:
        def opened():
            return [i for i in pipeline.run_once().opened if i.subject.id == sid]

        [incident] = wait_until(f"an incident for job {sid}", opened, timeout=120, interval=0.3)
        assert incident.category is Category.GPU_OOM
        assert incident.subject.name == "pretrain" and incident.attrs["owner"] == "alice"
        assert label_of(incident) == f"job {sid} (pretrain, owner alice)"
        assert sid in incident.summary and str(SCRIPT) not in incident.summary
        assert incident.attrs["entrypoint"] == entrypoint  # kept as a detail
        # the rank's GPU, seen while the job ran, though the job had released it when its failure was filed
        assert [(p.node_ip, p.gpus) for p in placement_of(incident.attrs)] == [(worker.ip, 1.0)]

        [report] = wait_until("the incident's report", lambda: store.reports_for(incident.id), timeout=60)
        md = report.markdown
        title = md.splitlines()[0]
        impact = md.split("## Impact", 1)[1].split("\n## ", 1)[0]
        assert title == f"# gpu_oom on job {sid} (pretrain, owner alice) ({incident.id})"
        assert f"- Job: `{sid}` (pretrain, owner alice)" in impact
        assert f"`{worker.ip}` (1 GPU)" in impact and "- GPUs: 1" in impact
        assert str(SCRIPT) not in title + impact

        told = webhook_receiver.wait_for(lambda r: r["body"].get("event") == "incident.opened"
                                         and r["body"]["incident"]["id"] == incident.id, timeout=30)
        about = told["body"]["about"]
        assert about["label"] == f"job {sid} (pretrain, owner alice)"
        assert about["job"] == f"{sid} (pretrain, owner alice)" and about["owner"] == "alice"
        assert about["entrypoint"] == entrypoint
        assert told["body"]["incident"]["subject"]["name"] == "pretrain"
    finally:
        reports.stop()
        bus.close()
        store.close()
        try:
            client.stop_job(sid)
        except Exception:
            pass  # it failed already
