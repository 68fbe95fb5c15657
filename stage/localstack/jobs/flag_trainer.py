"""A resumable trainer that takes its checkpoint as a flag, for the local stack: `--ckpt-dir DIR` is where it
saves `step_N.ckpt` every --save-every steps, `--resume PATH` the checkpoint it starts from (its step is in the
file). One rank is a Ray actor on a worker (any node with the `worker` resource), so losing its node fails
the job. It prints, for tests and benchmarks:

    RESUMED_AT_STEP=<N, 0 from scratch>
    RANK_NODE=<Ray node id of the rank>
    step:<i> - loss:0.1
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=0, resources={"worker": 0.01})
class Rank:
    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def step(self, i: int, seconds: float) -> int:
        time.sleep(seconds)
        return i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--resume", type=Path, default=None, help="a step_N.ckpt file to start from")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    args = parser.parse_args()
    start = int(args.resume.read_text().strip()) if args.resume else 0
    print(f"RESUMED_AT_STEP={start}", flush=True)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    ray.init()
    rank = Rank.remote()  # type: ignore[attr-defined]
    print("RANK_NODE=" + ray.get(rank.where.remote()), flush=True)
    for step in range(start + 1, args.steps + 1):
        ray.get(rank.step.remote(step, args.step_seconds))
        print(f"step:{step} - loss:0.1", flush=True)
        if step % args.save_every == 0:
            tmp = args.ckpt_dir / f".step_{step}.{os.getpid()}"
            tmp.write_text(f"{step}\n")
            tmp.replace(args.ckpt_dir / f"step_{step}.ckpt")


if __name__ == "__main__":
    main()
