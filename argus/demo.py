"""`argus demo`: the whole loop on one machine, with real processes and a real fault.

Brings up a Ray head and two workers on loopback, Prometheus (scraping Ray and a DCGM exporter
simulator per worker), Alertmanager, and a local webhook receiver standing in for the IM / ops-agent
endpoint; starts Argus (loop + API) against it; runs a small job with a rank on worker 1; kills worker
1's raylet; and shows when Ray declared the node dead, when Argus opened the incident, and what it says.
Everything it started is stopped on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
from loguru import logger
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from core.errors import ArgusError
from core.logging import setup_logging
from core.settings import load_settings

JOB_SCRIPT = '''
import time
import ray

ray.init()

@ray.remote(num_cpus=0, resources={"worker1": 0.1})
class Trainer:
    def step(self, i):
        time.sleep(0.5)
        return i

trainer = Trainer.remote()
for i in range(100000):
    print(f"step {i} loss {1.0 / (i + 1):.4f}", flush=True)
    ray.get(trainer.step.remote(i))
'''


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"), console=console)


def _wait(what: str, check, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise ArgusError(f"timed out after {timeout:.0f}s waiting for {what}", hint="see the logs under the work dir")


def run_demo(*, work_dir: Path, keep: bool, console: Console) -> int:
    from argus.localstack.alertmanager import Alertmanager
    from argus.localstack.process import REGISTRY, install_exit_handlers
    from argus.localstack.prometheus import Prometheus
    from argus.localstack.ray_cluster import RayCluster
    from argus.localstack.webhook_receiver import WebhookReceiver
    from argus.sim.dcgm_exporter import DcgmExporterSim

    work_dir = work_dir.resolve()
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    # the console belongs to the demo's table; Argus's own log goes to a file beside the stack's logs
    setup_logging("ERROR", work_dir / "argus.log")
    install_exit_handlers()
    console.rule("[bold]Argus demo: a lost node, end to end")
    try:
        with _progress(console) as progress:
            step = progress.add_task("starting a Ray head and two workers on 127.0.0.2-4", total=None)
            cluster = RayCluster(work_dir / "ray", fast_health_check=True)
            REGISTRY.add(cluster)
            cluster.start()
            progress.update(step, description="Ray cluster up: head + 2 workers", total=1, completed=1)

            step = progress.add_task("starting DCGM simulators, Prometheus, Alertmanager, webhook sink", total=None)
            receiver = WebhookReceiver()
            receiver.start()
            REGISTRY.add(receiver)
            sims = []
            for node in cluster.workers:
                sim = DcgmExporterSim(f"gpu-node-{node.index}", gpus=4, host=node.ip, port=0)
                sim.start()
                REGISTRY.add(sim)
                sims.append(sim)
            alertmanager = Alertmanager(work_dir / "alertmanager", webhook_url=receiver.url + "/alertmanager")
            alertmanager.start()
            REGISTRY.add(alertmanager)
            prometheus = Prometheus(
                work_dir / "prometheus",
                ray_sd_file=cluster.sd_file,
                static_targets={"dcgm": [f"{s.host}:{s.port}" for s in sims]},
                alertmanager_url=alertmanager.url,
            )
            prometheus.start()
            REGISTRY.add(prometheus)
            done = "monitoring up: Prometheus, Alertmanager, 2 DCGM simulators (4 GPUs each)"
            progress.update(step, description=done, total=1, completed=1)

            llm = _start_llm(work_dir, progress)
            step = progress.add_task("starting Argus (loop every 1 s + API)", total=None)
            argus = _ArgusUnderTest(work_dir / "argus", cluster.dashboard_url, prometheus.url, receiver.url + "/argus",
                                    llm_url=llm.base_url if llm else None, llm_model=llm.model if llm else None)
            argus.start()
            REGISTRY.add(argus)
            progress.update(step, description=f"Argus up: API at {argus.url}", total=1, completed=1)

            step = progress.add_task("submitting a job with a rank on worker 1", total=None)
            submission_id = _submit_job(cluster.dashboard_url, work_dir)
            _wait("the job's rank on worker 1", lambda: _rank_alive(cluster.dashboard_url, submission_id), timeout=120)
            progress.update(step, description=f"job {submission_id} is training", total=1, completed=1)

            step = progress.add_task("reading GPU and Ray metrics through Prometheus", total=None)
            expected = {"gpus": 4 * len(sims), "ray_nodes": len(cluster.nodes)}
            series = _wait("DCGM and Ray series in Prometheus",
                           lambda: _metric_counts(prometheus.url, expected), timeout=60)
            progress.update(step, description=f"Prometheus has {series['gpus']} simulated GPUs and "
                            f"{series['ray_nodes']} Ray nodes", total=1, completed=1)

            worker = cluster.worker(1)
            step = progress.add_task(f"killing worker 1's raylet ({worker.ip}) and waiting for Argus", total=None)
            killed_at = cluster.kill_worker(1)
            incident = _wait("Argus to open a node_lost incident", argus.first_incident, timeout=120)
            detected_wall = time.time()
            ray_verdict = _wait("Ray's DEAD verdict in the incident", lambda: argus.ray_verdict(incident.id),
                                timeout=120)
            delivered = receiver.wait_for(lambda r: r["path"].endswith("/argus"), timeout=30)
            progress.update(step, description="incident detected and delivered", total=1, completed=1)

            who = "the local LLM (a small model on 2 CPU cores: a minute or more)" if llm else "the rule engine"
            step = progress.add_task(f"writing the root-cause report with {who}", total=None)
            report = _wait("the incident's report", lambda: argus.final_report(incident.id, llm=llm is not None),
                           timeout=600 if llm else 60, interval=1)
            progress.update(step, description=f"report written ({report.generator})", total=1, completed=1)

        api_items = argus.get("/v1/incidents").json()["items"]
        incident = argus.store.get_incident(incident.id)
        _report(console, incident, killed_at, detected_wall, ray_verdict, delivered, api_items, argus, work_dir)
        _show_report(console, report, argus, llm is not None)
        if keep:
            console.print(f"\nThe stack stays up (Argus API {argus.url}, Prometheus {prometheus.url}); Ctrl-C ends it.")
            while True:
                time.sleep(3600)
        return 0
    except ArgusError as exc:
        console.print(f"[bold red]demo failed:[/] {exc.message}")
        if exc.hint:
            console.print(f"what to do: {exc.hint}")
        return 1
    except KeyboardInterrupt:
        console.print("\ninterrupted")
        return 130
    finally:
        with console.status("stopping everything the demo started"):
            REGISTRY.stop_all()
        console.print(f"stopped; logs kept under {work_dir} (Argus's own: {work_dir / 'argus.log'})")


def _report(console, incident, killed_at, detected_wall, ray_verdict, delivered, api_items, argus, work_dir) -> None:
    died = ray_verdict.timestamp()
    detected = incident.detected_at.timestamp()
    table = Table(title="Lost node: what happened, seconds after the kill", show_lines=False)
    table.add_column("event")
    table.add_column("t (s)", justify="right")
    table.add_row("worker 1's raylet killed (SIGKILL)", "0.0")
    events = [
        ("Ray declared the node DEAD (its own end time)", died),
        ("Argus opened the incident", detected),
        ("notification received by the webhook", delivered.get("received_at", detected_wall)),
    ]
    for label, at in sorted(events, key=lambda row: row[1]):
        table.add_row(label, f"{at - killed_at:.1f}")
    console.print(table)
    findings = argus.store.findings_for(incident.id)
    seen_by = "\n".join(f"  - {escape(f.reason)}: {escape(_short(f.summary))}" for f in findings)
    console.print(
        Panel(
            f"[bold]{incident.id}[/]  {incident.category.value}  {incident.severity.value}\n"
            f"{escape(incident.summary)}\n\n"
            f"[bold]seen by {len(findings)} finding(s):[/]\n{seen_by}\n\n"
            f"[bold]what to do:[/] {escape(incident.recommended_action or '')}",
            title="the incident",
        )
    )
    console.print(f"GET {argus.url}/v1/incidents -> {len(api_items)} incident(s); "
                  f"webhook body event = {delivered.get('body', {}).get('event')}")
    console.print("Ray's health check was tuned for the demo (500 ms x 3); with Ray's defaults (3 s x 5) the "
                  "DEAD verdict comes ~12 s after the kill and Argus follows on its next poll.")
    console.print(f"Argus's database: {argus.settings.effective_database_url} "
                  f"(try: ARGUS_DATA_DIR={argus.settings.data_dir} .venv/bin/argus incidents list)")


def _start_llm(work_dir: Path, progress: Progress):  # type: ignore[no-untyped-def]
    """The local LLM that `make llm` installed, or None (reports are then the rule engine's)."""
    from argus.localstack.llm import LlamaServer, llm_paths
    from argus.localstack.process import REGISTRY

    paths = llm_paths()
    if not paths.present:
        progress.add_task("no local LLM (run `make llm` for one): reports come from the rule engine", total=1,
                          completed=1)
        return None
    step = progress.add_task("starting the local LLM (llama-server, Qwen2.5-Coder-1.5B)", total=None)
    server = LlamaServer(work_dir / "llm", binary=paths.binary, model=paths.model)
    REGISTRY.add(server)
    server.start(timeout=300)
    progress.update(step, description=f"local LLM up at {server.base_url}", total=1, completed=1)
    return server


def _show_report(console: Console, report, argus, llm: bool) -> None:  # type: ignore[no-untyped-def]
    llm_line = ""
    if report.data.get("llm"):
        info = report.data["llm"]
        llm_line = (f"\nLLM {info['model']}: {'kept' if info.get('accepted') else 'not used'} "
                    f"({escape(_short(info.get('note') or info.get('error') or '', 200))}), {info['seconds']:.0f} s")
    console.print(Panel(
        f"[bold]{report.category.value}[/] (confidence {report.confidence:.2f}), written by {report.generator}"
        f"{llm_line}\n\n{escape(_short(report.summary, 400))}\n\n"
        f"Read it: GET {argus.url}/v1/incidents/{report.incident_id}/report?format=markdown, or "
        f"ARGUS_DATA_DIR={argus.settings.data_dir} .venv/bin/argus incidents report {report.incident_id}",
        title="the root-cause report",
    ))
    if not llm:
        console.print("Run `make llm` once to have the local LLM write the narrative of the next demo's report.")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _submit_job(dashboard_url: str, work_dir: Path) -> str:
    from ray.job_submission import JobSubmissionClient

    script = work_dir / "job" / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(JOB_SCRIPT)
    client = JobSubmissionClient(dashboard_url)
    return client.submit_job(
        entrypoint=f"{sys.executable} {script}",  # the interpreter that has Ray, not whatever `python` is
        submission_id=f"demo-{datetime.now(timezone.utc):%H%M%S}",
        entrypoint_resources={"worker2": 0.1},  # the driver on worker 2, its rank on worker 1
        metadata={"owner": "demo"},
    )


def _rank_alive(dashboard_url: str, submission_id: str) -> bool:
    from ray.job_submission import JobStatus, JobSubmissionClient
    from ray.util.state import list_actors

    info = JobSubmissionClient(dashboard_url).get_job_info(submission_id)
    if info.status in {JobStatus.FAILED, JobStatus.STOPPED, JobStatus.SUCCEEDED}:
        raise ArgusError(f"the demo job {submission_id} ended early: {info.status}: {info.message}")

    filters = [("class_name", "=", "Trainer"), ("state", "=", "ALIVE")]
    return bool(list_actors(address=dashboard_url, filters=filters, raise_on_missing_output=False))


def _metric_counts(prometheus_url: str, expected: dict[str, int]) -> dict[str, int] | None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    counts = {
        "gpus": len(prom.custom_query("DCGM_FI_DEV_GPU_UTIL")),
        "ray_nodes": len(prom.custom_query("count by (instance) (ray_node_mem_total)")),
    }
    return counts if counts == expected else None


class _ArgusUnderTest:
    """Argus as `argus serve` runs it (store, loop, API), in this process so the demo can read its store."""

    def __init__(self, data_dir: Path, dashboard_url: str, prometheus_url: str, webhook_url: str, *,
                 llm_url: str | None = None, llm_model: str | None = None) -> None:
        from argus.localstack.ports import free_port

        extra = {"llm_base_url": llm_url, "llm_model": llm_model, "llm_timeout_s": 600} if llm_url else {}
        self.settings = load_settings(
            data_dir=data_dir,
            ray_dashboard_url=dashboard_url,
            prometheus_url=prometheus_url,
            webhook_urls=[webhook_url],
            poll_interval_s=1.0,
            api_port=free_port(),
            shared_root=data_dir / "shared",
            **extra,
        )
        self.url = f"http://{self.settings.api_host}:{self.settings.api_port}"
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        from argus.api.app import create_app
        from argus.daemon import Daemon
        from argus.exporter import ArgusMetrics
        from argus.wiring import build_control, build_pipeline, build_reports, open_store

        self.store = open_store(self.settings)
        # The demo reads the API the way a client must: with a viewer token, revoked when the demo ends.
        # The suffix keeps names unique when the demo runs again on the same data dir.
        self._token_record, self._token = self.store.create_token(
            f"demo-{secrets.token_hex(4)}", "viewer", created_by="argus demo",
            expires_at=datetime.now(timezone.utc) + timedelta(days=1),
        )
        metrics = ArgusMetrics()
        self.reports = build_reports(self.settings, self.store)
        self.reports.start()
        pipeline = build_pipeline(self.settings, self.store, public_url=self.url, metrics=metrics,
                                  reports=self.reports)
        self.daemon = Daemon(pipeline, interval_s=self.settings.poll_interval_s)
        app = create_app(store=self.store, health_provider=pipeline.health, metrics=metrics,
                         control=build_control(self.settings, self.store))
        config = uvicorn.Config(app, host=self.settings.api_host, port=self.settings.api_port, log_config=None,
                                log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="argus-api", daemon=True)
        self._thread.start()
        _wait("the Argus API", self._healthy, timeout=30)
        self.daemon.start()

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {self._token}"}, timeout=10)

    def ray_verdict(self, incident_id: str):
        """When Ray declared the node dead, once the node-state finding has joined the incident."""
        for finding in self.store.findings_for(incident_id):
            if finding.reason == "RayNodeDead":
                return finding.first_seen
        return None

    def final_report(self, incident_id: str, *, llm: bool):  # type: ignore[no-untyped-def]
        """The incident's last report once the writer is done with it (after the LLM's pass, where there is one)."""
        reports = self.store.reports_for(incident_id)
        if not reports or not self.reports.idle() or (llm and len(reports) < 2):
            return None
        return reports[-1]

    def first_incident(self):
        from core.types import Category

        items = self.store.list_incidents(category=Category.NODE_LOST, limit=1)
        return items[0] if items else None

    def stop(self) -> None:
        if getattr(self, "daemon", None):
            self.daemon.stop()
        if getattr(self, "reports", None):
            self.reports.stop(timeout_s=5)
        if self._server is not None:
            self._server.should_exit = True
            if self._thread:
                self._thread.join(timeout=10)
        if getattr(self, "store", None):
            if getattr(self, "_token_record", None):
                try:
                    self.store.revoke_token(self._token_record.id)
                except ArgusError as err:  # the demo is over either way; its token expires unused
                    logger.warning("could not revoke the demo's API token: {}", err)
            self.store.close()
