"""Incidents that close when their fault ends, on the real local stack: a FAILED job resubmitted by Argus's own
resubmit_job step whose new job reaches RUNNING on the real Ray cluster, and a metric rule that fires and
clears on the real Prometheus scraping the dcgm-exporter simulator. Each resolve reaches a real webhook
receiver, and the event carries the detector's reason."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.events import EventKind
from argus.incidents.subscribers import NotifierSubscriber
from argus.notify.webhook import WebhookNotifier
from argus.pipeline import Pipeline
from collectors.metric_rules import MetricRuleCollector
from collectors.prometheus import PrometheusClient
from collectors.ray_state import RayStateCollector
from control.jobs import JobController
from control.jobspec import JobSpec
from control.local import LocalRunner
from core.types import Category, IncidentState
from detectors.engine import load_rules
from detectors.job_failure import JobFailureDetector
from detectors.metric_rules import MetricRuleDetector, MetricRuleSet
from remediation.actions import Context, resubmit_job
from stage.sim.dcgm_exporter import DcgmExporterSim
from tests.helpers import wait_until
from tests.support import RecordingSubscriber

# Fails with a CUDA OOM on its first run; its resubmission (`<id>-r1`, from scratch: it had no checkpoint) runs on.
FAILS_THEN_RUNS = textwrap.dedent("""\
    import os, sys, time
    if not os.environ.get("ARGUS_SUBMISSION_ID", "").endswith("-r1"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    print("resumed", flush=True)
    time.sleep(300)
""")


def desk_for(store, *subscribers) -> IncidentDesk:
    return IncidentDesk(store, events=EventBus().start(list(subscribers)), correlator=Correlator(store))


@pytest.mark.ray
def test_a_failed_jobs_incident_closes_when_argus_resubmission_of_it_runs(ray_cluster, webhook_receiver, store,
                                                                         tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "code").mkdir(parents=True)
    (shared / "code" / "train.py").write_text(FAILS_THEN_RUNS)
    jobs = JobController(ray_cluster.dashboard_url, shared, code_roots=[shared])
    recorder = RecordingSubscriber()
    desk = desk_for(store, recorder, NotifierSubscriber(WebhookNotifier(webhook_receiver.url)))
    pipeline = Pipeline(collectors=[RayStateCollector(ray_cluster.dashboard_url, timeout_s=10)],
                        detectors=[JobFailureDetector(load_rules())], incidents=desk)
    ctx = Context(jobs=jobs, registry=store.nodes(), nodes=None, dashboard_url=ray_cluster.dashboard_url,
                  gcs_address=ray_cluster.gcs_address, local=LocalRunner(), store=store)
    spec = JobSpec(name="oomer", workload="sft", entrypoint=f"{sys.executable} train.py", owner="alice",
                   code_path=str(shared / "code"), working_dir=str(shared / "code"))
    sid = jobs.submit(spec).submission_id
    try:
        def mine():
            return [i for i in pipeline.run_once().opened if i.subject.id == sid]

        [incident] = wait_until(f"an incident for the failed job {sid}", mine, timeout=120, interval=0.5)
        assert incident.category is Category.GPU_OOM and jobs.get(sid).status == "FAILED"
        # a few more polls: the job stays FAILED and nobody resubmitted it, so the incident stays open
        assert [pipeline.run_once().resolved for _ in range(3)] == [[], [], []]

        # it failed before any checkpoint: a run from scratch, which the step does only when told to
        assert resubmit_job(ctx, incident, {}, dry_run=True).data["jobs"][0]["state"] == "skipped"
        outcome = resubmit_job(ctx, incident, {"from_scratch": True}, dry_run=False)
        [resubmitted] = outcome.data["jobs"]
        assert resubmitted["resumes"] is False and "from scratch" in resubmitted["resume"]
        assert resubmitted["state"] == "submitted" and resubmitted["new"] == f"{sid}-r1", outcome.message

        def closed():
            return [i for i in pipeline.run_once().resolved if i.id == incident.id]

        wait_until("the failed job's incident to close", closed, timeout=120, interval=0.5)
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED
        assert jobs.get(f"{sid}-r1").status == "RUNNING"
        metadata = jobs.client.get_job_info(f"{sid}-r1").metadata
        assert (metadata["argus_resubmit_of"], metadata["argus_resubmit_root"]) == (sid, sid)  # Ray kept the link

        assert desk.events.drain(10)
        resolved = [e for e in recorder.events if e.kind is EventKind.RESOLVED and e.incident.id == incident.id]
        assert [e.detail for e in resolved] == [
            {"by": "argus:job_failure", "reason": f"job {sid} was resubmitted as {sid}-r1, which reached RUNNING"}]
        told = webhook_receiver.wait_for(lambda r: r["body"]["event"] == "incident.resolved", timeout=30)
        assert told["body"]["incident"]["id"] == incident.id
    finally:
        desk.events.close()
        for record in jobs.list():
            if not record.ended:
                jobs.stop(record.submission_id, reason="test teardown")


HOT_RULE = """\
rules:
  - reason: {reason}
    category: gpu_hardware
    severity: warning
    for: 3s
    expr: DCGM_FI_DEV_GPU_TEMP{{Hostname="{host}"}} >= 90
    summary: 'GPU {{{{ $labels.gpu }}}} on {{{{ $labels.Hostname }}}} at {{{{ $value }}}} C'
"""


@pytest.mark.prometheus
def test_a_metric_rule_incident_opens_and_closes_on_real_prometheus(prometheus_stack, webhook_receiver, store,
                                                                   tmp_path: Path) -> None:
    sim = DcgmExporterSim(f"hot-{uuid.uuid4().hex[:8]}", gpus=2).start()
    target = f"dcgm-{sim.hostname}"
    prometheus_stack.prometheus.set_targets(target, [f"{sim.host}:{sim.port}"])
    reason = f"HotGpu{uuid.uuid4().hex[:6]}"
    (tmp_path / "hot.yaml").write_text(HOT_RULE.format(reason=reason, host=sim.hostname))
    rules = MetricRuleSet.load([tmp_path / "hot.yaml"])
    recorder = RecordingSubscriber()
    desk = desk_for(store, recorder, NotifierSubscriber(WebhookNotifier(webhook_receiver.url)))
    client = PrometheusClient(prometheus_stack.prometheus.url, timeout_s=10)
    pipeline = Pipeline(collectors=[MetricRuleCollector(client, rules)], detectors=[MetricRuleDetector(rules)],
                        incidents=desk)
    try:
        sim.set_gpu(1, temp_c=95)

        def opened():
            return pipeline.run_once().opened

        [incident] = wait_until("the hot GPU's incident", opened, timeout=60, interval=1.0)
        assert incident.reason == reason and incident.summary == f"GPU 1 on {sim.hostname} at 95 C"
        assert incident.subject.name == f"{sim.hostname}/gpu1"

        sim.set_gpu(1, temp_c=45)

        def closed():
            return [i for i in pipeline.run_once().resolved if i.id == incident.id]

        wait_until("the hot GPU's incident to close", closed, timeout=60, interval=1.0)
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED
        assert desk.events.drain(10)
        [event] = [e for e in recorder.events if e.kind is EventKind.RESOLVED]
        assert event.detail["by"] == "argus:metric_rules"
        assert event.detail["reason"].startswith(f"metric rule {reason} no longer holds for {sim.hostname}/gpu1: ")
        assert event.detail["reason"].endswith("(for: 3s)")
        told = webhook_receiver.wait_for(lambda r: r["body"]["event"] == "incident.resolved", timeout=30)
        assert told["body"]["incident"]["id"] == incident.id
    finally:
        desk.events.close()
        prometheus_stack.prometheus.set_targets(target, [])
        sim.stop()
