"""A small resumable "training job" for the local stack (tests, benchmarks, the demo): one Ray actor rank
on a worker (any node with the `worker` resource), a step every 0.2 s, a `global_step_N` checkpoint folder
every 5 steps in $ARGUS_JOB_DIR/checkpoints, and lines that say where it runs and what it resumed from:

    RESUME_FROM=<$ARGUS_RESUME_FROM or none>
    RANK_NODE=<Ray node id of the rank>
    step:<i> - loss:0.1
"""

RESUMABLE_TRAINER = """
import os, pathlib, time, ray
ray.init()
ckpt = pathlib.Path(os.environ["ARGUS_JOB_DIR"]) / "checkpoints"
print("RESUME_FROM=" + os.environ.get("ARGUS_RESUME_FROM", "none"), flush=True)

@ray.remote(num_cpus=0, resources={"worker": 0.01})
class Rank:
    def where(self):
        return ray.get_runtime_context().get_node_id()
    def step(self, i):
        time.sleep(0.2)
        return i

rank = Rank.remote()
print("RANK_NODE=" + ray.get(rank.where.remote()), flush=True)
for i in range(100000):
    ray.get(rank.step.remote(i))
    if i % 5 == 0:
        (ckpt / f"global_step_{i}").mkdir(exist_ok=True)
    print(f"step:{i} - loss:0.1", flush=True)
"""
