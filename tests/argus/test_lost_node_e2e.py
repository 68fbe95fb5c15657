"""A lost node carried end to end on a real Ray cluster: kill a worker's raylet, see one incident,
a webhook delivery, and the incident through the CLI and the API."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.incidents.bus import EventBus
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.incidents.subscribers import NotifierSubscriber
from argus.notify.webhook import WebhookNotifier
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.ray_state import RayStateCollector
from core.types import Category, IncidentState
from detectors.lost_node import LostNodeDetector
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray]

JOB = """
import time, ray
ray.init()

@ray.remote(num_cpus=0, resources={"worker1": 0.1})
class Rank:
    def step(self, i):
        time.sleep(0.2)
        return i

rank = Rank.remote()
for i in range(100000):
    print(f"step {i}", flush=True)
    ray.get(rank.step.remote(i))
"""


def rank_alive(dashboard_url: str) -> bool:
    from ray.util.state import list_actors

    filters = [("class_name", "=", "Rank"), ("state", "=", "ALIVE")]
    return bool(list_actors(address=dashboard_url, filters=filters, raise_on_missing_output=False))


def make_pipeline(cluster, store, receiver_url):
    bus = EventBus().start([NotifierSubscriber(WebhookNotifier(receiver_url))])
    return Pipeline(
        collectors=[RayStateCollector(cluster.dashboard_url, timeout_s=10)],
        detectors=[LostNodeDetector()],
        incidents=IncidentDesk(store, events=bus, correlator=Correlator(store)),
    )


def test_killed_worker_becomes_one_incident_everywhere(ray_cluster, ray_faults, webhook_receiver, tmp_path: Path):
    from ray.job_submission import JobSubmissionClient

    script = tmp_path / "job.py"
    script.write_text(JOB)
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    submission_id = client.submit_job(entrypoint=f"{sys.executable} {script}", entrypoint_resources={"worker2": 0.1})
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    pipeline = make_pipeline(ray_cluster, store, webhook_receiver.url)
    worker = ray_cluster.worker(1)
    try:
        wait_until("the job's rank to run on worker 1", lambda: rank_alive(ray_cluster.dashboard_url),
                   interval=0.2)
        pipeline.run_once()  # Argus sees the node ALIVE with the job on it
        killed_at = ray_faults.kill_worker(1)

        def opened():
            return pipeline.run_once().opened

        [incident] = wait_until("a node_lost incident", opened, timeout=90, interval=0.3)
        assert incident.category is Category.NODE_LOST and incident.subject.id == worker.node_id
        assert incident.first_seen.timestamp() >= killed_at - 1
        [finding] = store.findings_for(incident.id)
        assert finding.attrs["node_ip"] == worker.ip
        assert "heartbeat" in finding.attrs["death_reason"] or "health check" in finding.attrs["death_reason"]
        assert submission_id in [j.get("submission_id") for j in finding.attrs["jobs"]]
        assert submission_id in incident.summary

        # The same verdict again, and from a restarted Argus, is the same incident.
        pipeline.run_once()
        restarted = make_pipeline(ray_cluster, store, webhook_receiver.url)
        assert restarted.run_once().opened == []
        # (nodes other tests of this session ended may have their own incidents: count this node's)
        assert len(store.list_incidents(category=Category.NODE_LOST, subject_id=worker.node_id)) == 1
        assert store.get_incident(incident.id).occurrences == 2

        delivery = webhook_receiver.wait_for(lambda r: True, timeout=10)
        assert delivery["body"]["event"] == "incident.opened"
        assert delivery["body"]["incident"]["id"] == incident.id
        time.sleep(0.5)
        assert len(webhook_receiver.received) == 1

        _, token = store.create_token("e2e-viewer", "viewer", created_by="tests")
        api = TestClient(create_app(store=store, health_provider=pipeline.health),
                         headers={"Authorization": f"Bearer {token}"})
        assert [i["id"] for i in api.get("/v1/incidents").json()["items"]] == [incident.id]
        assert api.get("/v1/health").json()["status"] == "ok"

        env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
        env["ARGUS_DATA_DIR"] = str(tmp_path)
        listed = subprocess.run([sys.executable, "-m", "argus.cli", "incidents", "list", "--json"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert [json.loads(x)["id"] for x in listed.stdout.splitlines()] == [incident.id], listed.stderr
        shown = subprocess.run([sys.executable, "-m", "argus.cli", "incidents", "show", incident.id],
                               capture_output=True, text=True, env=env, timeout=120)
        assert worker.ip in shown.stdout and submission_id in shown.stdout

        # The host comes back: Ray names it anew on the same IP; the incident closes and the webhook is told.
        rejoined = ray_faults.restart_worker(1)
        assert rejoined.node_id != worker.node_id and rejoined.ip == worker.ip

        def closed():
            return [i for i in pipeline.run_once().resolved if i.id == incident.id]

        wait_until("the lost node's incident to close", closed, timeout=90, interval=0.5)
        assert store.get_incident(incident.id).state is IncidentState.RESOLVED
        told = webhook_receiver.wait_for(lambda r: r["body"]["event"] == "incident.resolved", timeout=30)
        assert told["body"]["incident"]["id"] == incident.id
    finally:
        store.close()
        try:
            client.stop_job(submission_id)
        except Exception:
            pass  # the job may already have failed with its rank's node
