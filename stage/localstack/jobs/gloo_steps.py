"""A torch.distributed (gloo) training loop on Ray, one actor per rank, printing "step N" lines.

Submitted by the fault tests (tests/faults/test_stall_real.py, test_hang_ranks_real.py) and the demo as a real
Ray job. `--world N` ranks (default 2) are spread over the local stack's two workers: rank i runs on worker
(i % 2) + 1, through the workers' `worker1`/`worker2` resources. Each rank prints "rank R pid P node IP" once
at start; rank 0 prints each step after its all_reduce returns (with `--stamp`, ending in ts=<unix time>).
With `--ranks-file PATH` the driver also writes every rank's pid and node IP there as JSON
({"ranks": [{"rank", "pid", "node"}, ...]}) before training starts, so a test knows which process is which rank.

With `--stall-after K`, rank `--fault-rank` (default 1) goes wrong after step K, as `--fault` says:
- sleep (the default): it sleeps forever in Rank.train, as a rank stuck in a dataloader or a dead GPU would;
- stop: it sends itself SIGSTOP (state T; SIGCONT lets it go on);
- spin: it runs a busy Python loop outside any collective, forever (spin_forever);
- lock: it blocks forever acquiring a threading.Lock another thread holds (wait_on_lock);
- save: it spends `--save-s` seconds (default 90) saving a checkpoint with torch.save, silently, while the
  other ranks wait in dist.barrier(); then training goes on and the job succeeds after --steps steps.
For the first four the other ranks block inside all_reduce until gloo's `--timeout`: the hang Argus must find
long before that timeout. For save nothing is wrong: a long silent step Argus must not call a hang.
With `--fr-dump-after S` every rank whose collectives have not returned for S seconds writes its PyTorch flight
recorder (on when the job's environment sets TORCH_FR_BUFFER_SIZE > 0) to `$TORCH_FR_DUMP_TEMP_FILE<rank>`, once:
what NCCL's watchdog does when a collective times out, which gloo has no watchdog for. The dump is torch's own
(`_dump_fr_trace`) of the rank's real collectives; a stopped rank writes none, as under NCCL.
Without --stall-after the loop runs --steps steps with the step interval growing linearly from
--interval-start to --interval-end seconds, then the job succeeds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import ray

FAULTS = ("sleep", "stop", "spin", "lock", "save")


def spin_forever() -> None:
    """A rank busy in Python outside any collective: a runaway loop, never returning."""
    n = 0
    while True:
        n += 1


def wait_on_lock() -> None:
    """A rank blocked on a lock another thread holds and never releases."""
    lock = threading.Lock()
    held = threading.Event()

    def holder() -> None:
        lock.acquire()
        held.set()
        threading.Event().wait()  # holds the lock forever

    threading.Thread(target=holder, name="lock-holder", daemon=True).start()
    held.wait()
    lock.acquire()  # never returns


def stop_self() -> None:
    """A rank stopped by SIGSTOP, as a debugger or an operator's `kill -STOP` would leave it."""
    os.kill(os.getpid(), signal.SIGSTOP)


def dump_flight_recorder_when_stuck(rank: int, after_s: float, progress: list[float]) -> None:
    """Once no collective has returned for `after_s` (progress[0], a monotonic time), write this rank's flight
    recorder where PyTorch's watchdog would: $TORCH_FR_DUMP_TEMP_FILE<rank> (default /tmp/nccl_trace_rank_)."""
    from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # no stub, yet there

    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or \
        "/tmp/nccl_trace_rank_"

    def watch() -> None:
        while time.monotonic() - progress[0] < after_s:
            time.sleep(0.2)
        path = Path(f"{prefix}{rank}")
        partial = path.with_name(path.name + ".part")
        partial.write_bytes(_dump_fr_trace())
        partial.replace(path)
        print(f"rank {rank} dumped its flight recorder to {path}", flush=True)

    threading.Thread(target=watch, name="fr-watchdog", daemon=True).start()


def save_checkpoint(seconds: float, megabytes: int = 4) -> None:
    """A long, silent checkpoint save: torch.save over one file of a few MB, again and again, for `seconds`."""
    import torch

    weights = torch.randn(megabytes * 256 * 1024)  # float32: megabytes MB
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="gloo-steps-ckpt-") as folder:
        path = Path(folder) / "checkpoint.pt"
        saves = 0
        while time.monotonic() < deadline:
            saves += 1
            torch.save({"model": weights, "saves": saves}, path)


RENDEZVOUS_MIN_PORT = 20000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def whoami(self) -> dict[str, object]:
        ip = ray.util.get_node_ip_address()
        print(f"rank {self.rank} pid {os.getpid()} node {ip}", flush=True)
        return {"rank": self.rank, "pid": os.getpid(), "node": ip}

    def address(self) -> tuple[str, int]:
        """Rank 0's node IP and a port free on it, for the rendezvous. Below the kernel's ephemeral range: a port
        the kernel handed out (bind to 0) went back to that range when probed, and another job's gloo pairs on
        this host (the hang tests run six jobs at once) took it before this job's store bound it (EADDRINUSE)."""
        ip = ray.util.get_node_ip_address()
        low = ephemeral_low()
        for _ in range(200 if low > RENDEZVOUS_MIN_PORT + 1 else 0):
            port = random.randint(RENDEZVOUS_MIN_PORT, low - 1)
            with socket.socket() as sock:
                try:
                    sock.bind((ip, port))
                except OSError:
                    continue
                return ip, port
        with socket.socket() as sock:  # no room below the ephemeral range: the kernel's choice
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def train(self, master: tuple[str, int], args: dict) -> int:
        import torch
        import torch.distributed as dist

        # Every rank shares one host here; loopback keeps gloo off whatever eth0 is.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=self.rank,
            world_size=args["world"],
            timeout=timedelta(seconds=args["timeout"]),
        )
        grad = torch.ones(1024)
        progress = [time.monotonic()]
        if args["fr_dump_after"]:
            dump_flight_recorder_when_stuck(self.rank, args["fr_dump_after"], progress)
        steps, start, end = args["steps"], args["interval_start"], args["interval_end"]
        fault, faulty = args["fault"], self.rank == args["fault_rank"]
        for step in range(1, steps + 1):
            if args["stall_after"] and step == args["stall_after"] + 1:
                if fault == "save":
                    if faulty:
                        save_checkpoint(args["save_s"])
                    dist.barrier()  # the other ranks wait here while the fault rank saves
                elif faulty and fault == "stop":
                    stop_self()
                elif faulty and fault == "spin":
                    spin_forever()
                elif faulty and fault == "lock":
                    wait_on_lock()
            if faulty and fault == "sleep" and args["stall_after"] and step > args["stall_after"]:
                time.sleep(3600)  # stops taking part; the other ranks wait in all_reduce
            time.sleep(start + (end - start) * (step - 1) / max(1, steps - 1))
            dist.all_reduce(grad)
            progress[0] = time.monotonic()
            if self.rank == 0:
                stamp = f" ts={time.time():.3f}" if args["stamp"] else ""
                print(f"step {step} loss={1.0 / step:.4f}{stamp}", flush=True)
        dist.destroy_process_group()
        return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stall-after", type=int, default=0, help="apply --fault after this step (0: never)")
    parser.add_argument("--interval-start", type=float, default=0.5)
    parser.add_argument("--interval-end", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=120.0, help="gloo collective timeout, seconds")
    parser.add_argument("--world", type=int, default=2, help="number of ranks, spread over worker1 and worker2")
    parser.add_argument("--fault", choices=FAULTS, default="sleep")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--save-s", type=float, default=90.0, help="how long --fault save saves, seconds")
    parser.add_argument("--fr-dump-after", type=float, default=0.0,
                        help="dump the flight recorder after this many seconds with no collective returning (0: never)")
    parser.add_argument("--stamp", action="store_true", help="end each step line with ts=<unix time> (benchmarks)")
    parser.add_argument("--ranks-file", type=Path, default=None, help="write the ranks' pids and nodes here (JSON)")
    args = parser.parse_args()
    if args.world < 1 or not 0 <= args.fault_rank < args.world:
        parser.error(f"--fault-rank {args.fault_rank} is not a rank of a world of {args.world}")
    if args.fault != "sleep" and not args.stall_after:
        parser.error(f"--fault {args.fault} needs --stall-after K: the step after which it happens")
    if args.fault == "save" and args.save_s >= args.timeout:
        parser.error(f"--save-s {args.save_s:g} must be shorter than --timeout {args.timeout:g}: the other ranks "
                     "wait out the save in a barrier, under gloo's timeout")

    ray.init()
    # ray.remote returns an ActorClass (typed so in ray), but mypy keeps a decorated class's own type
    # (python/mypy#3135), which has no .options
    ranks = [
        Rank.options(resources={f"worker{i % 2 + 1}": 0.1}).remote(i)  # type: ignore[attr-defined]
        for i in range(args.world)
    ]
    who = ray.get([r.whoami.remote() for r in ranks])
    if args.ranks_file is not None:
        partial = args.ranks_file.with_name(args.ranks_file.name + ".part")
        partial.write_text(json.dumps({"ranks": who}, indent=1))
        partial.replace(args.ranks_file)  # whole or absent, for a reader polling it
    master = ray.get(ranks[0].address.remote())
    print(f"rendezvous at {master[0]}:{master[1]}", flush=True)
    ray.get([r.train.remote(master, vars(args)) for r in ranks])
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
