"""The node manager: register, join, drain, take offline and probe GPU nodes over SSH.

Every step checks the state machine first (an out-of-order step is an InputError and runs nothing),
acts over SSH, confirms the effect with Ray's own node list, records the transition with who and why,
and returns a NodeOutcome. Failures of the node or the network are outcomes (ok=False, node moved to
failed), not exceptions; a caller's mistake (unknown node, illegal step, hostile value) raises.

Ray knows a joined node by the label `argus.io/node=<name>` that join sets, so Argus finds its own node
in Ray's list even when several Ray nodes share one IP or host.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loguru import logger

from control import commands
from control.nodes import NodeRecord, NodeRegistry, NodeSpec, NodeState, transition
from control.ssh import CommandOutcome, CommandRunner, SshRunner
from core.errors import ArgusError, Conflict, SourceUnavailable
from core.ray_labels import NODE_LABEL, POOL_LABEL, WORKER_RESOURCE
from core.types import utcnow

NVIDIA_SMI_ABSENT = 127  # the shell's "command not found"


@dataclass(frozen=True)
class NodeOutcome:
    """What one step did to one node."""

    node: str
    action: str  # register, join, undrain, drain, offline, probe, reset
    ok: bool
    state: NodeState
    message: str
    hint: str | None = None
    ray_node_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    commands: tuple[CommandOutcome, ...] = ()
    at: datetime = field(default_factory=utcnow)


def node_labels(spec: NodeSpec) -> dict[str, str]:
    """The Ray labels join gives the node: its own, its name, and its pool under the key a JobSpec's pool selects.

    Argus's keys come last: a spec's `labels` cannot rename the node or move it into another pool."""
    return {**spec.labels, NODE_LABEL: spec.name, **({POOL_LABEL: spec.pool} if spec.pool else {})}


def node_resources(spec: NodeSpec) -> dict[str, float]:
    """The custom Ray resources join gives the node: one `worker` (what job drivers ask for) and the spec's."""
    return {WORKER_RESOURCE: 1, **spec.resources}


def default_runner_factory(spec: NodeSpec) -> CommandRunner:
    return SshRunner(spec, connect_timeout_s=15.0, command_timeout_s=180.0)


class NodeManager:
    def __init__(
        self,
        registry: NodeRegistry,
        runner_factory: Callable[[NodeSpec], CommandRunner] = default_runner_factory,
        *,
        gcs_address: str,
        dashboard_url: str,
        clock: Callable[[], datetime] = utcnow,
        join_timeout_s: float = 120.0,
        offline_timeout_s: float = 60.0,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.registry = registry
        self.runner_factory = runner_factory
        self.gcs_address = commands.check_gcs_address(gcs_address)
        self.dashboard_url = dashboard_url.rstrip("/")
        self.clock = clock
        self.join_timeout_s = join_timeout_s
        self.offline_timeout_s = offline_timeout_s
        self.poll_interval_s = poll_interval_s

    # -- steps ---------------------------------------------------------------------------------------

    def register(self, spec: NodeSpec, *, actor: str, reason: str = "registered") -> NodeOutcome:
        record = self.registry.add(spec, actor=actor, reason=reason)
        return self._outcome(record, "register", True, f"node {spec.name} registered; join it next")

    def reset(self, name: str, *, actor: str, reason: str) -> NodeOutcome:
        """offline/failed -> pending, so the node can be joined again."""
        record = self._move(self.registry.get(name), NodeState.PENDING, actor, reason)
        return self._outcome(record, "reset", True, f"node {name} is pending again; join it next")

    def join(self, name: str, *, actor: str, reason: str = "join") -> NodeOutcome:
        record = self.registry.get(name)
        transition(record.state, NodeState.ONLINE)
        try:
            already = self._ray_node(name)
        except ArgusError as exc:
            return self._fail(record, "join", actor, f"join of {name} failed: {exc.message}", hint=exc.hint)
        if already is not None:
            return self._fail(record, "join", actor,
                              f"Ray already lists a live node for {name} ({already['node_id']})",
                              hint="take the node offline first, then reset and join it")
        return self._start_ray(record, "join", actor, reason)

    def undrain(self, name: str, *, actor: str, reason: str = "undrain") -> NodeOutcome:
        """draining -> online. Ray cannot cancel a drain, so the node joins again once Ray has let it go.

        While Ray still lists the node ALIVE (busy work finishing under the drain) this refuses with
        Conflict and changes nothing; otherwise leftovers of the old node are stopped and Ray started anew."""
        record = self.registry.get(name)
        if record.state is not NodeState.DRAINING:  # pending -> online is legal, but that is a join
            raise Conflict(f"node {name} is {record.state.value}, not draining: there is no drain to undo",
                           hint="join a pending node; reset an offline or failed one, then join it")
        try:
            still = self._ray_node(name)
        except ArgusError as exc:
            return self._fail(record, "undrain", actor, f"undrain of {name} failed: {exc.message}", hint=exc.hint)
        if still is not None:
            raise Conflict(
                f"Ray still runs work on node {name} ({still['node_id']}) under the drain and cannot cancel it",
                hint="wait until its work ends (Ray then ends the node) and undrain again, or take it offline",
            )
        spec = record.spec
        cleanup = self._runner(spec).run(commands.offline(spec.ray_temp_dir, ray_bin=spec.ray_bin, grace_s=15),
                                         timeout_s=75)
        if not cleanup.ok:
            return self._fail(record, "undrain", actor,
                              f"stopping the drained Ray processes on {name} failed: {cleanup.describe()}",
                              hint="log in to the node and stop its Ray processes by hand", commands=(cleanup,))
        return self._start_ray(record, "undrain", actor, reason, earlier=(cleanup,))

    def _start_ray(self, record: NodeRecord, action: str, actor: str, reason: str, *,
                   earlier: tuple[CommandOutcome, ...] = ()) -> NodeOutcome:
        """Start Ray on the node with its labels and resources, wait until Ray lists it ALIVE, move it online."""
        name, spec = record.name, record.spec
        try:
            argv = commands.ray_start_for(spec, self.gcs_address, node_resources(spec), node_labels(spec),
                                          timeout_s=int(self.join_timeout_s))
            result = self._runner(spec).run(argv, timeout_s=self.join_timeout_s + 15)
            ran = (*earlier, result)
            if not result.ok:
                return self._fail(record, action, actor, f"ray start on {name} failed: {result.describe()}",
                                  hint="read the error above; check that the node reaches the GCS at "
                                       f"{self.gcs_address} and that ray_bin={spec.ray_bin} exists there",
                                  commands=ran)
            node = self._wait_ray(name, alive=True, timeout_s=self.join_timeout_s)
        except ArgusError as exc:
            return self._fail(record, action, actor, f"{action} of {name} failed: {exc.message}", hint=exc.hint)
        if node is None:
            return self._fail(record, action, actor,
                              f"ray start on {name} returned but Ray did not list the node ALIVE "
                              f"within {self.join_timeout_s:.0f} s",
                              hint="read the node's raylet.out/raylet.err under its Ray temp dir",
                              commands=ran)
        record = self.registry.record_transition(name, record.state, NodeState.ONLINE, actor=actor,
                                                 reason=reason, ray_node_id=node["node_id"])
        logger.info("node {} {}: Ray lists it as {}", name, "joined" if action == "join" else action,
                    node["node_id"])
        return self._outcome(record, action, True, f"node {name} is ALIVE in Ray as {node['node_id']}",
                             ray_node_id=node["node_id"], data={"ray": _brief(node)}, commands=ran)

    def drain(self, name: str, *, actor: str, reason: str, deadline_s: int | None = None) -> NodeOutcome:
        """Stop new work landing on the node (Ray's drain-node); running work may finish, then Ray ends it."""
        record = self.registry.get(name)
        transition(record.state, NodeState.DRAINING)
        message = commands.check_message(f"argus: {reason}"[:200])
        spec = record.spec
        try:
            node = self._ray_node(name)
            if node is None:
                record = self._move(record, NodeState.DRAINING, actor, reason)
                return self._outcome(record, "drain", True,
                                     f"Ray lists no live node for {name}: no new work can land there",
                                     data={"ray": None})
            argv = commands.drain(self.gcs_address, node["node_id"], message, ray_bin=spec.ray_bin,
                                  deadline_s=deadline_s)
            result = self._runner(spec).run(argv)
            if not result.ok:
                return self._fail(record, "drain", actor, f"ray drain-node for {name} failed: {result.describe()}",
                                  hint="Ray refused or could not be reached; take the node offline instead",
                                  commands=(result,))
            after = self._ray_node_by_id(node["node_id"])
        except ArgusError as exc:
            return self._fail(record, "drain", actor, f"drain of {name} failed: {exc.message}", hint=exc.hint)
        record = self._move(record, NodeState.DRAINING, actor, reason)
        state = after["state"] if after else "not listed"
        return self._outcome(record, "drain", True,
                             f"Ray accepted the drain of {name}; its node is now {state} (an idle node exits "
                             "at once, a busy one when its work ends)",
                             ray_node_id=node["node_id"], data={"ray": _brief(after) if after else None},
                             commands=(result,))

    def offline(self, name: str, *, actor: str, reason: str) -> NodeOutcome:
        """Stop the node's Ray processes and wait until Ray lists no live node for it."""
        record = self.registry.get(name)
        transition(record.state, NodeState.OFFLINE)
        spec = record.spec
        grace = 15
        try:
            argv = commands.offline(spec.ray_temp_dir, ray_bin=spec.ray_bin, grace_s=grace)
            result = self._runner(spec).run(argv, timeout_s=grace + 60)
            if not result.ok:
                return self._fail(record, "offline", actor, f"stopping Ray on {name} failed: {result.describe()}",
                                  hint="log in to the node and stop its Ray processes by hand",
                                  commands=(result,))
            still = self._wait_ray(name, alive=False, timeout_s=self.offline_timeout_s)
        except ArgusError as exc:
            return self._fail(record, "offline", actor, f"offline of {name} failed: {exc.message}", hint=exc.hint)
        if still is not None:
            return self._fail(record, "offline", actor,
                              f"Ray still lists node {name} ALIVE {self.offline_timeout_s:.0f} s after its "
                              "processes were stopped", hint="check the node's processes by hand",
                              commands=(result,))
        record = self._move(record, NodeState.OFFLINE, actor, reason)
        return self._outcome(record, "offline", True, f"node {name} is offline: {result.stdout.strip()}",
                             commands=(result,))

    def probe(self, name: str, *, disk_path: str = "/") -> NodeOutcome:
        """Reachability, CPUs, memory, disk and GPUs (nvidia-smi where installed). Changes no state."""
        record = self.registry.get(name)
        argvs = commands.probe(disk_path, ray_bin=record.spec.ray_bin)
        try:
            results = self._runner(record.spec).run_all(list(argvs.values()))
        except ArgusError as exc:
            return self._outcome(record, "probe", False, f"node {name} is unreachable: {exc.message}",
                                 hint=exc.hint, data={"reachable": False})
        by_name = dict(zip(argvs, results, strict=True))
        facts, problems = parse_probe(by_name)
        ok = not problems
        message = f"node {name} answered" + ("" if ok else f"; could not read: {'; '.join(problems)}")
        if facts.get("py_spy") == "absent":  # the node works without it; a hang's scene then has no stacks
            message += ("; py-spy is not installed beside ray nor on PATH, so a hang's scene will have no stacks "
                        "(pip install py-spy into the node's Ray environment)")
        return self._outcome(record, "probe", ok, message, data={"reachable": True, **facts},
                             commands=tuple(results))

    # -- Ray's view ----------------------------------------------------------------------------------

    def _list_ray_nodes(self) -> list[dict[str, Any]]:
        from ray.util.state import list_nodes

        try:
            states = list_nodes(address=self.dashboard_url, detail=True, limit=10_000, timeout=10,
                                raise_on_missing_output=False)
        except Exception as exc:  # Ray raises a zoo of types (RayStateApiException, ConnectionError, ...)
            raise SourceUnavailable("the Ray dashboard", self.dashboard_url, f"{type(exc).__name__}: {exc}",
                                    hint="check that the Ray head is running and dashboard_url is right") from None
        return [plain_dict(s) for s in states]

    def _ray_node(self, name: str) -> dict[str, Any] | None:
        """The ALIVE Ray node carrying this node's label, if any."""
        for node in self._list_ray_nodes():
            if node.get("state") == "ALIVE" and (node.get("labels") or {}).get(NODE_LABEL) == name:
                return node
        return None

    def _ray_node_by_id(self, node_id: str) -> dict[str, Any] | None:
        return next((n for n in self._list_ray_nodes() if n.get("node_id") == node_id), None)

    def _wait_ray(self, name: str, *, alive: bool, timeout_s: float) -> dict[str, Any] | None:
        """Poll until the node is ALIVE (alive=True: return it) or gone (alive=False: return None).
        On timeout return what was last seen: None for a join that never came up, the node for one that
        would not go."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                node = self._ray_node(name)
            except SourceUnavailable:
                # the dashboard may be busy on a loaded head: keep polling until the deadline
                if time.monotonic() >= deadline:
                    raise
            else:
                if (node is not None) == alive or time.monotonic() >= deadline:
                    return node
            time.sleep(self.poll_interval_s)

    # -- helpers -------------------------------------------------------------------------------------

    def _runner(self, spec: NodeSpec) -> CommandRunner:
        return self.runner_factory(spec)

    def _move(self, record: NodeRecord, target: NodeState, actor: str, reason: str) -> NodeRecord:
        return self.registry.record_transition(record.name, record.state, target, actor=actor, reason=reason)

    def _fail(self, record: NodeRecord, action: str, actor: str, message: str, *, hint: str | None = None,
              commands: tuple[CommandOutcome, ...] = ()) -> NodeOutcome:
        logger.warning("node {} {} failed: {}", record.name, action, message)
        record = self._move(record, NodeState.FAILED, actor, f"{action} failed: {message}"[:1000])
        return self._outcome(record, action, False, message, hint=hint, commands=commands)

    def _outcome(self, record: NodeRecord, action: str, ok: bool, message: str, *, hint: str | None = None,
                 ray_node_id: str | None = None, data: dict[str, Any] | None = None,
                 commands: tuple[CommandOutcome, ...] = ()) -> NodeOutcome:
        return NodeOutcome(node=record.name, action=action, ok=ok, state=record.state, message=message,
                           hint=hint, ray_node_id=ray_node_id or record.ray_node_id, data=data or {},
                           commands=commands, at=self.clock())


def plain_dict(obj: Any) -> dict[str, Any]:
    """A Ray state API record (a dataclass in Ray's typed API, a mapping elsewhere) as a plain dict."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else dict(obj)


def _brief(node: dict[str, Any]) -> dict[str, Any]:
    keys = ("node_id", "node_ip", "state", "state_message", "resources_total", "labels")
    return {k: node.get(k) for k in keys}


def parse_probe(results: dict[str, CommandOutcome]) -> tuple[dict[str, Any], list[str]]:
    """Facts from the probe commands' output, and what could not be read."""
    facts: dict[str, Any] = {}
    problems: list[str] = []

    def need(key: str) -> CommandOutcome | None:
        r = results.get(key)
        if r is None or not r.ok:
            problems.append(f"{key}: {r.describe() if r else 'not run'}")
            return None
        return r

    if r := need("uname"):
        facts["uname"] = r.stdout.strip()
    if r := need("nproc"):
        try:
            facts["cpus"] = int(r.stdout.strip())
        except ValueError:
            problems.append(f"nproc printed {r.stdout.strip()[:80]!r}")
    if r := need("free"):
        mem = next((line.split() for line in r.stdout.splitlines() if line.startswith("Mem:")), None)
        if mem and len(mem) >= 7:
            facts["memory_total_bytes"] = int(mem[1])
            facts["memory_available_bytes"] = int(mem[6])
        else:
            problems.append("free -b printed no Mem: line with an 'available' column")
    if r := need("df"):
        lines = r.stdout.strip().splitlines()
        cols = lines[-1].split() if len(lines) >= 2 else []
        if len(cols) >= 6 and cols[1].isdigit():
            facts["disk"] = {"mount": cols[5], "total_bytes": int(cols[1]) * 1024,
                             "used_bytes": int(cols[2]) * 1024, "available_bytes": int(cols[3]) * 1024}
        else:
            problems.append(f"df -P printed {r.stdout.strip()[:120]!r}")
    spy = results.get("py_spy")
    if spy is not None:
        where = spy.stdout.strip().splitlines()[-1:] if spy.ok else []
        facts["py_spy"] = where[0] if where else "absent"
    smi = results.get("nvidia_smi")
    if smi is None or smi.exit_status == NVIDIA_SMI_ABSENT:
        facts["nvidia_smi"] = "absent"
        facts["gpus"] = []
    elif smi.ok:
        facts["nvidia_smi"] = "present"
        facts["gpus"] = [_gpu(line) for line in smi.stdout.splitlines() if line.strip()]
    else:
        facts["nvidia_smi"] = "error"
        facts["gpus"] = []
        problems.append(f"nvidia_smi: {smi.describe()}")
    return facts, problems


def _gpu(line: str) -> dict[str, Any]:
    keys = commands.NVIDIA_QUERY.split(",")
    values = [v.strip() for v in line.split(",")]
    out: dict[str, Any] = {}
    for key, value in zip(keys, values, strict=False):
        try:
            out[key] = float(value) if key not in {"uuid", "name"} else value
        except ValueError:
            out[key] = value  # "[N/A]" on some models
    return out
