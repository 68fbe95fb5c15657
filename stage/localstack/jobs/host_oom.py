"""A Ray job whose one task eats host memory on one worker (--node) until Ray's OOM killer kills it.

Submitted by tests/faults/test_host_oom_real.py and `argus demo` to a cluster whose worker runs with a lowered
RAY_memory_usage_threshold. The task allocates --step-mib at a time (pages written, so they count), never
more than --budget-mib in all (the machine is shared), and has no retries, so the first OOM kill fails
the job with ray.exceptions.OutOfMemoryError. If the budget is spent without a kill, the driver says so
and exits non-zero, so a test cannot mistake that for the fault.
"""

from __future__ import annotations

import argparse
import sys
import time

import ray


@ray.remote(num_cpus=1, max_retries=0)
def hog(budget_mib: int, step_mib: int, hold_s: float) -> int:
    chunks = []
    for _ in range(budget_mib // step_mib):
        chunks.append(b"\x01" * (step_mib << 20))
        time.sleep(0.05)  # the memory monitor samples every 100 ms here; let it see each step
    time.sleep(hold_s)
    return len(chunks) * step_mib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-mib", type=int, required=True)
    parser.add_argument("--step-mib", type=int, default=32)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--node", default="worker1", help="custom resource of the node to run on")
    args = parser.parse_args()
    ray.init()
    print(f"allocating up to {args.budget_mib} MiB on {args.node}", flush=True)
    task = hog.options(resources={args.node: 0.1})
    held = ray.get(task.remote(args.budget_mib, args.step_mib, args.hold_s))
    print(f"NO OOM KILL: the task held {held} MiB and was not killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
