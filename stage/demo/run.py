"""`argus demo`: the whole loop on one machine, with real processes and real faults.

Brings up a Ray head and two workers on loopback (4 advertised GPUs each), a DCGM exporter simulator per
worker, Prometheus, Alertmanager, a webhook receiver standing in for IM, the local LLM when `make llm` has
run, and Argus itself (`ArgusService`, exactly what `argus serve` runs). Then it causes the faults of
stage/demo/faults.py phase by phase and fills a live table from Argus's store: when each fault was caused,
when Argus opened its incident, the category, what remediation did, and where the report is. Everything
it started is stopped on the way out, also on Ctrl-C.

One module on purpose: bringing the stack up, running the phases and tearing everything down share one
order and one teardown path (`_Stack`); the faults, their injection and the table already live apart
(faults.py, inject.py, table.py).
"""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from core.errors import ArgusError
from core.jobfolder import JobFolder, is_submission_id
from core.logging import setup_logging
from core.refs import refs_of
from core.settings import load_settings
from core.types import ActionState
from remediation.policy import DEFAULT_POLICY
from stage.demo.faults import FAULTS
from stage.demo.inject import INJECTORS, DemoContext, is_its_incident
from stage.demo.table import Row, render
from stage.localstack.process import poll_until

if TYPE_CHECKING:
    from argus.store.store import Store
    from stage.localstack.llm import LlamaServer

GPUS_PER_WORKER = 4
PHASE_TIMEOUT_S = 150.0  # a fault not detected by then is reported as missed
LLM_WAIT_S = 240.0  # at the end, how long to wait for the LLM's reports still being written
DEMO_SETTINGS: dict[str, Any] = {  # Settings overrides, of each field's own type
    "poll_interval_s": 1.0,
    "stall_min_s": 20.0,  # instead of 60: the demo's job prints a step every 0.5 s
    "idle_gpu_window_s": 30.0,  # instead of 10 minutes
    "remediation_interval_s": 1.0,
    "rca_token_budget": 1500,  # a quarter of the default: the local LLM on a 2-core CPU reads about 60 tokens/s
}
POLICY = DEFAULT_POLICY.parent / "demo.yaml"


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"),
                    TimeElapsedColumn(), console=console)


def run_demo(*, work_dir: Path, keep: bool, console: Console) -> int:
    from stage.localstack.process import REGISTRY, install_exit_handlers

    if not console.is_terminal:  # a log or a pipe: wide enough for the table's six columns
        console.width = max(console.width, 150)
    work_dir = work_dir.resolve()
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    # the console belongs to the demo's table; Argus's own log goes to a file beside the stack's logs
    setup_logging("ERROR", work_dir / "argus.log")
    install_exit_handlers()
    started = time.time()
    console.rule("[bold]Argus demo: six faults on a real Ray cluster, detected, explained, remediated")
    stack: _Stack | None = None
    try:
        stack = _Stack(work_dir)
        with _progress(console) as progress:
            stack.start(progress)
        rows = [Row(fault) for fault in FAULTS]
        _run_faults(stack, rows, console, started)
        _summary(console, stack, rows, started)
        if keep:
            console.print("\nThe stack stays up; Ctrl-C ends it.")
            while True:
                time.sleep(3600)
        return 0 if all(r.category_ok for r in rows) else 1
    except ArgusError as exc:
        console.print(f"[bold red]demo failed:[/] {escape(exc.message)}")
        if exc.hint:
            console.print(f"what to do: {escape(exc.hint)}")
        return 1
    except KeyboardInterrupt:
        console.print("\ninterrupted")
        return 130
    finally:
        with console.status("stopping everything the demo started"):
            if stack is not None and stack.argus is not None:
                stack.argus.stop()  # Argus first: a worker stopped under a running Argus is a lost node to it
            REGISTRY.stop_all()
        console.print(f"stopped; logs kept under {work_dir} (Argus's own: {work_dir / 'argus.log'})")


def _run_faults(stack: _Stack, rows: list[Row], console: Console, started: float) -> None:
    ctx = stack.context
    lock = threading.Lock()

    def view() -> Group:
        with lock:
            table = render(rows, started=started, title="faults: caused by the demo, seen and handled by Argus")
        return Group(table, f"[dim]t+{time.time() - started:.0f}s · web page {stack.web_url}[/]")

    with Live(view(), console=console, refresh_per_second=2, transient=False) as live:
        for phase in sorted({r.fault.phase for r in rows}):
            current = [r for r in rows if r.fault.phase == phase]
            threads = [threading.Thread(target=_inject, args=(ctx, row, lock), daemon=True) for row in current]
            for t in threads:
                t.start()
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            while time.monotonic() < deadline:
                with lock:
                    for row in current:
                        stack.refresh(row)
                live.update(view())
                if all(r.done or r.error for r in current) and not any(t.is_alive() for t in threads):
                    break
                time.sleep(0.5)
            for row in current:
                if row.injection and not row.incident and not row.error:
                    row.error = f"not detected within {PHASE_TIMEOUT_S:.0f} s"
                for undo in row.injection.undo if row.injection else []:
                    try:
                        undo()
                    except Exception as exc:  # noqa: BLE001 - a failed clean-up is shown, the demo goes on
                        row.error = row.error or f"clean-up failed: {exc}"
            stack.stop_jobs()  # the next phase starts on a quiet cluster
            live.update(view())
        deadline = time.monotonic() + (LLM_WAIT_S if stack.llm else 5)
        while time.monotonic() < deadline and not stack.reports_settled(rows):
            with lock:
                for row in rows:
                    stack.refresh(row)
            live.update(view())
            time.sleep(1)
        with lock:
            for row in rows:
                stack.refresh(row)
        live.update(view())
    console.print()


def _inject(ctx: DemoContext, row: Row, lock: threading.Lock) -> None:
    try:
        injection = INJECTORS[row.fault.key](ctx)
    except ArgusError as exc:
        with lock:
            row.error = exc.message
        return
    except Exception as exc:  # noqa: BLE001 - one fault failing to start must not end the others
        with lock:
            row.error = f"{type(exc).__name__}: {exc}"
        return
    with lock:
        row.injection = injection


def _summary(console: Console, stack: _Stack, rows: list[Row], started: float) -> None:
    detected = [r for r in rows if r.incident is not None]
    right = [r for r in detected if r.category_ok]
    latencies = sorted(r.detected_after for r in detected if r.detected_after is not None)
    llm = sum(1 for r in rows if r.reports and r.reports[-1].generator.startswith("llm"))
    acted = sum(1 for r in rows for a in r.actions if a.state is ActionState.SUCCEEDED)
    waiting = [a for r in rows for a in r.actions if a.state is ActionState.PLANNED and not a.dry_run]
    lines = [
        f"faults caused: {sum(1 for r in rows if r.injection)}/{len(rows)}; detected: {len(detected)}; "
        f"right category: {len(right)}",
        f"detection after the fault: median {latencies[len(latencies) // 2]:.1f} s, max {latencies[-1]:.1f} s"
        if latencies else "detection: none",
        f"remediation steps done: {acted}; waiting for an operator's approval: {len(waiting)}",
        f"reports: {sum(1 for r in rows if r.reports)} written, {llm} by the local LLM",
        f"notifications received by the webhook sink: {stack.deliveries()}",
        f"demo time: {time.time() - started:.0f} s",
        "",
        f"web page: {stack.web_url}  (operator token: {stack.operator_token})",
        f"API: {stack.argus_url}/docs   Prometheus: {stack.prometheus_url}   Argus metrics: {stack.argus_url}/metrics",
        f"reports and scenes: {stack.shared}/jobs/<job>/rca and /scene",
    ]
    files = [f"  {r.fault.title}: {r.report_file}" for r in rows if r.report_file]
    if files:
        lines += ["", "report files (Markdown and JSON beside it):"] + files
    errors = [f"{r.fault.title}: {r.error}" for r in rows if r.error]
    if errors:
        lines += ["", "[red]problems:[/]"] + [escape(e) for e in errors]
    console.print(Panel("\n".join(lines), title="summary"))
    notes = [f"- {r.fault.title}: {r.fault.how}" + (f" [dim](simulated: {r.fault.simulated})[/]"
                                                    if r.fault.simulated else "") for r in rows]
    console.print("\n".join(["how each fault was caused:"] + notes))


class _Stack:
    """The local stack and Argus, started in order; every process is registered for teardown."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.shared = work_dir / "argus" / "shared"
        self.llm: Any = None
        self.argus: _ArgusInThread | None = None
        self.web_url = self.argus_url = self.prometheus_url = ""
        self.operator_token = ""

    def start(self, progress: Progress) -> None:
        from stage.localstack.alertmanager import Alertmanager
        from stage.localstack.process import REGISTRY
        from stage.localstack.prometheus import Prometheus
        from stage.localstack.ray_cluster import RayCluster
        from stage.localstack.webhook_receiver import WebhookReceiver
        from stage.sim.dcgm_exporter import DcgmExporterSim

        work_dir = self.work_dir
        step = progress.add_task("starting a Ray head and two workers (4 GPUs each) on 127.0.0.2-4", total=None)
        profiling = {"RAY_DASHBOARD_ENABLE_PROFILING": "1"}  # py-spy stacks for keep_scene
        self.cluster = cluster = RayCluster(work_dir / "ray", fast_health_check=True, worker_gpus=GPUS_PER_WORKER,
                                            head_env=profiling, worker_env=profiling)
        REGISTRY.add(cluster)
        cluster.start(timeout=180)
        progress.update(step, description="Ray cluster up: head (no CPUs for work) + 2 workers", total=1, completed=1)

        step = progress.add_task("starting DCGM simulators, Prometheus, Alertmanager, webhook sink", total=None)
        self.receiver = receiver = WebhookReceiver()
        receiver.start()
        REGISTRY.add(receiver)
        self.sims = []
        for node in cluster.workers:
            sim = DcgmExporterSim(f"gpu-node-{node.index}", gpus=GPUS_PER_WORKER, host=node.ip, port=0)
            sim.start()
            REGISTRY.add(sim)
            self.sims.append(sim)
        alertmanager = Alertmanager(work_dir / "alertmanager", webhook_url=receiver.url + "/alertmanager")
        alertmanager.start()
        REGISTRY.add(alertmanager)
        prometheus = Prometheus(work_dir / "prometheus", ray_sd_file=cluster.sd_file,
                                static_targets={"dcgm": [f"{s.host}:{s.port}" for s in self.sims]},
                                alertmanager_url=alertmanager.url)
        prometheus.start()
        REGISTRY.add(prometheus)
        self.prometheus_url = prometheus.url
        progress.update(step, description="monitoring up: Prometheus, Alertmanager, 2 DCGM simulators",
                        total=1, completed=1)

        self.llm = _start_llm(work_dir, progress)
        step = progress.add_task("starting Argus (loop every 1 s, API, web page, remediation)", total=None)
        self.argus = _ArgusInThread(work_dir / "argus", cluster, prometheus.url, receiver.url + "/argus", self.llm)
        self.argus.start()
        REGISTRY.add(self.argus)
        self.argus_url = self.argus.url
        self.web_url = f"{self.argus.url}/ui/incidents"
        self.operator_token = self.argus.tokens["operator"]
        progress.update(step, description=f"Argus up: {self.argus.url}", total=1, completed=1)

        step = progress.add_task("waiting for GPU and Ray metrics in Prometheus", total=None)
        expected = {"gpus": GPUS_PER_WORKER * len(self.sims), "ray_nodes": len(cluster.nodes)}
        poll_until("DCGM and Ray series in Prometheus", lambda: _metric_counts(prometheus.url, expected), timeout=90)
        progress.update(step, description=f"Prometheus has {expected['gpus']} simulated GPUs and "
                        f"{expected['ray_nodes']} Ray nodes", total=1, completed=1)
        api = httpx.Client(base_url=self.argus.url, timeout=30,
                           headers={"Authorization": f"Bearer {self.argus.tokens['operator']}"})
        self.context = DemoContext(cluster=cluster, sims=self.sims, api=api, code_dir=self.shared / "code" / "demo")
        self.context.prepare_code()

    @property
    def store(self) -> Store:
        store = self.argus.service.store if self.argus is not None else None
        if store is None:
            raise RuntimeError("Argus is not running yet: start() the stack before reading its store")
        return store

    def refresh(self, row: Row) -> None:
        """Fill a row from Argus's store: its incident, the incident's actions and reports."""
        if row.injection is None:
            return
        if row.incident is None:
            recent = self.store.list_incidents(limit=50)
            mine = [i for i in recent if is_its_incident(i, row.injection)]
            if not mine:
                return
            row.incident = min(mine, key=lambda i: i.detected_at)
        sid = row.injection.submission_id
        if row.injection.at_job_end and sid is not None and (ended := self.context.ended_at(sid)):
            # the fault is when it showed: the first evidence, or Ray's end of the job if that came first
            row.injection.at = min(ended, row.incident.first_seen.timestamp())
            row.injection.at_job_end = False
        row.incident = self.store.get_incident(row.incident.id)
        row.actions = self.store.list_actions(row.incident.id)
        row.reports = self.store.reports_for(row.incident.id)
        sid = refs_of(row.incident).submission_id or row.injection.submission_id
        if sid and is_submission_id(sid):
            path = JobFolder(self.shared, sid).rca / f"{row.incident.id}.md"
            row.report_file = path.relative_to(self.work_dir.parent) if path.exists() else None
        open_steps = [a for a in row.actions if a.state in (ActionState.APPROVED, ActionState.RUNNING)]
        row.done = bool(row.reports) and not open_steps and (bool(row.actions) or row.incident is not None)

    def reports_settled(self, rows: list[Row]) -> bool:
        if self.llm is None:
            return all(r.reports for r in rows if r.incident)
        return all(len(r.reports) >= 2 for r in rows if r.incident)

    def stop_jobs(self) -> None:
        for sid in self.context.running_jobs():
            self.context.api.post(f"/v1/jobs/{sid}/stop")
        poll_until("the demo's jobs to stop", lambda: not self.context.running_jobs(), timeout=60, interval=0.5)

    def deliveries(self) -> int:
        return len([r for r in self.receiver.received if r["path"].endswith("/argus")])


def _start_llm(work_dir: Path, progress: Progress) -> LlamaServer | None:
    """The local LLM that `make llm` installed, or None (reports are then the rule engine's)."""
    from stage.localstack.llm import LlamaServer, llm_paths
    from stage.localstack.process import REGISTRY

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


def _metric_counts(prometheus_url: str, expected: dict[str, int]) -> dict[str, int] | None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    counts = {
        "gpus": len(prom.custom_query("DCGM_FI_DEV_GPU_UTIL")),
        "ray_nodes": len(prom.custom_query("count by (instance) (ray_node_mem_total)")),
    }
    return counts if counts == expected else None


class _ArgusInThread:
    """`ArgusService` with uvicorn in a thread of this process, so the demo can read its store directly."""

    def __init__(self, data_dir: Path, cluster: Any, prometheus_url: str, webhook_url: str, llm: Any) -> None:
        from stage.localstack.ports import free_port

        extra = {"llm_base_url": llm.base_url, "llm_model": llm.model, "llm_timeout_s": 600} if llm else {}
        self.settings = load_settings(
            data_dir=data_dir,
            ray_dashboard_url=cluster.dashboard_url,
            ray_gcs_address=cluster.gcs_address,
            prometheus_url=prometheus_url,
            webhook_urls=[webhook_url],
            api_port=free_port(),
            shared_root=data_dir / "shared",
            remediation_policy=POLICY,
            **DEMO_SETTINGS,
            **extra,
        )
        self.url = f"http://{self.settings.api_host}:{self.settings.api_port}"
        self.tokens: dict[str, str] = {}
        self._records: list[Any] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        import uvicorn

        from argus.service import ArgusService

        self.service = ArgusService(self.settings)
        app = self.service.start()
        store = self.service.store
        if store is None:  # start() opens it first: a None here is a bug in ArgusService
            raise RuntimeError("ArgusService.start() returned without a store")
        # The demo works through the API the way a client must: with tokens, revoked when the demo ends. The
        # suffix keeps names unique when the demo runs again on the same data dir.
        expires = datetime.now(timezone.utc) + timedelta(days=1)
        for role in ("operator",):
            record, token = store.create_token(f"demo-{role}-{secrets.token_hex(4)}", role,
                                               created_by="argus demo", expires_at=expires)
            self._records.append(record)
            self.tokens[role] = token
        config = uvicorn.Config(app, host=self.settings.api_host, port=self.settings.api_port, log_config=None,
                                log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="argus-api", daemon=True)
        self._thread.start()
        poll_until("the Argus API", self._healthy, timeout=30)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if getattr(self, "service", None) is not None and self.service.daemon is not None:
            self.service.daemon.stop()  # no more detection while the stack goes down
            self.service.daemon = None
        if self._server is not None:
            self._server.should_exit = True
            if self._thread:
                self._thread.join(timeout=10)
        store = getattr(getattr(self, "service", None), "store", None)
        if store is not None:  # no service, no tokens
            for record in self._records:
                try:
                    store.revoke_token(record.id)
                except ArgusError:  # the demo is over either way; its token expires unused
                    pass
        if getattr(self, "service", None) is not None:
            self.service.stop(reports_timeout_s=5)
