"""A training rank that dies of CUDA out-of-memory, for `argus demo` on machines without a GPU.

Simulated: there is no GPU here, so the rank cannot exhaust one. It holds a GPU through Ray (the cluster
advertises GPUs the DCGM simulator reports), trains a few steps on the CPU, then raises the exception
PyTorch's CUDA caching allocator raises, `torch.OutOfMemoryError`, with the allocator's message shape
(figures from --total-gib / --tried-gib). Everything after the raise is real: Ray fails the actor call,
the driver's traceback ends the job, and Argus reads it from the job's logs and state like any other.
On a machine with a GPU use --real, which allocates on the GPU until the allocator really fails.
"""

from __future__ import annotations

import argparse
import os
import time

import ray


@ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)
class Rank:
    def train(self, steps: int, total_gib: float, tried_gib: float, real: bool, oom: bool = True) -> None:
        import torch

        for step in range(1, steps + 1):
            time.sleep(0.3)
            print(f"step {step} loss={2.0 / step:.4f}", flush=True)
        if not oom:  # the cause was fixed (bench/soak.py removes the --oom-while file): the run ends well
            return
        if real:  # a real GPU: allocate until the caching allocator gives up
            blocks = []
            while True:
                blocks.append(torch.empty(int(tried_gib * (1 << 30)), dtype=torch.uint8, device="cuda"))
        free_mib = 18.0
        in_use = total_gib - free_mib / 1024
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU 0 has a total capacity of "
            f"{total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Process {os.getpid()} has {in_use:.2f} GiB "
            f"memory in use. Of the allocated memory {in_use - 0.9:.2f} GiB is allocated by PyTorch, and "
            "912.40 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", default="worker1", help="custom resource of the node to run on")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--total-gib", type=float, default=79.15)
    parser.add_argument("--tried-gib", type=float, default=2.0)
    parser.add_argument("--real", action="store_true", help="really allocate on a GPU until it fails")
    parser.add_argument("--oom-while", default=None, metavar="FILE",
                        help="run out of memory only while FILE exists (a fault that a person can fix, then resubmit)")
    args = parser.parse_args()
    oom = args.oom_while is None or os.path.exists(args.oom_while)
    ray.init()
    # ray.remote returns an ActorClass (typed so in ray), but mypy keeps a decorated class's own type
    # (python/mypy#3135), which has no .options
    rank = Rank.options(resources={args.node: 0.1}).remote()  # type: ignore[attr-defined]
    print(f"training on {args.node} with micro_batch_size=16", flush=True)
    ray.get(rank.train.remote(args.steps, args.total_gib, args.tried_gib, args.real, oom))


if __name__ == "__main__":
    main()
