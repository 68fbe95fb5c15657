"""A 2-rank torch.distributed (gloo) training loop on Ray, one rank per worker, printing "step N" lines.

Submitted by tests/faults/test_stall_real.py as a real Ray job. Rank 0 prints each step after its
all_reduce returns. With --stall-after K, rank 1 stops taking part after step K (it sleeps, as a rank
stuck in a dataloader or a dead GPU would), so rank 0 blocks inside all_reduce until gloo's timeout:
the hang Argus must find long before that timeout. Without it, the loop runs --steps steps with the step
interval growing linearly from --interval-start to --interval-end seconds, then the job succeeds.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from datetime import timedelta

import ray


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def address(self) -> tuple[str, int]:
        """Rank 0's node IP and a port free on it, for the rendezvous."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def train(self, master: tuple[str, int], args: dict) -> int:
        import torch
        import torch.distributed as dist

        # Both ranks share one host here; loopback keeps gloo off whatever eth0 is.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=self.rank,
            world_size=2,
            timeout=timedelta(seconds=args["timeout"]),
        )
        grad = torch.ones(1024)
        steps, start, end = args["steps"], args["interval_start"], args["interval_end"]
        for step in range(1, steps + 1):
            if self.rank == 1 and args["stall_after"] and step > args["stall_after"]:
                time.sleep(3600)  # stops taking part; rank 0 waits in all_reduce
            time.sleep(start + (end - start) * (step - 1) / max(1, steps - 1))
            dist.all_reduce(grad)
            if self.rank == 0:
                print(f"step {step} loss={1.0 / step:.4f}", flush=True)
        dist.destroy_process_group()
        return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stall-after", type=int, default=0)
    parser.add_argument("--interval-start", type=float, default=0.5)
    parser.add_argument("--interval-end", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=120.0, help="gloo collective timeout, seconds")
    args = parser.parse_args()

    ray.init()
    # ray.remote returns an ActorClass (typed so in ray), but mypy keeps a decorated class's own type
    # (python/mypy#3135), which has no .options
    ranks = [
        Rank.options(resources={f"worker{i + 1}": 0.1}).remote(i)  # type: ignore[attr-defined]
        for i in range(2)
    ]
    master = ray.get(ranks[0].address.remote())
    print(f"rendezvous at {master[0]}:{master[1]}", flush=True)
    ray.get([r.train.remote(master, vars(args)) for r in ranks])
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
