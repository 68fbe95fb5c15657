"""Fan-in of node agents into one central Argus: the real endpoint, the real agent code, many simulated nodes.

- The central: `create_app` with a node-agent inbox under uvicorn, in a process of its own (so its CPU and RSS are
  its own), and a loop that every --tick seconds takes the inbox into the Ray log collector's `from_agents` and the
  log rules' detector, as `argus serve` does. It times each fault line from the `ts=` its writer stamped into it to
  the detector's pass over it (a node's first fault is its finding there; later ones fold into it), and counts every
  fault line it received.
- The nodes: --nodes NodeAgent instances (argus/agents/node_agent.py) spread over --agent-procs processes, each with
  its own Ray-like log folder under a temp dir, reading and sending every --interval seconds.
- The load: a writer appends NCCL INFO noise and step lines to the nodes' driver and raylet logs at --mb-per-min in
  all, a fault line (a host OOM kill, stamped ts= and a sequence number) to a random node every --fault-every
  seconds, and once a --burst-mb burst of noise (with a fault line at its end) to one node.
- A central restart: after --restart-at seconds the central is killed and started again --down-s later; the fault
  lines written meanwhile must all arrive (the agents keep them).

- `--mode poller`: the same nodes, load and restart without agents: the central is RayLogsCollector reading every
  node's files over HTTP by byte range (what `argus serve` does where no agent runs) and the log rules' detector,
  against a stand-in for Ray's dashboard and its per-node log routes (aiohttp, Range as Ray's agent serves it; its
  own CPU is printed apart, it is the network, not Argus).

Prints line-to-finding p50/p95, the central's CPU (cores, mean over the run) and peak RSS, fault lines written,
received and lost, and an idle agent's CPU and RSS (one agent process with one agent, nothing written). Goals
(issue 17): p95 <= 5 s, central <= 1 core and <= 1 GiB, 0 lines lost, an idle agent <= 2% of a core and
<= 150 MiB. Not a test: figures depend on the machine. Here every simulated node's agent shares the machine with the
central and the writer (1,250 agents in two processes on a 2-core machine), so the first seconds, while 1,250 agents
learn their streams' gates, and the seconds around the restart make the tail; `worst_latency_by_10s` shows where.

    .venv/bin/python bench/fanin.py --restart-at 60 [--json]                        # 1,250 nodes, 2 GB/min, 500 MB
    .venv/bin/python bench/fanin.py --mode poller --restart-at 60                    # the same, read over HTTP
    .venv/bin/python bench/fanin.py --nodes 200 --mb-per-min 200 --seconds 60 [--json]

One script past 400 lines on purpose: the central, the agents, the poller with its stand-in and the writer are the
processes of one experiment, sharing its fault stamps and its record of what arrived; apart, each would restate them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

FAULT = re.compile(r"fault=(\d+) ts=([\d.]+)")
NOISE = "node{n}:1234:5678 [{r}] NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {q}[{q}] via P2P/CUMEM/read\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the central process ----------------------------------------------------------------------------------------

def central_main(port: int, work: str, tick: float, out: str, token_file: str) -> None:
    import uvicorn

    from argus.agents.inbox import AgentInbox
    from argus.api.app import create_app
    from argus.store.store import Store
    from collectors.offsets import OffsetStore
    from collectors.ray_logs import RayLogsCollector
    from detectors.engine import load_rules
    from detectors.log_rules import LogRuleDetector

    store = Store(f"sqlite:///{work}/central.db")
    token_path = Path(token_file)
    if not token_path.exists():
        _, token = store.create_token(f"bench-{port}", "node_agent", created_by="bench")
        token_path.write_text(token)
    inbox = AgentInbox()
    app = create_app(store=store, node_agents=inbox)
    collector = RayLogsCollector("http://127.0.0.1:9", OffsetStore(Path(work) / "offsets.json"))
    detector = LogRuleDetector(load_rules())
    try:  # what the central received before a restart (the bench's own record, not Argus's state)
        received: dict[str, float] = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        received = {}

    def loop() -> None:
        while True:
            time.sleep(tick)
            signals = collector.from_agents(inbox.take(), datetime.now(timezone.utc))
            detector.detect(signals)  # as the pipeline does; the finding per line is what is timed below
            now = time.time()
            for s in signals:
                m = FAULT.search(s.text or "")
                if m and m.group(1) not in received:
                    received[m.group(1)] = [float(m.group(2)), now - float(m.group(2))]  # written at, latency
            Path(out).write_text(json.dumps(received))

    threading.Thread(target=loop, daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the HTTP poller at the same load (--mode poller) ------------------------------------------------------------

def dashboard_main(dirs: list[str], ready: Any) -> None:
    """A stand-in for the network the poller reads through (not Argus): Ray's dashboard routes it calls on the head
    (node summary, jobs, the log listing) and every node's dashboard-agent log route, which serves the node's files
    with HTTP Range as Ray's agent does (aiohttp static files). Each node is 127.0.0.1 at a port of its own, bound
    here (port 0: the system picks free ones); the dashboard's port is put on `ready`."""
    import asyncio

    from aiohttp import web

    folders = [Path(d) for d in dirs]
    by_id = {f"node{i:05d}": folder for i, folder in enumerate(folders)}
    by_port: dict[int, Path] = {}
    summary: dict[str, Any] = {"data": {"summary": []}}

    async def node_summary(_: web.Request) -> web.Response:
        return web.json_response(summary)

    async def jobs(_: web.Request) -> web.Response:
        return web.json_response([])

    async def list_logs(request: web.Request) -> web.Response:
        folder = by_id[request.query["node_id"]]
        return web.json_response({"data": {"result": {"all": sorted(os.listdir(folder))}}})

    async def log_file(request: web.Request) -> web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        path = by_port[port] / request.match_info["name"]
        return web.FileResponse(path) if path.is_file() else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/nodes", node_summary)
    app.router.add_get("/api/jobs/", jobs)
    app.router.add_get("/api/v0/logs", list_logs)
    app.router.add_get("/logs/{name}", log_file)

    def bound_port(site: web.TCPSite) -> int:
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for node_id, folder in by_id.items():
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = bound_port(site)
            by_port[port] = folder
            summary["data"]["summary"].append(
                {"ip": "127.0.0.1", "raylet": {"nodeId": node_id, "state": "ALIVE", "dashboardAgentListenPort": port}})
        head = web.TCPSite(runner, "127.0.0.1", 0)
        await head.start()
        ready.put(bound_port(head))
        await asyncio.Event().wait()

    asyncio.run(serve())


def poller_main(dashboard_url: str, work: str, tick: float, out: str) -> None:
    """The central as it runs without agents: RayLogsCollector reads every node's files over HTTP each tick (its
    defaults: 200 reads a poll, 2 MB a read), the log rules' detector reads what it got; timed like central_main."""
    from collectors.offsets import OffsetStore
    from collectors.ray_logs import RayLogsCollector
    from detectors.engine import load_rules
    from detectors.log_rules import LogRuleDetector

    collector = RayLogsCollector(dashboard_url, OffsetStore(Path(work) / "poller-offsets.json"))
    detector = LogRuleDetector(load_rules())
    try:
        received: dict[str, Any] = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        received = {}
    while True:
        began = time.time()
        try:
            signals = collector.collect()
        except Exception as exc:  # the stand-in starting: try again next tick
            print(f"poller: {exc}", file=sys.stderr)
            signals = []
        detector.detect(signals)
        collector.commit()  # after detection, as the loop commits after filing
        now = time.time()
        for s in signals:
            m = FAULT.search(s.text or "")
            if m and m.group(1) not in received:
                received[m.group(1)] = [float(m.group(2)), now - float(m.group(2))]
        Path(out).write_text(json.dumps(received))
        time.sleep(max(0.0, tick - (time.time() - began)))


# -- the agent processes ------------------------------------------------------------------------------------------

def agents_main(url: str, token_file: str, dirs: list[str], interval: float, stop_at: float) -> None:
    from argus.agents.node_agent import NodeAgent
    from detectors.engine import load_rules

    while not Path(token_file).exists():
        time.sleep(0.1)
    token = Path(token_file).read_text().strip()
    rules = load_rules()
    agents = [NodeAgent(node_id=f"node-{Path(d).parent.name}",
                        node_ip=f"10.{i // 65025 % 256}.{i // 255 % 255}.{i % 255 + 1}", central_url=url,
                        token=token, logs_dir=d, kernel_log="off", interval_s=interval, rules=rules,
                        state_dir=str(Path(d).parent / "agent"), nvml=False)  # simulated nodes have no GPU
              for i, d in enumerate(dirs)]
    for a in agents:
        a.start()
    Path(token_file).with_suffix(f".ready-{os.getpid()}").touch()  # the writer waits for every agent to run
    while time.time() < stop_at:
        time.sleep(0.5)
    for a in agents:
        a._stop.set()


# -- the writer ---------------------------------------------------------------------------------------------------

def write_load(dirs: list[Path], mb_per_min: float, fault_every: float, seconds: float, burst_mb: float,
               written: list[int]) -> None:
    rng = random.Random(7)
    bytes_per_s = mb_per_min * 1e6 / 60
    noise = [NOISE.format(n=i % 8, r=i % 8, q=(i + 1) % 8, c=i % 32) for i in range(64)]
    chunk = "".join(noise)
    end = time.time() + seconds
    next_fault = time.time() + 2
    fault = 0
    burst_at = time.time() + seconds / 3
    while time.time() < end:
        began = time.time()
        budget = bytes_per_s * 0.5
        while budget > 0:
            d = dirs[rng.randrange(len(dirs))]
            with (d / "job-driver-raysubmit_1.log").open("a") as f:
                f.write(chunk)
            budget -= len(chunk)
        if burst_mb and time.time() >= burst_at:
            burst_at = float("inf")
            target = dirs[0] / "job-driver-raysubmit_1.log"
            with target.open("a") as f:
                for _ in range(int(burst_mb * 1e6 / len(chunk))):
                    f.write(chunk)
            fault += 1
            with (dirs[0] / "raylet.out").open("a") as f:
                f.write(f"[E] Out of memory: Killed process 4242 (python) fault={fault} ts={time.time():.3f}\n")
            written.append(fault)
        while time.time() >= next_fault:
            fault += 1
            d = dirs[rng.randrange(len(dirs))]
            with (d / "raylet.out").open("a") as f:
                f.write(f"[E] Out of memory: Killed process 4242 (python) fault={fault} ts={time.time():.3f}\n")
            written.append(fault)
            next_fault += fault_every
        time.sleep(max(0.0, 0.5 - (time.time() - began)))


def idle_agent(url: str, token_file: str, work: Path, seconds: float = 10.0) -> tuple[float, float]:
    """CPU (% of a core) and RSS (MiB) of one agent process with one agent and nothing written."""
    d = work / "idle" / "logs"
    d.mkdir(parents=True)
    (d / "raylet.out").write_text("")
    proc = mp.Process(target=agents_main, args=(url, token_file, [str(d)], 1.0, time.time() + seconds + 5))
    proc.start()
    ps = psutil.Process(proc.pid)
    time.sleep(3)  # imports and start
    before = ps.cpu_times()
    time.sleep(seconds)
    after = ps.cpu_times()
    rss = ps.memory_info().rss / 2**20
    proc.join(timeout=15)
    return 100 * ((after.user + after.system) - (before.user + before.system)) / seconds, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--agent-procs", type=int, default=2)
    parser.add_argument("--mb-per-min", type=float, default=2048.0)
    parser.add_argument("--burst-mb", type=float, default=500.0)
    parser.add_argument("--fault-every", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--restart-at", type=float, default=30.0)
    parser.add_argument("--down-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=30.0,
                        help="after the load, wait until nothing new arrives for this long")
    parser.add_argument("--mode", choices=["agents", "poller"], default="agents",
                        help="agents: node agents push to the central; poller: the central reads every node over HTTP")
    parser.add_argument("--work-dir", help="the simulated nodes' folders (default: /dev/shm, else the temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    # The nodes' log folders and their agents' saved offsets: on tmpfs where there is one, as each real node has a disk
    # of its own; 1,250 agents fsyncing their offsets every second on one shared disk would measure that disk.
    shm = Path("/dev/shm")
    parent = args.work_dir or (shm if os.access(shm, os.W_OK) else None)
    work = Path(tempfile.mkdtemp(prefix="argus-fanin-", dir=parent))
    dirs = []
    for i in range(args.nodes):
        d = work / f"n{i:05d}" / "logs"
        d.mkdir(parents=True)
        (d / "raylet.out").write_text("")
        (d / "job-driver-raysubmit_1.log").write_text("")
        dirs.append(d)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out, token_file = str(work / "received.json"), str(work / "token")

    stand_in: mp.Process | None = None
    if args.mode == "poller":
        ready: Any = mp.Queue()
        stand_in = mp.Process(target=dashboard_main, args=([str(d) for d in dirs], ready), daemon=True)
        stand_in.start()
        port = ready.get(timeout=120)  # the stand-in dashboard's
        url = f"http://127.0.0.1:{port}"
    stand_in_began = time.time()

    def start_central() -> mp.Process:
        if args.mode == "poller":
            p = mp.Process(target=poller_main, args=(url, str(work), args.tick, out), daemon=True)
        else:
            p = mp.Process(target=central_main, args=(port, str(work), args.tick, out, token_file), daemon=True)
        p.start()
        return p

    central = start_central()
    stop_at = time.time() + args.seconds + 3600  # the agents run until killed below
    groups = [dirs[i::args.agent_procs] for i in range(args.agent_procs)] if args.mode == "agents" else []
    agent_procs = [mp.Process(target=agents_main, args=(url, token_file, [str(d) for d in g], args.interval, stop_at),
                              daemon=True) for g in groups]
    for p in agent_procs:
        p.start()
    console.print(f"{args.nodes} simulated nodes, mode {args.mode} ({len(agent_procs)} agent processes); "
                  f"central pid {central.pid}")
    # imports, every agent started (creating 1,250 takes a while on 2 cores) and its first read of the empty folder:
    # a file's first sight is read line by line and dated (its backlog), not what this bench measures
    while len(list(work.glob("token.ready-*"))) < len(agent_procs):
        time.sleep(0.5)
    time.sleep(3)
    written: list[int] = []
    writer = threading.Thread(target=write_load, args=(dirs, args.mb_per_min, args.fault_every, args.seconds,
                                                       args.burst_mb, written), daemon=True)
    began = time.time()
    writer.start()
    cpu_s, rss_max, restarted = 0.0, 0.0, False
    outage = (float("inf"), float("inf"))  # from the kill until the central answers again
    ps = psutil.Process(central.pid)
    last_cpu = sum(ps.cpu_times()[:2])
    while writer.is_alive():
        time.sleep(1)
        try:
            cpu = sum(ps.cpu_times()[:2])
            cpu_s += cpu - last_cpu
            last_cpu = cpu
            rss_max = max(rss_max, ps.memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            pass
        if not restarted and time.time() - began >= args.restart_at:
            restarted = True
            console.print(f"killing the central at {time.time() - began:.0f} s; back in {args.down_s:.0f} s")
            killed_at = time.time()
            central.kill()
            central.join()
            time.sleep(args.down_s)
            central = start_central()
            while args.mode == "agents":  # the poller has no port: it reads as soon as it runs
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            outage = (killed_at, time.time())
            ps = psutil.Process(central.pid)
            last_cpu = sum(ps.cpu_times()[:2])
    ran = time.time() - began
    # wait for the agents to catch up: until every fault arrived, or nothing new arrived for --drain-s
    received: dict[str, Any] = {}
    last_count, last_change = -1, time.time()
    while time.time() - last_change < args.drain_s:
        try:
            received = json.loads(Path(out).read_text())
        except (OSError, ValueError):
            received = {}
        if all(str(f) in received for f in written):
            break
        if len(received) != last_count:
            last_count, last_change = len(received), time.time()
        time.sleep(1)
    # faults written while the central was down (or starting again) wait for it by design: timed apart
    down = [(t, lat) for t, lat in received.values() if outage[0] <= t <= outage[1]]
    latencies = sorted(lat for t, lat in received.values() if not outage[0] <= t <= outage[1])
    lost = [f for f in written if str(f) not in received]
    # the worst latency of the faults written in each 10 s of the run: where a tail comes from (the burst, the restart)
    by_window: dict[int, float] = {}
    for t, lat in received.values():
        window = int((t - began) // 10) * 10
        by_window[window] = max(by_window.get(window, 0.0), lat)
    stand_in_cores = None
    if stand_in is not None:
        stand_in_ps = psutil.Process(stand_in.pid)
        stand_in_cores = round(sum(stand_in_ps.cpu_times()[:2]) / (time.time() - stand_in_began), 3)
        stand_in.kill()
    idle_cpu, idle_rss = idle_agent(url, token_file, work) if args.mode == "agents" else (None, None)
    central.kill()
    for p in agent_procs:
        p.kill()
    shutil.rmtree(work, ignore_errors=True)  # gigabytes of simulated logs, maybe in RAM (tmpfs)
    figures: dict[str, Any] = {
        "nodes": args.nodes, "mb_per_min": args.mb_per_min, "burst_mb": args.burst_mb, "seconds": round(ran, 1),
        "faults_written": len(written), "faults_received": len(written) - len(lost),
        "lost": len(lost),  # not arrived once nothing more arrived for --drain-s
        "p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 2) if latencies else None,
        "max_s": round(latencies[-1], 2) if latencies else None,
        "outage_s": round(outage[1] - outage[0], 1) if restarted else None,
        "faults_in_outage": len(down),
        "outage_p95_s": round(sorted(lat for _, lat in down)[int(0.95 * (len(down) - 1))], 2) if down else None,
        "central_cores": round(cpu_s / ran, 3), "central_rss_mib": round(rss_max, 1),
        "idle_agent_cpu_pct": round(idle_cpu, 2) if idle_cpu is not None else None,
        "idle_agent_rss_mib": round(idle_rss, 1) if idle_rss is not None else None,
        "stand_in_dashboard_cores": stand_in_cores,  # poller mode: the network's stand-in, not Argus
        "central_restarted": restarted,
        "burst_at_s": round(args.seconds / 3), "restart_at_s": args.restart_at if restarted else None,
        "worst_latency_by_10s": {f"{w}s": round(lat, 1) for w, lat in sorted(by_window.items())},
    }
    who = "node agents -> central" if args.mode == "agents" else "HTTP poller"
    table = Table(title=f"{who}: {args.nodes} nodes, {args.mb_per_min:g} MB/min, "
                        f"{args.burst_mb:g} MB burst, central restarted once")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    goals = {"p95_s": "<= 5", "central_cores": "<= 1", "central_rss_mib": "<= 1024", "lost": "0",
             "idle_agent_cpu_pct": "<= 2", "idle_agent_rss_mib": "<= 150"}
    for key, value in figures.items():
        table.add_row(key, str(value), goals.get(key, ""))
    console.print(table)
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
