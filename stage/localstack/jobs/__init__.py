"""Small real Ray jobs for the local stack: the fault tests and `argus demo` submit these files as they are.

- host_oom.py: a task that eats host memory until Ray's OOM killer kills it;
- gloo_steps.py: an N-rank torch.distributed (gloo) loop printing "step N"; one rank may stall, stop, spin, block
  on a lock, or save a checkpoint silently for a while (--fault);
- cuda_oom.py: a rank that fails the way PyTorch's CUDA allocator does (simulated: no GPU here);
- idle_gpus.py: an actor that holds GPUs and does nothing with them;
- hydra_trainer.py: a resumable trainer with verl's command line (Hydra overrides) and checkpoint layout;
- flag_trainer.py: a resumable trainer that takes its checkpoint as `--resume PATH`;
- metrics_trainer.py: a GRPO-like run printing verl's per-step metrics with real-looking noise, healthy unless asked
  for a NaN, a slowdown or a collapse.
"""

from pathlib import Path

JOBS_DIR = Path(__file__).resolve().parent
