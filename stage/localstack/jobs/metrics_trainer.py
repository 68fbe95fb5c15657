"""A trainer that prints verl's per-step metrics line, as a GRPO run does, with the noise and rhythm of a real one:
the loss falls with noise, the gradient norm wanders, the entropy drifts down, the reward climbs, responses vary in
length, and a step takes its time (jittered), longer on checkpoint steps (every --save-every) and validation steps
(every --test-every). Lines go to stdout and, as verl's scripts `tee` them, to $ARGUS_JOB_DIR/logs/train.log.

Faults on request: --nan-at N (the policy loss and gradient norm turn NaN from step N), --slow-from N
--slow-steps K --slow-factor F (K steps F times slower from step N: a throttled GPU), --collapse-at N (entropy
falls to near zero, the reward to nothing and responses hit the length cap from step N). Without them the run is
healthy: what Argus must not call a fault.

    python metrics_trainer.py --steps 600 --step-s 1.0 [--seed 7] [faults]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--test-every", type=int, default=100)
    parser.add_argument("--nan-at", type=int, default=0)
    parser.add_argument("--slow-from", type=int, default=0)
    parser.add_argument("--slow-steps", type=int, default=0)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--collapse-at", type=int, default=0)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to wait after the last step")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    job_dir = Path(os.environ.get("ARGUS_JOB_DIR", "."))
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = (job_dir / "logs" / "train.log").open("a", encoding="utf-8")
    for step in range(1, args.steps + 1):
        took = args.step_s * rng.uniform(0.9, 1.1)
        if args.save_every and step % args.save_every == 0:
            took *= 3.0  # the checkpoint is saved within the step, as verl's timing_s/step counts it
        if args.test_every and step % args.test_every == 0:
            took *= 2.0
        if args.slow_from and args.slow_from <= step < args.slow_from + args.slow_steps:
            took *= args.slow_factor
        time.sleep(took)
        broken = bool(args.nan_at) and step >= args.nan_at
        collapsed = bool(args.collapse_at) and step >= args.collapse_at
        pg_loss = float("nan") if broken else rng.gauss(0.0, 0.02)
        grad_norm = float("nan") if broken else math.exp(rng.gauss(-0.2, 0.25))
        entropy = 0.02 if collapsed else max(0.2, 1.2 * math.exp(-step / 3000) + rng.gauss(0, 0.02))
        score = rng.gauss(0.03, 0.01) if collapsed else min(1.0, 0.2 + 0.6 * (1 - math.exp(-step / 400))
                                                              + rng.gauss(0, 0.05))
        length = 1024.0 if collapsed else max(32.0, rng.gauss(300 + step * 0.1, 30))
        clip = 0.9 if collapsed else min(1.0, max(0.0, rng.gauss(0.02, 0.01)))
        gen = took * 0.55
        line = (f"(TaskRunner pid=4242) step:{step} - actor/pg_loss:{pg_loss:.4f} - actor/grad_norm:{grad_norm:.4f} "
                f"- actor/entropy:{entropy:.4f} - actor/lr:1e-06 - critic/score/mean:{score:.4f} - "
                f"response_length/mean:{length:.1f} - response_length/clip_ratio:{clip:.4f} - "
                f"timing_s/gen:{gen:.4f} - timing_s/update_actor:{took * 0.3:.4f} - timing_s/step:{took:.4f} - "
                f"perf/throughput:{length * 64 / took:.1f}")
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()
    if args.hold:
        time.sleep(args.hold)


if __name__ == "__main__":
    main()
