"""Command builders: argv lists for the remote node, built from validated values only.

Each builder validates every argument again (the NodeSpec validators) before building, so a caller that
skips NodeSpec still cannot smuggle a shell metacharacter through. The runner joins argv with
shlex.join, so each element reaches the remote program as one argument.

What Ray 2.60 offers for draining (checked with `ray drain-node --help`): a hidden, developer-facing
`ray drain-node --address --node-id --reason --reason-message [--deadline-remaining-seconds]` that asks
the GCS to drain the node. With reason DRAIN_NODE_REASON_PREEMPTION the request is accepted even when
the node is busy: no new work is scheduled there, running work may finish, and the raylet exits once
the node is idle (Ray then lists it DEAD with "Terminated due to preemption: <message>"; measured: an
idle node is DEAD at once). DRAIN_NODE_REASON_IDLE_TERMINATION is refused for a busy node, so it is not
used. Ray cannot undo a drain; undrain means joining the node again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import TypeVar

from control.nodes import (
    NodeSpec,
    RayPorts,
    check_abs_path,
    check_ip,
    check_labels,
    check_program,
    check_resources,
)
from core.errors import InputError

DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"
_NODE_ID_RE = re.compile(r"[0-9a-f]{56}")
_GCS_RE = re.compile(r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9a-fA-F:.]{2,45}\]):(?P<port>[0-9]{1,5})")
_MESSAGE_RE = re.compile(r"[A-Za-z0-9 _.,:/()=+-]{1,200}")
NVIDIA_QUERY = "index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu"

# Stops the processes of one Ray node, found by its temp dir in their command lines, and their children
# (agents started by the raylet carry no temp dir). The script is a constant; the temp dir arrives as $1,
# so nothing the caller passes is ever parsed by the shell. Prints "stopped <pids>" or "none".
_STOP_BY_TEMP_DIR = r"""
set -u
dir=$1; grace=$2
pat="(^|[[:space:]=])$(printf '%s' "$dir" | sed 's/[.]/\\./g')(/|[[:space:]]|$)"
found=""
for p in $(pgrep -f -- "$pat"); do
  # this script, the shell sshd ran it from, and the finished $(...) subshells hold the dir too
  [ "$p" = "$$" ] || [ "$p" = "$PPID" ] && continue
  kill -0 "$p" 2>/dev/null || continue
  found="$found $p"
done
all="$found"
frontier="$found"
while [ -n "$frontier" ]; do
  next=""
  for p in $frontier; do
    for c in $(pgrep -P "$p"); do
      [ "$c" = "$$" ] && continue
      case " $all " in *" $c "*) ;; *) all="$all $c"; next="$next $c";; esac
    done
  done
  frontier="$next"
done
if [ -z "$all" ]; then echo none; exit 0; fi
kill -TERM $all 2>/dev/null
i=0
while [ "$i" -lt "$grace" ]; do
  alive=""
  for p in $all; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
  [ -z "$alive" ] && break
  sleep 1; i=$((i+1))
done
for p in $all; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
echo "stopped$all"
"""


_In = TypeVar("_In")
_Out = TypeVar("_Out")


def _check(fn: Callable[[_In], _Out], value: _In, what: str) -> _Out:
    try:
        return fn(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"refused {what}: {exc}", hint="pass a validated value; nothing was run") from None


def check_gcs_address(value: str) -> str:
    match = _GCS_RE.fullmatch(value) if isinstance(value, str) and value.isascii() else None
    if match is None:
        raise InputError(f"refused GCS address {value!r}: expected host:port, e.g. 10.0.0.1:6379",
                         hint="pass the head's GCS address; nothing was run")
    port = int(match.group("port"))
    if not 1 <= port <= 65535:
        raise InputError(f"refused GCS address {value!r}: port {port} is out of range")
    return value


def check_node_id(value: str) -> str:
    if not isinstance(value, str) or not _NODE_ID_RE.fullmatch(value):
        raise InputError(f"refused Ray node id {value!r}: expected 56 lowercase hex characters",
                         hint="take the node id from Ray's node list; nothing was run")
    return value


def check_message(value: str) -> str:
    if not isinstance(value, str) or not value.isascii() or not _MESSAGE_RE.fullmatch(value):
        raise InputError(
            f"refused message {value!r}: use 1-200 letters, digits, spaces and _ . , : / ( ) = + -",
            hint="rephrase the reason; nothing was run",
        )
    return value


def _count(value: int | None, what: str, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InputError(f"refused {what} {value!r}: expected a whole number from 0 to {high}")
    return value


def ray_start_worker(
    gcs_address: str,
    node_ip: str,
    *,
    resources: Mapping[str, float],
    labels: Mapping[str, str],
    temp_dir: str | None,
    num_gpus: int,
    num_cpus: int | None,
    ray_bin: str = "ray",
    ports: RayPorts | None = None,
    timeout_s: int = 120,
) -> list[str]:
    """`ray start` joining a worker to the cluster; returns once the node's processes are started.

    Wrapped in `timeout`: a worker that cannot reach the GCS retries forever.
    """
    gcs_address = check_gcs_address(gcs_address)
    node_ip = _check(check_ip, node_ip, "node IP")
    res = _check(check_resources, dict(resources), "resources")
    lab = _check(check_labels, dict(labels), "labels")
    ray_bin = _check(check_program, ray_bin, "ray program")
    _count(num_gpus, "GPU count", 16)
    _count(num_cpus, "CPU count", 1024)
    _count(timeout_s, "timeout", 3600)
    if not timeout_s:
        raise InputError("refused timeout 0: ray start needs time to join")
    # A ray in a virtualenv (an absolute path) starts with its bin directory first on PATH, as an activated
    # venv would have it: the node's dashboard agent runs py-spy for stack dumps and finds it only on PATH.
    env = (["sh", "-c", _WITH_BIN_ON_PATH, "argus-ray-start", str(PurePosixPath(ray_bin).parent)]
           if ray_bin.startswith("/") else [])
    argv = [
        *env,
        "timeout", "--kill-after=10", str(timeout_s),
        ray_bin, "start", "--disable-usage-stats",
        f"--address={gcs_address}",
        f"--node-ip-address={node_ip}",
        f"--num-gpus={num_gpus}",
    ]  # fmt: skip
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if res:
        argv.append(f"--resources={json.dumps(res, sort_keys=True, separators=(',', ':'))}")
    if lab:
        argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(lab.items())))
    if temp_dir is not None:
        argv.append(f"--temp-dir={_check(check_abs_path, temp_dir, 'temp dir')}")
    if ports is not None:
        if not isinstance(ports, RayPorts):
            raise InputError(f"refused ports {ports!r}: pass a RayPorts")
        for field, value in ports.model_dump(exclude_none=True).items():
            argv.append(f"--{field.replace('_', '-')}={int(value)}")
    return argv


def ray_start_for(spec: NodeSpec, gcs_address: str, resources: Mapping[str, float],
                  labels: Mapping[str, str], timeout_s: int = 120) -> list[str]:
    return ray_start_worker(
        gcs_address, spec.ray_node_ip, resources=resources, labels=labels, temp_dir=spec.ray_temp_dir,
        num_gpus=spec.gpus, num_cpus=spec.cpus, ray_bin=spec.ray_bin, ports=spec.ray_ports, timeout_s=timeout_s,
    )


def drain(gcs_address: str, node_id: str, reason: str, *, ray_bin: str = "ray",
          deadline_s: int | None = None) -> list[str]:
    """`ray drain-node`: no new work lands on the node; the raylet exits once idle (see module docstring)."""
    argv = [
        _check(check_program, ray_bin, "ray program"), "drain-node",
        f"--address={check_gcs_address(gcs_address)}",
        f"--node-id={check_node_id(node_id)}",
        f"--reason={DRAIN_REASON}",
        f"--reason-message={check_message(reason)}",
    ]  # fmt: skip
    if deadline_s is not None:
        argv.append(f"--deadline-remaining-seconds={_count(deadline_s, 'drain deadline', 7 * 24 * 3600)}")
    return argv


def offline(temp_dir: str | None, *, ray_bin: str = "ray", grace_s: int = 15) -> list[str]:
    """Stop this node's Ray processes.

    With a temp dir (a host running several Ray nodes): only processes whose command line holds that
    temp dir, and their children. Without one: `ray stop`, which ends every Ray process on the host, so
    use it only on a host dedicated to this node.
    """
    _count(grace_s, "grace period", 600)
    if temp_dir is None:
        return [_check(check_program, ray_bin, "ray program"), "stop", f"--grace-period={grace_s}"]
    temp_dir = _check(check_abs_path, temp_dir, "temp dir")
    return ["sh", "-c", _STOP_BY_TEMP_DIR, "argus-offline", temp_dir, str(grace_s)]


_WITH_BIN_ON_PATH = 'd=$1; shift; PATH="$d:$PATH" exec "$@"'
# Where the node's dashboard agent would find py-spy: beside the ray program Argus starts it with, else on PATH.
_FIND_PY_SPY = 'if [ -n "$1" ] && [ -x "$1" ]; then echo "$1"; else command -v py-spy || true; fi'


def probe(disk_path: str = "/", *, ray_bin: str = "ray") -> dict[str, list[str]]:
    """Fact-finding commands by name. nvidia-smi exits 127 where it is not installed: no GPUs, no error.
    `py_spy` prints where py-spy is (beside `ray_bin`, else on PATH), nothing where it is not: without it the
    scene of a hang has no stacks."""
    disk_path = "/" if disk_path == "/" else _check(check_abs_path, disk_path, "disk path")
    ray_bin = _check(check_program, ray_bin, "ray program")
    beside = str(PurePosixPath(ray_bin).parent / "py-spy") if ray_bin.startswith("/") else ""
    return {
        "py_spy": ["sh", "-c", _FIND_PY_SPY, "argus-probe", beside],
        "uname": ["uname", "-a"],
        "nproc": ["nproc"],
        "free": ["free", "-b"],
        "df": ["df", "-P", "-k", disk_path],
        "nvidia_smi": ["nvidia-smi", f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader,nounits"],
    }
