"""Soak: Argus on a real local cluster with history, for N minutes, with faults of all six demo classes caused at
random times and then ended. A figure, not a test: it prints what a team would judge Argus by on its first day.

    .venv/bin/python bench/soak.py --minutes 30 [--seed 7] [--json]

What it runs: a Ray head and two workers on loopback (4 advertised GPUs each), a DCGM exporter simulator per
worker, Prometheus, a webhook sink standing in for an IM group and for the ops agent's webhook, and Argus itself
as `argus serve` in its own process (so its memory is its own), remediation in auto mode with
bench/soak_policy.yaml. Before Argus starts, the cluster gets history: a job folder whose log holds a CUDA OOM two
days old, and a Ray job that printed an (old) OOM line and then SUCCEEDED. A resumable training job runs
throughout. Then, until the time is up, one fault at a time after a random pause: a hung rank (SIGSTOP, ended by
SIGCONT), a CUDA OOM (simulated; ended by a person who fixes it and resubmits through Argus's API), Xid 79
(simulated by DCGM, then cleared), idle GPUs (held until released), a host OOM (Ray's OOM killer, a lowered
threshold on worker 2; ended by restoring it and resubmitting), a lost node (the training job's worker killed,
then started again).

What it prints, per fault and in all: faults caused, detected (an incident about the fault's job, node or GPU
opened after it was caused), right category, false incidents (about nothing the soak caused), incidents still
open after their fault ended (given `--settle` seconds), duplicate incidents (more than one not-merged incident
for one fault), IM messages per fault, and Argus's RSS after start-up and at the end. Its last line is the JSON
summary.

One module on purpose: the stack, the faults and the scoring share one timeline and one teardown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from core.logging import setup_logging  # noqa: E402
from core.refs import refs_of  # noqa: E402
from core.types import REOPENED_AT, Category, Incident, IncidentState  # noqa: E402
from detectors.timestamps import parse_iso  # noqa: E402
from stage.demo.inject import DemoContext, hung_rank, idle_gpus, xid  # noqa: E402
from stage.localstack.process import poll_until  # noqa: E402
from stage.localstack.trainer import RESUMABLE_TRAINER  # noqa: E402

POLICY = Path(__file__).resolve().parent / "soak_policy.yaml"
GPUS_PER_WORKER = 4
DETECT_TIMEOUT_S = 120.0  # a fault with no incident by then is missed
HOLD_S = 15.0  # how long a detected fault goes on before the soak ends it
ARGUS_SETTINGS: dict[str, Any] = {  # as the demo: a 1 s loop, a 20 s stall floor, a 30 s idle window
    "poll_interval_s": 1.0,
    "stall_min_s": 20.0,
    "idle_gpu_window_s": 30.0,
    "remediation_interval_s": 1.0,
    "log_level": "INFO",
}
# Where the resumable training job's driver runs: worker 1 (the stage's custom resource), never worker 2, whose planned
# restart for the host OOM drains it and would wait on the driver. Its resubmissions keep the pin (the JobSpec's).
TRAIN_DRIVER_RESOURCES = {"worker1": 0.001}
OLD_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 18.00 MiB is free.")


class FaultSkipped(Exception):
    """The fault cannot be caused cleanly right now (and nothing was touched): the soak goes on to the next one."""


@dataclass
class Fault:
    """One fault caused by the soak: what it touched (to tell which incidents are about it) and when."""

    kind: str
    expect: Category
    at: float
    sids: set[str] = field(default_factory=set)  # jobs it hit (their resubmissions are matched by prefix)
    node_ips: set[str] = field(default_factory=set)
    gpu_uuids: set[str] = field(default_factory=set)
    note: str = ""
    ended_at: float | None = None  # when the soak ended the fault
    end: Callable[[], None] | None = None
    detected_at: float | None = None
    incidents: dict[str, Incident] = field(default_factory=dict)
    error: str | None = None

    def about(self, incident: Incident) -> bool:
        refs = refs_of(incident)
        if any(s.startswith(own) for s in refs.submission_ids for own in self.sids):
            return True
        if self.gpu_uuids & {incident.subject.id, incident.subject.name or ""}:
            return True
        return bool(self.node_ips & {refs.node_ip or "", incident.subject.name or ""})


class Soak:
    def __init__(self, work: Path, console: Console, rng: random.Random) -> None:
        self.work, self.console, self.rng = work, console, rng
        self.shared = work / "shared"
        self.faults: list[Fault] = []
        self.train_sid = ""

    # -- the stack --------------------------------------------------------------------------------------------

    def start(self) -> None:
        from stage.localstack.process import REGISTRY, ManagedProcess
        from stage.localstack.prometheus import Prometheus
        from stage.localstack.ray_cluster import RayCluster
        from stage.localstack.webhook_receiver import WebhookReceiver
        from stage.sim.dcgm_exporter import DcgmExporterSim

        with self.console.status("starting a Ray head and two workers"):
            profiling = {"RAY_DASHBOARD_ENABLE_PROFILING": "1"}
            self.cluster = RayCluster(self.work / "ray", fast_health_check=True, worker_gpus=GPUS_PER_WORKER,
                                      head_env=profiling, worker_env=profiling)
            REGISTRY.add(self.cluster)
            self.cluster.start(timeout=180)
        with self.console.status("starting DCGM simulators, Prometheus and the webhook sink"):
            self.receiver = WebhookReceiver().start()
            REGISTRY.add(self.receiver)
            self.sims = []
            for node in self.cluster.workers:
                sim = DcgmExporterSim(f"gpu-node-{node.index}", gpus=GPUS_PER_WORKER, host=node.ip, port=0)
                sim.start()
                REGISTRY.add(sim)
                self.sims.append(sim)
            prometheus = Prometheus(self.work / "prometheus", ray_sd_file=self.cluster.sd_file,
                                    static_targets={"dcgm": [f"{s.host}:{s.port}" for s in self.sims]})
            prometheus.start()
            REGISTRY.add(prometheus)
        with self.console.status("writing the cluster's history"):
            self._history()
        from stage.localstack.ports import free_port

        port = free_port()
        self.argus_url = f"http://127.0.0.1:{port}"
        config = {
            "data_dir": str(self.work / "argus"), "shared_root": str(self.shared), "api_port": port,
            "ray_dashboard_url": self.cluster.dashboard_url, "ray_gcs_address": self.cluster.gcs_address,
            "prometheus_url": prometheus.url, "webhook_urls": [self.receiver.url + "/agent"],
            "notify_channels": [{"kind": "webhook", "name": "im", "url": self.receiver.url + "/im"}],
            "remediation_policy": str(POLICY), **ARGUS_SETTINGS,
        }
        config_file = self.work / "argus.yaml"
        config_file.write_text(yaml.safe_dump(config))
        token = self._token(config_file)
        argus_bin = Path(sys.executable).parent / "argus"
        with self.console.status("starting Argus (argus serve)"):
            self.argus = ManagedProcess("argus", [argus_bin, "serve", "-c", config_file],
                                        log_path=self.work / "argus-serve.log")
            REGISTRY.add(self.argus)
            self.argus.start()
            self.argus.wait_ready(self._healthy, 60, f"{self.argus_url}/v1/health to answer")
            self.started_at = time.time()
        api = httpx.Client(base_url=self.argus_url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        self.ctx = DemoContext(cluster=self.cluster, sims=self.sims, api=api, code_dir=self.shared / "code" / "soak")
        self.ctx.prepare_code()
        # The training job's rank stays on worker 1: worker 2's planned restarts (host OOM) would otherwise wait on
        # it, and the lost node always hits the training job.
        trainer = RESUMABLE_TRAINER.replace('resources={"worker": 0.01}', 'resources={"worker1": 0.01}')
        if trainer == RESUMABLE_TRAINER:
            raise RuntimeError("stage/localstack/trainer.py changed: pin the soak's trainer to worker 1 another way")
        (self.ctx.code_dir / "train.py").write_text(trainer)
        self.oom_flag = self.work / "oom-while"

    def _token(self, config_file: Path) -> str:
        from argus.wiring import open_store
        from core.settings import load_settings

        store = open_store(load_settings(config_file))
        try:
            _, token = store.create_token("soak-operator", "operator", created_by="bench/soak.py",
                                          expires_at=datetime.now(timezone.utc) + timedelta(days=1))
        finally:
            store.close()
        return token

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.argus_url}/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _history(self) -> None:
        """What a real cluster has when Argus first starts: old failures that are no news today."""
        old = datetime.now(timezone.utc) - timedelta(days=2)
        log = self.shared / "jobs" / "raysubmit_old0000000001" / "logs" / "train.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"{old:%Y-%m-%d %H:%M:%S},120 INFO step:41 - loss:0.9\n"
                       f"{old:%Y-%m-%d %H:%M:%S},410 ERROR {OLD_OOM}\n")
        os.utime(log, (old.timestamp(), old.timestamp()))
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(self.cluster.dashboard_url)
        code = self.work / "history-job"
        code.mkdir()
        line = f"[{old:%Y-%m-%d %H:%M:%S}] {OLD_OOM} (retrying with a smaller micro-batch)"
        (code / "retry.py").write_text(f"print({line!r})\nprint('step:1 - loss:0.5')\n")
        sid = client.submit_job(entrypoint=f"{sys.executable} retry.py", runtime_env={"working_dir": str(code)})
        poll_until("the history job to succeed", lambda: client.get_job_status(sid) == JobStatus.SUCCEEDED,
                   timeout=120)

    def rss_mib(self) -> float:
        return psutil.Process(self.argus.pid).memory_info().rss / (1 << 20)

    # -- reading Argus ----------------------------------------------------------------------------------------

    def incidents(self) -> list[Incident]:
        items: list[Incident] = []
        offset = 0
        while True:
            page = self.ctx.api.get("/v1/incidents", params={"limit": 200, "offset": offset}).json()["items"]
            # the API adds derived fields (the reopen count) beside the incident's own
            items += [Incident.model_validate({k: v for k, v in i.items() if k in Incident.model_fields}) for i in page]
            if len(page) < 200:
                return items
            offset += 200

    def training_job(self) -> str:
        """The newest run of the training job (it is resubmitted as <sid>-r1, -r2... after a lost node)."""
        jobs = self.ctx.api.get("/v1/jobs").json().get("items", [])
        runs = [j["submission_id"] for j in jobs if j["submission_id"].startswith(self.train_sid)
                and j.get("status") in {"PENDING", "RUNNING"}]
        return max(runs, key=len) if runs else self.train_sid

    def _driver_node(self, sid: str) -> str | None:
        """The Ray node id of a job's driver, as Ray's Jobs API tells it (None when it does not)."""
        answer = httpx.get(f"{self.cluster.dashboard_url}/api/jobs/{sid}", timeout=10)
        return answer.json().get("driver_node_id") if answer.status_code == 200 else None

    def _rank_node(self, sid: str, timeout: float = 0.0) -> str | None:
        """The Ray node id the training job's rank runs on, as its log says (RANK_NODE=...): None while it says
        none, or, given a `timeout`, waited for that long."""

        def where() -> str | None:
            # the whole driver log (through Argus, which reads it from the driver's node): a tail of a job that has
            # run for minutes has long lost its first lines
            answer = self.ctx.api.get(f"/v1/jobs/{sid}/logs", params={"tail": 100_000})
            text = answer.text if answer.status_code == 200 else ""
            return next((line.split("=", 1)[1] for line in text.splitlines() if line.startswith("RANK_NODE=")), None)

        if not timeout:
            return where()
        return poll_until(f"{sid} to say where its rank runs", where, timeout=timeout, interval=1)

    def heal(self, restart: frozenset[int] = frozenset()) -> list[str]:
        """After a fault that went wrong: every worker ALIVE again (a killed one is started again) and the workers in
        `restart` started afresh (one left draining by a planned restart that did not finish is still ALIVE)."""
        healed = []
        for worker in self.cluster.workers:
            node = self.cluster.node_state(worker.node_id)
            if worker.index in restart or node is None or node.get("state") != "ALIVE":
                self.cluster.restart_worker(worker.index, timeout=120)
                healed.append(f"worker {worker.index} restarted")
        return healed

    def stop_fault_jobs(self) -> None:
        """The soak's own clean-up between faults: every job but the training job stops (a person's stop)."""
        keep = self.training_job()
        for sid in self.ctx.running_jobs():
            if sid != keep:
                self.ctx.api.post(f"/v1/jobs/{sid}/stop")
        poll_until("the fault's jobs to stop", lambda: set(self.ctx.running_jobs()) <= {keep}, timeout=90,
                   interval=1)

    def resubmit(self, fault: Fault) -> None:
        """A person fixed the cause of a failed job and asks Argus to resubmit it (API, operator token)."""
        incident = next(iter(fault.incidents.values()), None)
        if incident is None:
            return
        answer = self.ctx.api.post(f"/v1/incidents/{incident.id}/actions",
                                   json={"steps": [{"action": "resubmit_job"}]})
        if answer.status_code != 201:
            fault.error = f"resubmit refused: {answer.status_code} {answer.text[:200]}"

    # -- the faults -------------------------------------------------------------------------------------------

    def cause(self, kind: str) -> Fault:
        return getattr(self, f"_cause_{kind}")()

    def _cause_hung_rank(self) -> Fault:
        injection = hung_rank(self.ctx)
        return Fault("hung_rank", Category.NCCL_HANG, injection.at, sids={injection.submission_id or ""},
                     note=injection.note, end=injection.undo[0])

    def _cause_cuda_oom(self) -> Fault:
        self.oom_flag.touch()
        sid = self.ctx.submit("sft", f"cuda_oom.py --node worker1 --steps 8 --oom-while {self.oom_flag}")
        fault = Fault("cuda_oom", Category.GPU_OOM, time.time(), sids={sid}, note="fails after 8 steps")

        def fix() -> None:  # the person lowers the micro-batch and resubmits
            self.oom_flag.unlink(missing_ok=True)
            self.resubmit(fault)

        fault.end = fix
        return fault

    def _cause_xid(self) -> Fault:
        injection = xid(self.ctx)
        sim = self.sims[0]
        return Fault("xid", Category.GPU_HARDWARE, injection.at, gpu_uuids={injection.gpu_uuid or ""},
                     note=injection.note, end=lambda: sim.set_gpu(3, xid=0, util=0, power_w=70.0))

    def _cause_idle_gpus(self) -> Fault:
        injection = idle_gpus(self.ctx)
        sid = injection.submission_id or ""
        # Argus's policy stops the job itself; if it has not, the owner does: either way the GPUs are released
        return Fault("idle_gpus", Category.IDLE_GPU, injection.at, sids={sid}, note=injection.note,
                     end=lambda: self.ctx.api.post(f"/v1/jobs/{sid}/stop"))

    def _cause_host_oom(self) -> Fault:
        from stage.demo.inject import host_oom

        # Worker 2's planned restart drains it, and a drain waits for the work on it. The training job's driver is
        # pinned to worker 1 (TRAIN_DRIVER_RESOURCES) and its rank goes where the driver is (Ray prefers the local
        # node); should either be on worker 2 all the same, it would hold the drain forever. Not this round then.
        sid, worker2 = self.training_job(), self.cluster.worker(2).node_id
        if self._driver_node(sid) == worker2:
            raise FaultSkipped("the training job's driver runs on worker 2, which the host OOM restarts")
        if self._rank_node(sid) == worker2:
            raise FaultSkipped("the training job's rank runs on worker 2, which the host OOM restarts")

        injection = host_oom(self.ctx)  # restarts worker 2 with a low threshold (a planned, drained restart)
        fault = Fault("host_oom", Category.HOST_OOM, injection.at, sids={injection.submission_id or ""},
                      note=injection.note)

        def fix() -> None:
            for undo in injection.undo:  # worker 2 back to Ray's default threshold
                undo()
            self.resubmit(fault)

        fault.end = fix
        return fault

    def _cause_node_lost(self) -> Fault:
        sid = self.training_job()
        node = self._rank_node(sid, timeout=180)
        [worker] = [w for w in self.cluster.workers if w.node_id == node]
        at = self.cluster.kill_worker(worker.index)
        index = worker.index
        return Fault("node_lost", Category.NODE_LOST, at, sids={sid}, node_ips={worker.ip},
                     note=f"worker {index} ({worker.ip}) killed under {sid}",
                     end=lambda: self.cluster.restart_worker(index, timeout=120))

    # -- one fault, start to end ------------------------------------------------------------------------------

    def run_fault(self, kind: str, settle_s: float) -> Fault:
        try:
            fault = self.cause(kind)
        except FaultSkipped as skipped:  # nothing was done: nothing to clean up, and it is no fault caused
            fault = Fault(kind, Category.UNKNOWN, time.time(), error=f"not caused: skipped: {skipped}")
            self.faults.append(fault)
            return fault
        except Exception as exc:  # noqa: BLE001 - a fault that could not be caused is reported, the soak goes on
            fault = Fault(kind, Category.UNKNOWN, time.time(), error=f"not caused: {type(exc).__name__}: {exc}")
            self.faults.append(fault)
            try:
                self.stop_fault_jobs()
                healed = self.heal(frozenset({2}) if kind == "host_oom" else frozenset())  # its planned restarts
                fault.error += f" (then: {', '.join(healed)})" if healed else ""
            except Exception as heal_exc:  # noqa: BLE001
                fault.error += f" (clean-up failed too: {heal_exc})"
            return fault
        self.faults.append(fault)
        deadline = fault.at + DETECT_TIMEOUT_S
        while time.time() < deadline and fault.detected_at is None:
            self._attribute(fault)
            time.sleep(1)
        if fault.detected_at is not None:
            time.sleep(HOLD_S)
        try:
            if fault.end is not None:
                fault.end()
        except Exception as exc:  # noqa: BLE001
            fault.error = f"ending it failed: {type(exc).__name__}: {exc}"
        fault.ended_at = time.time()
        until = fault.ended_at + settle_s
        while time.time() < until:
            self._attribute(fault)
            if fault.incidents and all(i.state is IncidentState.RESOLVED for i in fault.incidents.values()):
                break
            time.sleep(2)
        try:
            self.stop_fault_jobs()
            if fault.error:
                healed = self.heal()
                fault.error += f" (then: {', '.join(healed)})" if healed else ""
        except Exception as exc:  # noqa: BLE001
            fault.error = fault.error or f"clean-up: {exc}"
        self._attribute(fault)
        return fault

    def _attribute(self, fault: Fault) -> None:
        for incident in self.incidents():
            # a fault that came back soon reopens its old incident: it counts from when it was reopened
            reopened = parse_iso(incident.attrs.get(REOPENED_AT)) if incident.reopened else None
            since = max(incident.detected_at, reopened) if reopened else incident.detected_at
            if since.timestamp() < fault.at - 1.0 or not fault.about(incident):
                continue
            if self._other_fault_owns(fault, incident) and not (reopened and reopened.timestamp() >= fault.at - 1.0):
                continue
            fault.incidents[incident.id] = incident
            if fault.detected_at is None:
                fault.detected_at = since.timestamp()

    def _other_fault_owns(self, fault: Fault, incident: Incident) -> bool:
        return any(incident.id in f.incidents for f in self.faults if f is not fault)

    # -- the verdict ------------------------------------------------------------------------------------------

    def summary(self, rss_start: float, rss_end: float) -> dict[str, Any]:
        everything = self.incidents()
        owned = {i for f in self.faults for i in f.incidents}
        started = self.started_at
        false = [i for i in everything if i.id not in owned and i.detected_at.timestamp() >= started - 5
                 and not i.attrs.get("merged_into")]
        per_fault = []
        for n, f in enumerate(self.faults):
            # a fault that reopened an earlier fault's incident owns the messages from its start to the next fault's
            until = self.faults[n + 1].at - 1.0 if n + 1 < len(self.faults) else math.inf
            messages = self._im_messages(f.at - 1.0, until)
            latest = {i.id: i for i in everything if i.id in f.incidents}
            live = [i for i in latest.values() if not i.attrs.get("merged_into")]
            per_fault.append({
                "kind": f.kind, "at_s": round(f.at - started, 1), "note": f.note, "error": f.error,
                "detected": f.detected_at is not None,
                "detected_after_s": round(f.detected_at - f.at, 1) if f.detected_at else None,
                "right_category": any(i.category is f.expect for i in live),
                "incidents": [f"{i.id} {i.category.value} {i.state.value}" for i in live],
                "left_open": sum(1 for i in live if i.state is not IncidentState.RESOLVED),
                "duplicates": max(0, len(live) - 1),
                "im_messages": sum(messages.get(i, 0) for i in latest),
            })
        caused = [p for p in per_fault if not (p["error"] or "").startswith("not caused")]
        return {
            "minutes": round((time.time() - started) / 60, 1),
            "faults_caused": len(caused),
            "by_kind": {k: sum(1 for p in caused if p["kind"] == k) for k in sorted({p["kind"] for p in caused})},
            "detected": sum(1 for p in caused if p["detected"]),
            "missed": sum(1 for p in caused if not p["detected"]),
            "right_category": sum(1 for p in caused if p["right_category"]),
            "false_incidents": len(false),
            "false": [f"{i.id} {i.category.value} {i.summary[:120]}" for i in false],
            "left_open": sum(p["left_open"] for p in caused),
            "duplicates": sum(p["duplicates"] for p in caused),
            "im_messages_max_per_fault": max((p["im_messages"] for p in caused), default=0),
            "im_messages_total": sum(self._im_messages().values()),
            "rss_start_mib": round(rss_start, 1),
            "rss_end_mib": round(rss_end, 1),
            "rss_growth_mib": round(rss_end - rss_start, 1),
            "faults": per_fault,
        }

    def _im_messages(self, since: float = 0.0, until: float = math.inf) -> dict[str, int]:
        """incident id -> IM messages that named it, received in [since, until) (a digest names several and counts
        once for each)."""
        counts: dict[str, int] = {}
        for item in self.receiver.received:
            if not item["path"].endswith("/im") or not isinstance(item["body"], dict):
                continue
            if not since <= item["received_at"] < until:
                continue
            body = item["body"]
            for one in body.get("items") or [body]:
                incident_id = (one.get("incident") or {}).get("id")
                if incident_id:
                    counts[incident_id] = counts.get(incident_id, 0) + 1
        return counts


KINDS = ("hung_rank", "cuda_oom", "xid", "idle_gpus", "host_oom", "node_lost")


def verdict(fault: Fault) -> str:
    """One word for the console: detected, missed, or not caused (skipped, or it could not be)."""
    if fault.detected_at is not None:
        return "detected"
    return "not caused" if (fault.error or "").startswith("not caused") else "MISSED"


def schedule(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> Callable[[], str]:
    """Every class once in a shuffled round, round after round: all six come up in a long enough soak."""
    queue: list[str] = []

    def next_kind() -> str:
        if not queue:
            queue.extend(rng.sample(kinds, len(kinds)))
        return queue.pop(0)

    return next_kind


def print_table(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"soak: {result['minutes']} minutes, {result['faults_caused']} faults")
    for column in ("t", "fault", "detected after", "category", "incidents", "left open", "IM", "problem"):
        table.add_column(column)
    for p in result["faults"]:
        table.add_row(f"+{p['at_s']:.0f}s", p["kind"], f"{p['detected_after_s']} s" if p["detected"] else "missed",
                      "✓" if p["right_category"] else "✗", "\n".join(p["incidents"]), str(p["left_open"]),
                      str(p["im_messages"]), p["error"] or "")
    console.print(table)
    for key in ("faults_caused", "detected", "missed", "right_category", "false_incidents", "left_open",
                "duplicates", "im_messages_max_per_fault", "rss_start_mib", "rss_end_mib", "rss_growth_mib"):
        console.print(f"{key}: {result[key]}")
    for line in result["false"]:
        console.print(f"  false: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults are caused (>= 1)")
    parser.add_argument("--seed", type=int, default=None, help="the random pauses and order (default: random)")
    parser.add_argument("--settle", type=float, default=120.0, help="seconds an ended fault's incidents get to close")
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"the fault classes to cause, comma-separated (default: {','.join(KINDS)})")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the stack lives (default: a temp dir)")
    args = parser.parse_args()
    if args.minutes < 1:
        parser.error("--minutes must be at least 1")
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds takes a comma-separated list of {', '.join(KINDS)}")
    from stage.localstack.process import REGISTRY, install_exit_handlers

    install_exit_handlers()
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="ag-soak-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    setup_logging("WARNING", work / "soak.log")  # the console is the soak's; the stack's own logs go to a file
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    console = Console(stderr=args.json)
    soak = Soak(work, console, rng)
    try:
        soak.start()
        soak.train_sid = soak.ctx.submit("train", "train.py", resources=TRAIN_DRIVER_RESOURCES)
        soak.ctx.wait_log(soak.train_sid, "step:3 ", timeout=180)
        time.sleep(20)  # Argus reads the history and the training job's first steps: nothing should open
        rss_start = soak.rss_mib()
        next_kind = schedule(rng, kinds)
        end = soak.started_at + args.minutes * 60
        while time.time() + 60 < end:
            time.sleep(rng.uniform(5, 30))
            kind = next_kind()
            with console.status(f"t+{time.time() - soak.started_at:.0f}s: {kind}"):
                fault = soak.run_fault(kind, args.settle)
            console.print(f"t+{fault.at - soak.started_at:.0f}s {kind}: "
                          f"{verdict(fault)} {sorted(fault.incidents)}"
                          f"{' · ' + fault.error if fault.error else ''}")
        rss_end = soak.rss_mib()
        result = soak.summary(rss_start, rss_end)
        result.update(seed=seed, work_dir=str(work))
    finally:
        if getattr(soak, "argus", None) is not None:
            soak.argus.stop()  # Argus first: workers stopped under it would be lost nodes
        REGISTRY.stop_all()
    if not args.json:
        print_table(console, result)
    print(json.dumps(result, separators=(",", ":"), default=str))
    return 0


if __name__ == "__main__":
    from stage.localstack.process import StackTimeout

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sys.exit(main())
    except StackTimeout as exc:
        sys.exit(exc.message)
