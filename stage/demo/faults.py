"""The demo's faults as data: what each one is, how it is caused, what is simulated, what Argus should say.

The code that causes each fault lives in stage/demo/inject.py under the same key. Phases run one after
the other; faults of one phase run at the same time (they use different jobs and GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.types import Category


@dataclass(frozen=True)
class Fault:
    key: str
    title: str
    phase: int
    expect: Category
    how: str  # what the demo does, one line
    simulated: str | None = None  # what is not real on a machine without GPUs, said in the table


FAULTS: tuple[Fault, ...] = (
    Fault("hung_rank", "hung rank", 1, Category.NCCL_HANG,
          "SIGSTOP rank 1 of a 2-rank torch.distributed (gloo) job; rank 0 blocks in all_reduce"),
    Fault("cuda_oom", "CUDA OOM", 1, Category.GPU_OOM,
          "a rank holding a GPU runs out of GPU memory and the job fails",
          simulated="no GPU here: the rank raises torch.OutOfMemoryError with the allocator's message"),
    Fault("xid", "Xid 79", 1, Category.GPU_HARDWARE,
          "GPU 3 of worker 1 reports Xid 79 (GPU has fallen off the bus)",
          simulated="reported by the DCGM simulator"),
    Fault("idle_gpus", "idle GPUs", 1, Category.IDLE_GPU,
          "a job holds all 4 GPUs of worker 2 and never uses them",
          simulated="0% utilisation from the DCGM simulator; window 30 s instead of 10 min"),
    Fault("host_oom", "host OOM", 2, Category.HOST_OOM,
          "a task eats host memory on worker 2 until Ray's OOM killer kills it",
          simulated="Ray's kill threshold lowered to just above the host's current use"),
    Fault("node_lost", "lost node", 3, Category.NODE_LOST,
          "SIGKILL the raylet of the worker that runs a training job's rank"),
)
