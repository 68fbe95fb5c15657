"""Chaos on the real stack, the parts a test can cause on this machine without a cluster:
- a read that never returns (a FIFO standing where a job's log file is, which blocks in open() as a file on a hung
  NFS mount does) does not stop the loop: the other sources are still read, the stuck one is named in health, later
  ticks do not wait for it again, and what its call reads once it returns is filed, not lost;
- a process SIGKILLed between reading a line and filing its finding reads the line again after its restart;
- Prometheus SIGKILLed and restarted under a real `argus serve`: named unreachable, the rest still detected.
Real components: the kernel-log and job-log collectors on real files, the log rules, the incident desk on SQLite, a
real Prometheus. The database's own chaos (stopped and started, a full disk) is tests/store/test_chaos_database.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.kernel_log import FileSource, KernelLogCollector
from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from core.types import Category
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)\n"
XID = "[Fri Nov 27 07:00:01 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def test_a_read_that_hangs_does_not_stop_the_loop_and_what_it_reads_later_is_filed(tmp_path: Path) -> None:
    jobs_root = tmp_path / "shared" / "jobs"
    (jobs_root / "a-job" / "logs").mkdir(parents=True)
    (jobs_root / "b-job" / "logs").mkdir(parents=True)
    stuck = jobs_root / "a-job" / "logs" / "0-rank.log"
    os.mkfifo(stuck)  # open() for reading blocks until a writer comes: a read that does not return
    driver = jobs_root / "b-job" / "logs" / "driver.log"  # read after the stuck file, in the same call
    driver.write_text("step:1 - loss:0.5\n")
    kern = tmp_path / "kern.log"
    kern.write_text("")
    offsets = OffsetStore(tmp_path / "offsets.json")
    kernel = KernelLogCollector(FileSource(kern, offsets), offsets, node_id="n1", node_ip="10.0.0.7")
    jobs = JobLogsCollector(tmp_path / "shared", OffsetStore(tmp_path / "jobs.json"))
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    pipeline = Pipeline(collectors=[kernel, jobs], detectors=[LogRuleDetector(load_rules())],
                        incidents=IncidentDesk(store), collect_timeout_s=2.0)
    try:
        began = time.monotonic()
        first = pipeline.run_once()
        assert 1.9 <= time.monotonic() - began < 10
        assert first.errors["job_logs"].startswith("stuck: its collect has not returned for 2 s")
        health = {s["name"]: s for s in pipeline.health()["sources"]}
        assert health["job_logs"]["ok"] is False and health["kernel_log"]["ok"] is True
        assert "hung NFS mount" in health["job_logs"]["last_error"]

        with kern.open("a") as f:
            f.write(XID)
        with driver.open("a") as f:
            f.write(OOM)
        began = time.monotonic()
        second = pipeline.run_once()
        assert time.monotonic() - began < 1.9  # the stuck call is not waited for again: that takes 2 s
        assert "job_logs" in second.errors
        assert [i.category for i in second.opened] == [Category.GPU_HARDWARE]  # the other source still works

        def mount_comes_back() -> None:
            with stuck.open("w"):  # the blocked open() returns; the call goes on to the other job's log
                pass

        writer = threading.Thread(target=mount_comes_back)
        writer.start()
        writer.join(timeout=10)
        deadline = time.monotonic() + 10
        third = pipeline.run_once()
        while "job_logs" in third.errors and time.monotonic() < deadline:
            time.sleep(0.2)
            third = pipeline.run_once()
        assert "job_logs" not in third.errors
        assert [i.category for i in third.opened] == [Category.GPU_OOM]  # read by the late call, filed, not lost
        assert {s["name"]: s["ok"] for s in pipeline.health()["sources"]} == {"kernel_log": True, "job_logs": True}
    finally:
        store.close()


KILLED_MID_TICK = """
import os, signal, sys
sys.path[:0] = [{root!r}, {stage!r}]
from argus.incidents.desk import IncidentDesk
from argus.pipeline import Pipeline
from argus.store.store import Store
from collectors.logs import JobLogsCollector
from collectors.offsets import OffsetStore
from detectors.engine import load_rules
from detectors.log_rules import LogRuleDetector

class DiesWhenItSeesTheLine(LogRuleDetector):
    # the process is SIGKILLed after its collectors read the line and before its finding is filed
    def detect(self, signals):
        if any("OutOfMemoryError" in (s.text or "") for s in signals):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().detect(signals)

pipeline = Pipeline(collectors=[JobLogsCollector({shared!r}, OffsetStore({offsets!r}))],
                    detectors=[DiesWhenItSeesTheLine(load_rules())], incidents=IncidentDesk(Store({db!r})))
pipeline.run_once()
print("tick done", flush=True)
"""


def test_a_process_killed_between_reading_a_line_and_filing_it_reads_it_again(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    logs = tmp_path / "shared" / "jobs" / "train-1" / "logs"
    logs.mkdir(parents=True)
    (logs / "driver.log").write_text("step:1 - loss:0.5\n" + OOM)
    db, offsets = f"sqlite:///{tmp_path / 'argus.db'}", tmp_path / "offsets.json"
    script = tmp_path / "tick.py"
    script.write_text(KILLED_MID_TICK.format(root=str(root), stage=str(root / "stage"), shared=str(tmp_path / "shared"),
                                             offsets=str(offsets), db=db))
    died = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert died.returncode == -9 and "tick done" not in died.stdout, died.stderr[-2000:]
    store = Store(db)
    try:
        assert store.list_incidents() == []  # killed before filing
        restarted = Pipeline(collectors=[JobLogsCollector(tmp_path / "shared", OffsetStore(offsets))],
                             detectors=[LogRuleDetector(load_rules())], incidents=IncidentDesk(store))
        tick = restarted.run_once()
        assert [i.category for i in tick.opened] == [Category.GPU_OOM]  # the line was read again, not skipped
        assert restarted.run_once().opened == []  # and committed once filed: not read a third time
    finally:
        store.close()


@pytest.mark.prometheus
def test_prometheus_killed_and_restarted_under_argus_serve(tmp_path: Path) -> None:
    import signal
    import subprocess

    import httpx

    from stage.localstack.argus_cli import ARGUS, argus_env, create_token
    from stage.localstack.ports import free_port
    from stage.localstack.prometheus import Prometheus
    from tests.helpers import wait_until

    prometheus = Prometheus(tmp_path / "prometheus").start()
    logs = tmp_path / "shared" / "jobs" / "train-1" / "logs"
    logs.mkdir(parents=True)
    driver = logs / "driver.log"
    driver.write_text("step:1 - loss:0.5\n")
    env = argus_env({"ARGUS_DATA_DIR": str(tmp_path / "data"), "ARGUS_SHARED_ROOT": str(tmp_path / "shared"),
                     "ARGUS_PROMETHEUS_URL": prometheus.url, "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9",
                     "ARGUS_POLL_INTERVAL_S": "0.5", "ARGUS_REQUEST_TIMEOUT_S": "1"})
    auth = {"authorization": f"Bearer {create_token(env, 'chaos', 'viewer')}"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def prometheus_ok() -> bool | None:
        try:
            sources = {s["name"]: s["ok"] for s in httpx.get(f"{url}/v1/health", timeout=2).json()["sources"]}
        except httpx.HTTPError:
            return None
        return sources.get("prometheus")

    try:
        wait_until("Argus to read Prometheus", lambda: prometheus_ok() is True, timeout=60, interval=0.3)
        assert prometheus.process is not None
        os.kill(prometheus.process.pid, signal.SIGKILL)
        wait_until("Argus to say Prometheus is down", lambda: prometheus_ok() is False, timeout=30, interval=0.3)
        assert "prometheus" in httpx.get(f"{url}/v1/health", timeout=5).json()["unreachable"]
        with driver.open("a") as f:  # what Argus can still see, it still detects
            f.write(OOM)

        def opened() -> list[Any] | None:
            items = httpx.get(f"{url}/v1/incidents", headers=auth, timeout=5).json()["items"]
            return items or None

        [incident] = wait_until("the OOM's incident while Prometheus is down", opened, timeout=30, interval=0.3)
        assert incident["category"] == "gpu_oom"
        prometheus.start()  # same port, same data
        wait_until("Argus to read Prometheus again", lambda: prometheus_ok() is True, timeout=60, interval=0.3)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        prometheus.stop()
    assert proc.returncode == 0


def test_an_alert_storm_is_all_accepted_one_incident_a_fingerprint_with_few_im_messages() -> None:
    """bench/storm.py at a small scale, for its outcomes (timings are the benchmark's business): a real argus serve
    with a Slack channel and a webhook, 1,200 alerts over 300 fingerprints while readers use the API."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "bench" / "storm.py"), "--alerts", "1200", "--fingerprints",
                           "300", "--seconds", "8", "--drain-s", "16", "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["accepted"] == result["sent"] == 1200 and result["refused"] == {}
    assert result["incidents"] == 300 and result["one_per_fingerprint"]  # all filed once the storm's queue drained
    assert result["webhook_posts_total"] == 300  # the ops agent hears of each incident once
    assert 1 <= result["im_messages_total"] <= 20  # people get a few digests, not 300 messages
    assert result["api_read_errors"] == 0 and result["api_reads"] > 0


def test_alerts_accepted_before_a_sigkill_are_filed_after_the_restart(tmp_path: Path) -> None:
    """A real `argus serve` takes a burst of Alertmanager webhooks (accepted: queued in its store), is SIGKILLed before
    its filer got through them, and files every one after it starts again: one incident per alert name."""
    import signal
    import subprocess

    import httpx

    from stage.localstack.argus_cli import ARGUS, argus_env, create_token
    from stage.localstack.ports import free_port
    from tests.helpers import wait_until

    env = argus_env({"ARGUS_DATA_DIR": str(tmp_path / "data"), "ARGUS_SHARED_ROOT": str(tmp_path / "shared"),
                     "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_REQUEST_TIMEOUT_S": "1"})
    operator = {"authorization": f"Bearer {create_token(env, 'am', 'operator')}"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def serve() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_until("argus serve to answer", lambda: _answers(url), timeout=60, interval=0.2)
        return proc

    def body(n: int) -> dict[str, Any]:
        return {"version": "4", "status": "firing", "groupKey": f"burst/{n}", "alerts": [
            {"status": "firing", "startsAt": "2026-11-28T09:00:00Z",
             "labels": {"alertname": f"Burst{n:03d}x{i:02d}", "category": "disk_full", "node_ip": f"10.0.{n}.{i}"}}
            for i in range(20)]}

    proc = serve()
    try:
        from concurrent.futures import ThreadPoolExecutor

        with httpx.Client(headers=operator, timeout=30) as client, ThreadPoolExecutor(10) as pool:  # a burst at once
            answers = list(pool.map(lambda n: client.post(f"{url}/v1/alerts/alertmanager", json=body(n)).status_code,
                                    range(10)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert set(answers) <= {200, 202} and 202 in answers, answers  # accepted; most still queued
        store = Store(f"sqlite:///{tmp_path / 'data' / 'argus.db'}")
        try:
            left = store.alert_inbox.depth()
        finally:
            store.close()
        assert left > 0  # the kill came before the filer was through: these were accepted, not filed

        proc = serve()
        viewer = {"authorization": f"Bearer {create_token(env, 'reader', 'viewer')}"}

        def all_filed() -> int | None:
            items = httpx.get(f"{url}/v1/incidents", params={"limit": 1000}, headers=viewer, timeout=10).json()
            return len(items["items"]) if len(items["items"]) == 200 else None

        wait_until("every accepted alert filed after the restart", all_filed, timeout=300, interval=1)
        assert httpx.get(f"{url}/v1/health", timeout=10).json()["alert_inbox"]["queued"] == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
