"""A job that holds GPUs and never uses them: an actor reserves --gpus GPUs on one worker and waits.

It stands for the common case of a rollout or reward worker waiting on a peer that never comes: Ray shows
the job RUNNING and the GPUs allocated, while the GPUs themselves (DCGM utilisation) stay at 0%.
"""

from __future__ import annotations

import argparse
import time

import ray


@ray.remote(num_cpus=0)
class Holder:
    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            print(f"GPUs {ray.get_gpu_ids()} loaded; waiting for rollout workers (0/8 connected)", flush=True)
            time.sleep(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", default="worker2", help="custom resource of the node to run on")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3600)
    args = parser.parse_args()
    ray.init()
    # ray.remote returns an ActorClass (typed so in ray), but mypy keeps a decorated class's own type
    # (python/mypy#3135), which has no .options
    holder = Holder.options(num_gpus=args.gpus, resources={args.node: 0.1}).remote()  # type: ignore[attr-defined]
    ray.get(holder.wait.remote(args.seconds))


if __name__ == "__main__":
    main()
