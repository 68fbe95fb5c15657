"""The node agents' fleet: a Ray job that keeps one agent actor on every ALIVE node, and the central's side of it.

The fleet job (`python -m argus.agents.fleet`, submitted by the central Argus through the Jobs API, so the central
never becomes a Ray driver itself and cannot be taken down with one) reconciles every `ARGUS_AGENT_RECONCILE_S`:
- each ALIVE node has a detached actor `argus-node-agent-<node id>` in the `argus` namespace, pinned to it (node
  affinity, hard), reserving no CPU; a node that joins (or rejoins under a new id) gets one;
- an agent that does not answer its ping is killed and started again, and the job's log says so (the central sees
  the gap in the agent's heartbeats: `argus_agent_up{node}` 0, and the poller reads the node meanwhile);
- agents of nodes that are gone are gone with them (their names free).
Agents are detached: they outlive the fleet job, which finds them by name when it runs again.

`FleetSupervisor` (a chore of `argus serve` when `node_agents` is on) submits the fleet job when it is not running
and updates `argus_agent_up{node}` from what the inbox heard. The agents authenticate with a `node_agent` token
kept in `<data_dir>/node-agent.token`, created on first use (mode 600): restarts of the central keep it valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

NAMESPACE = "argus"
JOB_PREFIX = "argus-node-agents"
TOKEN_FILE = "node-agent.token"
ENV = {
    "url": "ARGUS_AGENT_CENTRAL_URL",
    "token": "ARGUS_AGENT_TOKEN",
    "interval": "ARGUS_AGENT_INTERVAL_S",
    "kernel_log": "ARGUS_AGENT_KERNEL_LOG",
    "reconcile": "ARGUS_AGENT_RECONCILE_S",
    "history": "ARGUS_AGENT_HISTORY_WINDOW_S",
    "nvml": "ARGUS_AGENT_NVML",
}


def agent_name(node_id: str) -> str:
    return f"argus-node-agent-{node_id}"


# -- the fleet job (runs inside the cluster as a Ray driver) --------------------------------------------------------

def reconcile(ray: Any, agent_cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """One pass: an answering agent on every ALIVE node. Returns what it did."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    started, restarted, healthy = [], [], []
    for node_id, ip in alive.items():
        name = agent_name(node_id)
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            handle = None
        if handle is not None:
            try:
                ray.get(handle.ping.remote(), timeout=15)
                healthy.append(ip)
                continue
            except Exception as exc:  # noqa: BLE001 - a dead or stuck actor: any Ray error means start it again
                print(f"argus fleet: the agent on {ip} ({node_id}) did not answer ({type(exc).__name__}); "
                      "starting it again", flush=True)
                ray.kill(handle, no_restart=True)
                restarted.append(ip)
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        actor = agent_cls.options(name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                                  max_concurrency=4, scheduling_strategy=strategy).remote(
            node_id=node_id, node_ip=ip, **options)
        ray.get(actor.start.remote(), timeout=60)
        if handle is None:
            started.append(ip)
    return {"alive": len(alive), "healthy": healthy, "started": started, "restarted": restarted}


def stop_agents(ray: Any) -> list[str]:
    """Kill every node agent of the cluster (their names free); the names of those killed."""
    from ray.util import list_named_actors

    killed = []
    for entry in list_named_actors(all_namespaces=True):
        if entry.get("namespace") == NAMESPACE and str(entry.get("name", "")).startswith(agent_name("")):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=NAMESPACE), no_restart=True)
                killed.append(entry["name"])
            except ValueError:
                continue  # gone meanwhile
    return killed


def main(argv: list[str] | None = None) -> int:
    """The fleet job's entrypoint (`stop` as the argument kills every agent); configuration comes in ENV."""
    import ray

    from argus.agents.node_agent import NodeAgent

    if (argv if argv is not None else sys.argv[1:]) == ["stop"]:
        ray.init(address="auto", namespace=NAMESPACE)
        print(f"argus fleet: stopped {len(stop_agents(ray))} node agent(s)", flush=True)
        return 0

    url, token = os.environ.get(ENV["url"]), os.environ.get(ENV["token"])
    if not url or not token:
        print(f"argus fleet: set {ENV['url']} and {ENV['token']} (argus serve does, when node_agents is on)",
              file=sys.stderr)
        return 2
    options = {"central_url": url, "token": token,
               "interval_s": float(os.environ.get(ENV["interval"], "1.0")),
               "kernel_log": os.environ.get(ENV["kernel_log"], "auto"),
               "history_window_s": float(os.environ.get(ENV["history"], "900")),
               "nvml": os.environ.get(ENV["nvml"], "1") == "1"}
    every = float(os.environ.get(ENV["reconcile"], "5"))
    ray.init(address="auto", namespace=NAMESPACE)
    agent_cls = ray.remote(NodeAgent)
    while True:
        try:
            done = reconcile(ray, agent_cls, options)
            if done["started"] or done["restarted"]:
                print(f"argus fleet: {json.dumps(done)}", flush=True)
        except Exception as exc:  # noqa: BLE001 - the fleet must outlive one failed pass; the next one retries
            print(f"argus fleet: reconcile failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        time.sleep(every)


# -- the central's side ---------------------------------------------------------------------------------------------

def agent_token(store: Any, data_dir: Path) -> str:
    """The node agents' token: read from `<data_dir>/node-agent.token`, or created (role node_agent) and kept there."""
    path = Path(data_dir) / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if store.verify_token(token) is not None:
            return token
        logger.warning("the node agents' token in {} is unknown to the store (revoked, or another database): "
                       "making a new one", path)
    name = f"node-agents-{hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]}"
    _, token = store.create_token(name, "node_agent", created_by="argus serve")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


class FleetSupervisor:
    """Keeps the fleet job running (submits it through the Jobs API when it is not) and publishes which nodes
    agents cover. `jobs`: a ray.job_submission.JobSubmissionClient-like client."""

    def __init__(self, jobs: Callable[[], Any], *, central_url: str, token: str, inbox: Any,
                 metrics: Any | None = None, interval_s: float = 1.0, kernel_log: str = "auto",
                 history_window_s: float = 900.0, reconcile_s: float = 5.0, nvml: bool = True) -> None:
        self._jobs = jobs
        self.inbox = inbox
        self.metrics = metrics
        self.env = {ENV["url"]: central_url, ENV["token"]: token, ENV["interval"]: str(interval_s),
                    ENV["kernel_log"]: kernel_log, ENV["reconcile"]: str(reconcile_s),
                    ENV["history"]: str(history_window_s), ENV["nvml"]: "1" if nvml else "0"}
        self.submission_id: str | None = None
        self.submissions = 0

    def ensure(self) -> None:
        """One pass: the fleet job runs (submitted again if it ended), and the gauges say who covers what."""
        client = self._jobs()
        if self.submission_id is None:  # a fleet job an earlier run of the central submitted may still run
            running = [j for j in client.list_jobs() if (j.metadata or {}).get("argus") == "node-agents"
                       and str(j.status).split(".")[-1] in ("PENDING", "RUNNING")]
            if running:
                self.submission_id = running[0].submission_id
                logger.info("the node agents' fleet job {} is running: keeping it", self.submission_id)
        if self.submission_id is not None:
            status = str(client.get_job_status(self.submission_id)).split(".")[-1]
            if status in ("PENDING", "RUNNING"):
                self._publish()
                return
            logger.warning("the node agents' fleet job {} is {}; submitting it again (its log: ray job logs {})",
                           self.submission_id, status, self.submission_id)
        self.submission_id = f"{JOB_PREFIX}-{int(time.time())}"
        client.submit_job(entrypoint=f"{sys.executable} -m argus.agents.fleet", submission_id=self.submission_id,
                          runtime_env={"env_vars": self.env},
                          metadata={"argus": "node-agents"})
        self.submissions += 1
        logger.info("submitted the node agents' fleet job {}", self.submission_id)
        self._publish()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the fleet job and every agent it placed (a job of its own kills them: the central is no driver)."""
        client = self._jobs()
        if self.submission_id is not None:
            client.stop_job(self.submission_id)
        stopper = client.submit_job(entrypoint=f"{sys.executable} -m argus.agents.fleet stop",
                                    metadata={"argus": "node-agents-stop"})
        deadline = time.monotonic() + timeout_s
        while str(client.get_job_status(stopper)).split(".")[-1] in ("PENDING", "RUNNING"):
            if time.monotonic() > deadline:
                logger.warning("stopping the node agents did not finish in {} s (job {})", timeout_s, stopper)
                return
            time.sleep(0.5)

    def _publish(self) -> None:
        if self.metrics is None:
            return
        covered = self.inbox.covered()
        for agent in self.inbox.agents():
            self.metrics.set_agent_up(agent.node_ip, agent.node_id in covered)


if __name__ == "__main__":
    sys.exit(main())
