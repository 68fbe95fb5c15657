"""An alert storm into a real `argus serve`: Alertmanager's webhook at storm rate, and people reading the API.

A real `argus serve` (its own process, SQLite under a temp data dir or --database-url) with a Slack channel and a
generic webhook pointed at a recording HTTP endpoint (stage/localstack/webhook_receiver.py). --senders threads post
--alerts Alertmanager alerts (webhook format 4, --batch alerts a request, as Alertmanager groups them) spread evenly
over --seconds: --fingerprints distinct alerts (alert name x node; categories and severities mixed), each firing
again and again as Alertmanager re-sends what still fires. Meanwhile --readers threads, in a process of their own,
read `GET /v1/incidents` and `GET /v1/health` as a person or the ops agent would.

With --replicas 2 it runs the deployment of two replicas sharing one store (argus/leader.py): the first started
leads (the loop, chores, remediation) and takes Alertmanager's webhook; the readers read the second, a follower that
serves the API from the store, as a team that splits the two would. Both run on the same cores.

Prints: alerts sent and accepted (and refused, with why), alerts/s accepted, incidents opened against distinct
fingerprints (goal: one each), IM messages and webhook posts sent during the storm and in the --drain-s after it, the
API's p50/p99 during the storm (goal: p99 under 200 ms on 2 cores) and while the filer works through what was queued
(the webhook queues alerts in the store and answers at once; argus/incidents/alert_filer.py files them), how long
after the storm the last alert was filed, and the server's CPU and peak RSS.

    .venv/bin/python bench/storm.py                       # 10,000 alerts in 60 s, 2,500 fingerprints
    .venv/bin/python bench/storm.py --alerts 2000 --seconds 20 --json
    .venv/bin/python bench/storm.py --replicas 2          # alerts to the leader, reads from the follower
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stage"))

import httpx  # noqa: E402
import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from stage.localstack.argus_cli import ARGUS, argus_env, create_token, wait_answers, wait_healthy  # noqa: E402
from stage.localstack.ports import free_port  # noqa: E402
from stage.localstack.webhook_receiver import WebhookReceiver  # noqa: E402

CATEGORIES = ("gpu_hardware", "host_oom", "disk_full", "nccl_error", "node_lost")
SEVERITIES = ("warning", "critical")


def alert(fp: int, nodes: int) -> dict[str, Any]:
    """Distinct alert number `fp`: its name, node and labels stay the same each time it fires."""
    node = fp % nodes
    name = f"StormRule{fp // nodes:03d}"
    ip = f"10.{node // 250 % 250}.{node % 250}.{fp % 7 + 1}"
    return {"status": "firing", "startsAt": datetime.now(timezone.utc).isoformat(), "fingerprint": f"{fp:016x}",
            "labels": {"alertname": name, "category": CATEGORIES[fp % len(CATEGORIES)],
                       "severity": SEVERITIES[fp % 2], "node_ip": ip, "instance": f"{ip}:9400",
                       "job": "dcgm-exporter"},
            "annotations": {"summary": f"{name} fires on {ip}"}}


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = self.accepted = self.queued = 0
        self.refused: dict[str, int] = {}
        self.post_ms: list[float] = []
        self.read_ms: list[float] = []
        self.filing_read_ms: list[float] = []  # reads after the storm, while the filer works through the queue
        self.filing = False
        self.read_errors = 0
        self.read_ms_by_path: dict[str, list[float]] = {}  # during the storm, each path the readers read


def sender(url: str, token: str, batches: list[list[dict[str, Any]]], start: float, every_s: float,
           tally: Tally) -> None:
    with httpx.Client(timeout=60, headers={"authorization": f"Bearer {token}"}) as client:
        for i, batch in enumerate(batches):
            delay = start + i * every_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = {"version": "4", "status": "firing", "receiver": "argus", "groupKey": f"storm/{i}",
                    "alerts": batch}
            began = time.perf_counter()
            try:
                answer = client.post(f"{url}/v1/alerts/alertmanager", json=body)
                # 200: filed in the request; 202: queued (it waits in the store's alert inbox for the filer)
                why = None if answer.status_code in (200, 202) else f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                answer, why = None, type(exc).__name__
            took = (time.perf_counter() - began) * 1000
            with tally.lock:
                tally.sent += len(batch)
                tally.post_ms.append(took)
                if why is None and answer is not None:
                    tally.accepted += len(batch)
                    tally.queued += answer.json()["queued"]
                else:
                    tally.refused[str(why)] = tally.refused.get(str(why), 0) + len(batch)


def reader(url: str, token: str, stop: threading.Event, tally: Tally, every_s: float) -> None:
    paths = ["/v1/incidents?limit=50", "/v1/health", "/v1/incidents?state=open&limit=20"]
    with httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}"}) as client:
        i = 0
        while not stop.is_set():
            began = time.perf_counter()
            try:
                ok = client.get(url + paths[i % len(paths)]).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = (time.perf_counter() - began) * 1000
            with tally.lock:
                if ok:
                    (tally.filing_read_ms if tally.filing else tally.read_ms).append(took)
                    if not tally.filing:
                        tally.read_ms_by_path.setdefault(paths[i % len(paths)], []).append(took)
                else:
                    tally.read_errors += 1
            i += 1
            stop.wait(every_s)


def read_apart(url: str, token: str, readers: int, every_s: float, stop: Any, filing: Any, out: Any) -> None:
    """The readers, in a process of their own: what a person's browser or the ops agent measures. In the senders'
    process they also timed that process's own interpreter, busy encoding the storm's batches and receiving its IM
    messages, and called that the server's latency."""
    tally = Tally()
    done = threading.Event()
    threads = [threading.Thread(target=reader, args=(url, token, done, tally, every_s)) for _ in range(readers)]
    for thread in threads:
        thread.start()
    while not stop.wait(0.1):
        tally.filing = filing.is_set()
    done.set()
    for thread in threads:
        thread.join()
    out.put((tally.read_ms, tally.filing_read_ms, tally.read_errors, tally.read_ms_by_path))


def wait_filed(url: str, token: str, console: Console, *, timeout_s: float) -> float:
    """Seconds until the server's alert inbox is empty (its /v1/health says), with the queue shown as it drains."""
    began = time.monotonic()
    with httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}"}) as client, \
            Progress(TextColumn("filing"), TextColumn("{task.fields[queued]} alerts queued"), TimeElapsedColumn(),
                     console=console) as progress:
        task = progress.add_task("filing", queued="?")
        while time.monotonic() - began < timeout_s:
            try:
                queued = client.get(f"{url}/v1/health").json().get("alert_inbox", {}).get("queued")
            except httpx.HTTPError:
                queued = None
            progress.update(task, queued=queued)
            if queued == 0:
                break
            time.sleep(0.5)
    return time.monotonic() - began


def serve(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=10_000)
    parser.add_argument("--fingerprints", type=int, default=2_500)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=50, help="alerts per webhook request")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--read-every", type=float, default=0.2, help="seconds between one reader's requests")
    parser.add_argument("--drain-s", type=float, default=30.0, help="how long to count IM messages after the storm")
    parser.add_argument("--file-timeout-s", type=float, default=600.0,
                        help="how long to wait after the storm for the queued alerts to be filed")
    parser.add_argument("--database-url", help="default: SQLite in the temp data dir")
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                        help="2: a leader taking the alerts and a follower the readers read (leader election on)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)

    work = Path(tempfile.mkdtemp(prefix="argus-storm-"))
    receiver = WebhookReceiver().start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = argus_env({
        "ARGUS_DATA_DIR": str(work / "data"), "ARGUS_SHARED_ROOT": str(work / "shared"),
        "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_REQUEST_TIMEOUT_S": "1",
        "ARGUS_NOTIFY_CHANNELS": json.dumps([{"kind": "slack", "url": f"{receiver.url}/slack"}]),
        "ARGUS_WEBHOOK_URLS": json.dumps([f"{receiver.url}/ops-agent"]), "ARGUS_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        **({"ARGUS_DATABASE_URL": args.database_url} if args.database_url else {})})
    try:
        tokens = {role: create_token(env, f"storm-{role}", role) for role in ("operator", "viewer")}
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    servers: list[subprocess.Popen[bytes]] = []
    read_url = url
    try:
        if args.replicas == 1:
            servers.append(serve(env, port, work / "serve.log"))
        else:
            elect = {**env, "ARGUS_LEADER_ELECTION": "true"}
            servers.append(serve({**elect, "ARGUS_REPLICA_ID": "storm-leader"}, port, work / "leader.log"))
            if not (wait_healthy(url, timeout_s=120) and wait_answers(url, "/v1/leader", timeout_s=60)):
                console.print(f"[red]the first replica did not lead; its log: {work / 'leader.log'}")
                return 2
            follower_port = free_port()
            read_url = f"http://127.0.0.1:{follower_port}"
            servers.append(serve({**elect, "ARGUS_REPLICA_ID": "storm-follower"}, follower_port,
                                 work / "follower.log"))
        procs = [psutil.Process(s.pid) for s in servers]
        if not all(wait_healthy(u, timeout_s=120) for u in {url, read_url}):
            console.print(f"[red]argus serve did not answer; its logs: {work}")
            return 2

        fingerprints = [alert(fp, args.nodes) for fp in range(args.fingerprints)]
        stream = [fingerprints[i % args.fingerprints] for i in range(args.alerts)]
        batches = [stream[i:i + args.batch] for i in range(0, len(stream), args.batch)]
        per_sender = [batches[i::args.senders] for i in range(args.senders)]
        every_s = args.seconds / max(1, len(per_sender[0]))
        tally = Tally()
        apart = multiprocessing.get_context("spawn")
        stop, filing, reads = apart.Event(), apart.Event(), apart.Queue()
        readers = apart.Process(target=read_apart, args=(read_url, tokens["viewer"], args.readers, args.read_every,
                                                         stop, filing, reads), daemon=True)
        readers.start()
        cpu_before = [p.cpu_times() for p in procs]
        clients = [psutil.Process(), psutil.Process(readers.pid)]  # this process (senders, IM receiver), the readers
        clients_before = [c.cpu_times() for c in clients]
        rss_peak = 0
        began = time.monotonic()
        senders = [threading.Thread(target=sender, args=(url, tokens["operator"], mine, began + i * every_s /
                                                         args.senders, every_s, tally))
                   for i, mine in enumerate(per_sender)]
        for thread in senders:
            thread.start()
        with Progress(TextColumn("storm"), BarColumn(), TextColumn("{task.completed}/{task.total} alerts"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("storm", total=args.alerts)
            while any(t.is_alive() for t in senders):
                rss_peak = max(rss_peak, *(p.memory_info().rss for p in procs))
                progress.update(task, completed=tally.sent)
                time.sleep(0.5)
            progress.update(task, completed=tally.sent)
        storm_s = time.monotonic() - began
        cpu_after = [p.cpu_times() for p in procs]
        clients_after = [c.cpu_times() for c in clients]
        im_during = sum(1 for r in receiver.received if r["path"] == "/slack")
        # The accepted alerts the filer has not filed yet: wait for the queue to empty, the readers still reading.
        filing.set()
        filed_after_s = wait_filed(url, tokens["viewer"], console, timeout_s=args.file_timeout_s)
        stop.set()
        tally.read_ms, tally.filing_read_ms, tally.read_errors, tally.read_ms_by_path = reads.get(timeout=120)
        readers.join(timeout=30)
        filing_done = time.monotonic() - began
        console.print(f"storm over in {storm_s:.1f} s, all filed {filed_after_s:.1f} s after it; counting IM "
                      f"messages for {args.drain_s:.0f} s more")
        time.sleep(args.drain_s)
        rss_peak = max(rss_peak, *(p.memory_info().rss for p in procs))
        incidents = 0
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {tokens['viewer']}"}) as client:
            offset = 0
            while True:
                page = client.get(f"{url}/v1/incidents", params={"limit": 1000, "offset": offset}).json()["items"]
                incidents += len(page)
                offset += len(page)
                if len(page) < 1000:
                    break
        received = receiver.received
        cores = [((a.user - b.user) + (a.system - b.system)) / storm_s
                 for a, b in zip(cpu_after, cpu_before, strict=True)]
        result = {
            "alerts": args.alerts, "fingerprints": args.fingerprints, "seconds": round(storm_s, 1),
            "sent": tally.sent, "accepted": tally.accepted, "refused": tally.refused,
            "accepted_per_s": round(tally.accepted / storm_s, 1), "queued": tally.queued,
            "filed_after_storm_s": round(filed_after_s, 1),
            "filed_per_s": round(tally.accepted / filing_done, 1),
            "incidents": incidents, "one_per_fingerprint": incidents == args.fingerprints,
            "im_messages_during": im_during, "im_messages_total": sum(1 for r in received if r["path"] == "/slack"),
            "webhook_posts_total": sum(1 for r in received if r["path"] == "/ops-agent"),
            "post_p50_ms": percentile(tally.post_ms, 0.5), "post_p99_ms": percentile(tally.post_ms, 0.99),
            "api_reads": len(tally.read_ms), "api_read_errors": tally.read_errors,
            "api_p50_ms": percentile(tally.read_ms, 0.5), "api_p99_ms": percentile(tally.read_ms, 0.99),
            "api_mean_ms": round(statistics.fmean(tally.read_ms), 1) if tally.read_ms else None,
            "api_p99_ms_while_filing": percentile(tally.filing_read_ms, 0.99),
            "api_p99_ms_by_path": {path: percentile(ms, 0.99) for path, ms in sorted(tally.read_ms_by_path.items())},
            "replicas": args.replicas, "read_from": "the only replica" if args.replicas == 1 else "the follower",
            "server_cores": round(sum(cores), 2), "server_cores_each": [round(c, 2) for c in cores],
            "server_rss_mib": round(rss_peak / 2**20, 1),
            # the bench's own share of the same cores during the storm (a real Alertmanager and readers run elsewhere)
            "client_cores": round(sum((a.user - b.user) + (a.system - b.system)
                                      for a, b in zip(clients_after, clients_before, strict=True)) / storm_s, 2),
        }
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
        receiver.stop()
    if args.json:
        print(json.dumps(result))
    else:
        table = Table(title=f"alert storm: {args.alerts} alerts, {args.fingerprints} fingerprints")
        table.add_column("figure")
        table.add_column("value", justify="right")
        for key, value in result.items():
            table.add_row(key, str(value))
        Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
