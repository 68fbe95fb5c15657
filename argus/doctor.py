"""`argus doctor`: what Argus needs around it, checked one by one, each with what to fix.

Checks (outcomes as values: a `Check` per thing, never an exception): the database and its migrations, the clocks
(this host against the database and Ray's head), the Ray dashboard and its nodes, the GCS address, py-spy behind Ray's
dashboard on every node (a hang's stacks come from it), Prometheus and its dcgm-exporter targets (or the dcgm targets
scraped directly), the shared root (jobs/ there, writable by this user), SSH to the registered nodes (their probe:
reachable, py-spy), the data dir, and the LLM endpoint where one is set. A check that does not apply is "skip" and
says why. The outside world comes in: the HTTP client, the store opener and the node prober are parameters.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from core.errors import ArgusError, StoreError
from core.settings import Settings

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 5.0
MAX_NODES_PROBED = 256


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail, skip
    detail: str
    fix: str | None = None


def run_checks(settings: Settings, *, http: httpx.Client | None = None,
               probe_nodes: Callable[[], Iterable[tuple[str, bool, str]]] | None = None,
               now: Callable[[], float] = time.time) -> list[Check]:
    """Every check, in the order a person fixes things. `probe_nodes`: the registered nodes' SSH probes as (name,
    reachable and ready, message); by default through the control plane (argus/wiring.build_control)."""
    client = http or httpx.Client(timeout=settings.request_timeout_s)
    try:
        database = check_database(settings, now)
        checks = [check_data_dir(settings), *database]
        ray, nodes = check_ray(settings, client, now)
        checks += [*ray, check_gcs(settings), check_py_spy(settings, client, nodes),
                   *check_gpu_metrics(settings, client), check_shared_root(settings),
                   check_ssh(settings, probe_nodes, database_ok=database[0].status == OK), check_llm(settings, client)]
        return checks
    finally:
        if http is None:
            client.close()


def check_data_dir(settings: Settings) -> Check:
    path = settings.data_dir
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check("data dir", FAIL, f"{path}: {exc.strerror or exc}",
                     f"create {path} and give this user write access, or set data_dir")
    return Check("data dir", OK, f"{path} is writable")


def check_database(settings: Settings, now: Callable[[], float]) -> list[Check]:
    from sqlalchemy import make_url, text

    from argus.store import migrate

    url = settings.effective_database_url
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).expanduser().exists():
        return [Check("database", WARN, f"{parsed.database} does not exist yet",
                      "run `argus db upgrade`, or start `argus serve`, which creates and migrates it"),
                Check("clock vs database", SKIP, "SQLite lives on this host: one clock")]
    try:
        engine = migrate.open_engine(url)
    except ArgusError as exc:
        return [Check("database", FAIL, exc.message, exc.hint)]
    try:
        with engine.connect() as conn:
            revision = migrate.revision_of(engine)
            db_now = conn.execute(text("SELECT now()")).scalar() if engine.dialect.name == "postgresql" else None
    except Exception as exc:  # noqa: BLE001 - any driver error is this check's answer, said plainly
        engine.dispose()
        return [Check("database", FAIL, f"cannot reach {migrate.mask_url(url)}: {str(exc).splitlines()[0][:300]}",
                      "start the database, or fix database_url (ARGUS_DATABASE_URL)")]
    engine.dispose()
    head = migrate.head_revision()
    checks = [Check("database", OK, f"{migrate.mask_url(url)} at revision {revision}") if revision == head else
              Check("database", FAIL, f"{migrate.mask_url(url)} is at revision {revision or 'none'}, Argus needs "
                    f"{head}", "run `argus db upgrade` (argus serve does it at start unless auto_migrate is off)")]
    if db_now is None:
        checks.append(Check("clock vs database", SKIP, "SQLite lives on this host: one clock"))
    else:
        checks.append(_skew("clock vs database", db_now.timestamp() - now(), settings))
    return checks


def _skew(name: str, skew_s: float, settings: Settings) -> Check:
    limit = min(SKEW_FAIL_S, settings.lease_ttl_s / 2) if settings.leader_election else SKEW_FAIL_S
    detail = f"this host is {abs(skew_s):.2f} s {'behind' if skew_s > 0 else 'ahead of'} it"
    fix = "run chrony or ntpd on every host (leases, lookbacks and line ages compare clocks)"
    if abs(skew_s) >= limit:
        return Check(name, FAIL, detail, fix)
    return Check(name, WARN, detail, fix) if abs(skew_s) >= SKEW_WARN_S else Check(name, OK, detail)


def check_ray(settings: Settings, client: httpx.Client, now: Callable[[], float]
              ) -> tuple[list[Check], list[dict[str, Any]]]:
    url = settings.ray_dashboard_url.rstrip("/")
    asked = now()
    got = _data(client, f"{url}/nodes", {"view": "summary"}, "summary")
    if isinstance(got, str):
        return [Check("ray dashboard", FAIL, f"cannot read the nodes at {url}: {got}",
                      "start Ray's head with the dashboard (ray start --head --include-dashboard=true), or set "
                      "ray_dashboard_url")], []
    answer, summary = got
    nodes = [n.get("raylet") or {} for n in summary]
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    dead = len(nodes) - len(alive)
    status = OK if alive else FAIL
    checks = [Check("ray dashboard", status, f"{url}: {len(alive)} node(s) alive" + (f", {dead} dead" if dead else ""),
                    None if alive else "start Ray on the nodes (ray start --address=<head>:6379)")]
    stamp = answer.headers.get("date")
    if stamp:  # whole seconds: only a skew past a second shows
        head_now = parsedate_to_datetime(stamp).astimezone(timezone.utc).timestamp() + 0.5
        checks.append(_skew("clock vs ray head", head_now - (asked + now()) / 2, settings))
    return checks, alive


def _data(client: httpx.Client, url: str, params: dict[str, str], key: str) -> tuple[httpx.Response, Any] | str:
    """GET `url` and its JSON's data[key] (Ray's dashboard and Prometheus both answer {"data": {...}}); else why
    not, in a few words."""
    try:
        answer = client.get(url, params=params)
        answer.raise_for_status()
        return answer, answer.json()["data"][key]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]


def check_gcs(settings: Settings) -> Check:
    address = settings.ray_gcs_address
    if not address:
        return Check("ray gcs", WARN, "ray_gcs_address is not set: nodes cannot be joined, drained or taken offline",
                     "set ray_gcs_address to the head's <host>:6379")
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=settings.request_timeout_s):
            pass
    except (OSError, ValueError) as exc:
        return Check("ray gcs", FAIL, f"cannot connect to {address}: {exc}",
                     "check that the head runs and that this host may reach its GCS port")
    return Check("ray gcs", OK, f"{address} accepts connections")


def check_py_spy(settings: Settings, client: httpx.Client, nodes: list[dict[str, Any]]) -> Check:
    if not nodes:
        return Check("py-spy on nodes", SKIP, "no node to ask (the Ray dashboard check failed or none is alive)")
    url = settings.ray_dashboard_url.rstrip("/")

    def ask(node: dict[str, Any]) -> tuple[str, str]:
        # pid 1 is never a Python process: py-spy refusing it proves py-spy ran on that node
        try:
            answer = client.get(f"{url}/worker/traceback", params={"pid": "1", "node_id": node.get("nodeId", "")})
        except httpx.HTTPError as exc:
            return "error", f"{type(exc).__name__}: {exc}"
        text = answer.text
        if answer.status_code == 403 and "RAY_DASHBOARD_ENABLE_PROFILING" in text:
            return "disabled", text[:200]
        if "py-spy is not installed" in text:
            return "missing", text[:200]
        return "present", ""

    picked = nodes[:MAX_NODES_PROBED]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = dict(zip([str(n.get("nodeManagerAddress") or n.get("nodeId")) for n in picked],
                           pool.map(ask, picked), strict=True))
    if any(kind == "disabled" for kind, _ in answers.values()):
        return Check("py-spy on nodes", FAIL, "Ray's dashboard refuses stack dumps: profiling is off",
                     "start the Ray head with RAY_DASHBOARD_ENABLE_PROFILING=1 (hang reports name the stuck rank "
                     "from these stacks)")
    missing = sorted(node for node, (kind, _) in answers.items() if kind == "missing")
    errors = sorted(f"{node} ({why[:80]})" for node, (kind, why) in answers.items() if kind == "error")
    if missing or errors:
        return Check("py-spy on nodes", FAIL, "; ".join(filter(None, [
            f"py-spy is not installed on {len(missing)} node(s): {', '.join(missing[:8])}" if missing else "",
            f"no answer for {', '.join(errors[:4])}" if errors else ""])),
            "pip install py-spy into the Python Ray runs on those nodes")
    more = f" (first {len(picked)} of {len(nodes)})" if len(nodes) > len(picked) else ""
    return Check("py-spy on nodes", OK, f"py-spy answers through Ray's dashboard on {len(answers)} node(s){more}")


def check_gpu_metrics(settings: Settings, client: httpx.Client) -> list[Check]:
    if settings.prometheus_url:
        base = settings.prometheus_url.rstrip("/")
        got = _data(client, f"{base}/api/v1/targets", {"state": "active"}, "activeTargets")
        if isinstance(got, str):
            return [Check("prometheus", FAIL, f"cannot read targets at {base}: {got}",
                          "start Prometheus, or fix prometheus_url")]
        active = got[1]
        dcgm = [t for t in active if "dcgm" in str(t.get("scrapePool", "")).lower()
                or "dcgm" in str(t.get("labels", {}).get("job", "")).lower()]
        down = [str(t.get("scrapeUrl") or t.get("labels", {}).get("instance")) for t in dcgm if t.get("health") != "up"]
        checks = [Check("prometheus", OK, f"{base}: {len(active)} active target(s)")]
        if not dcgm:
            checks.append(Check("dcgm-exporter targets", WARN, "Prometheus scrapes no job named like dcgm",
                                "add every GPU node's dcgm-exporter (port 9400) to a scrape job named dcgm-exporter; "
                                "nodes without one can send NVML readings through node agents (node_agent_nvml)"))
        elif down:
            checks.append(Check("dcgm-exporter targets", FAIL,
                                f"{len(down)} of {len(dcgm)} down: {', '.join(down[:6])}",
                                "start dcgm-exporter on those nodes (or remove them from the scrape config)"))
        else:
            checks.append(Check("dcgm-exporter targets", OK, f"{len(dcgm)} up"))
        return checks
    if settings.dcgm_targets:
        down = []
        for target in settings.dcgm_targets:
            try:
                client.get(target).raise_for_status()
            except httpx.HTTPError as exc:
                down.append(f"{target} ({type(exc).__name__})")
        if down:
            return [Check("dcgm-exporter targets", FAIL, f"{len(down)} of {len(settings.dcgm_targets)} do not answer: "
                          + ", ".join(down[:6]), "start dcgm-exporter there, or fix dcgm_targets")]
        return [Check("dcgm-exporter targets", OK, f"{len(settings.dcgm_targets)} answer")]
    if settings.node_agents and settings.agents_read_gpus:
        return [Check("gpu metrics", OK, "node agents read their GPUs through NVML (no exporter configured)")]
    return [Check("gpu metrics", WARN, "no prometheus_url, dcgm_targets or node agents: no GPU metrics (idle GPUs, "
                  "Xid and ECC counters go unseen)",
                  "set prometheus_url (with dcgm-exporter scraped) or node_agents: true")]


def check_shared_root(settings: Settings) -> Check:
    root = settings.shared_root
    jobs = root / "jobs"
    if not root.is_dir():
        return Check("shared root", FAIL, f"{root} is not a folder here",
                     f"mount the shared storage at {root} on this host and every node, or set shared_root")
    if not jobs.is_dir():
        return Check("shared root", WARN, f"{jobs} does not exist: jobs' logs and checkpoints are not read",
                     f"mkdir {jobs} (writable by the users who submit jobs)")
    try:
        with tempfile.NamedTemporaryFile(dir=jobs, prefix=".argus-doctor-"):
            pass
    except OSError as exc:
        user = _user()
        return Check("shared root", FAIL, f"{jobs}: {exc.strerror or exc}",
                     f"give {user} write access to {jobs} (Argus makes job folders and keeps failure scenes there)")
    return Check("shared root", OK, f"{jobs} is readable and writable")


def check_ssh(settings: Settings, probe_nodes: Callable[[], Iterable[tuple[str, bool, str]]] | None, *,
              database_ok: bool = True) -> Check:
    if not database_ok:
        return Check("ssh to nodes", SKIP, "the registered nodes are in the database: fix the database first")
    if probe_nodes is None:
        probe_nodes = lambda: _probe_registered(settings)  # noqa: E731 - the default prober, built lazily
    try:
        results = list(probe_nodes())
    except StoreError as exc:
        return Check("ssh to nodes", SKIP, f"the registered nodes are in the database, which cannot be read: "
                     f"{exc.message}"[:300])
    except ArgusError as exc:
        return Check("ssh to nodes", FAIL, exc.message, exc.hint)
    if not results:
        return Check("ssh to nodes", SKIP, "no node is registered (argus nodes / POST /v1/nodes): nothing to reach")
    bad = [f"{name}: {message}" for name, ready, message in results if not ready]
    if bad:
        return Check("ssh to nodes", FAIL, f"{len(bad)} of {len(results)}: " + "; ".join(bad[:4])[:500],
                     "check the node's ssh user and key (ssh_key_dirs), and that py-spy is installed beside ray there")
    return Check("ssh to nodes", OK, f"{len(results)} registered node(s) answer over SSH")


def _probe_registered(settings: Settings) -> list[tuple[str, bool, str]]:
    from argus.store.store import Store
    from argus.wiring import build_control

    store = Store(settings.effective_database_url, auto_migrate=False)  # the doctor changes nothing
    try:
        control = build_control(settings, store)
        if control.manager is None:
            return [(r.spec.name, False, "ray_gcs_address is not set, so Argus does not manage nodes over SSH")
                    for r in control.registry.list()]
        out = []
        for record in control.registry.list()[:MAX_NODES_PROBED]:
            outcome = control.manager.probe(record.spec.name)
            ready = outcome.ok and outcome.data.get("py_spy") != "absent"
            out.append((record.spec.name, ready, outcome.message))
        return out
    finally:
        store.close()


def check_llm(settings: Settings, client: httpx.Client) -> Check:
    if not settings.llm_base_url:
        return Check("llm", SKIP, "llm_base_url is not set: reports are written by the rules alone")
    base = settings.llm_base_url.rstrip("/")
    try:
        client.get(f"{base}/models").raise_for_status()
    except httpx.HTTPError as exc:
        return Check("llm", FAIL, f"{base}/models: {type(exc).__name__}: {exc}"[:300],
                     "start the OpenAI-compatible server, or fix llm_base_url")
    return Check("llm", OK, f"{base} answers")


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.getuid()}"


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [{"check": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks]

