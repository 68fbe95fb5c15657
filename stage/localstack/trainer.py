"""A small resumable "training job" for the local stack (tests, benchmarks, the demo): one Ray actor rank
on a worker (any node with the `worker` resource), a step every 0.2 s, a `global_step_N` checkpoint folder
every 5 steps in $ARGUS_JOB_DIR/checkpoints, and lines that say where it runs and what it resumed from:

    RESUME_FROM=<$ARGUS_RESUME_FROM or none>
    RANK_NODE=<Ray node id of the rank>
    step:<i> - loss:0.1

With STAGE_TRAINER_STOP_GRACE_S=<s> it behaves as trainers that wait for their rank to come back and save a last
checkpoint when stopped: the driver outlives its rank's node (it prints RANK_LOST and waits) and takes that many
seconds to exit after SIGTERM. A test uses it to hold remediation inside the step that stops the job.
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
grace = float(os.environ.get("STAGE_TRAINER_STOP_GRACE_S", "0"))
if grace > 0:
    import signal, sys
    def last_checkpoint(*_):
        print("STOPPING: saving a last checkpoint", flush=True)
        time.sleep(grace)
        sys.exit(0)
    signal.signal(signal.SIGTERM, last_checkpoint)
for i in range(100000):
    try:
        ray.get(rank.step.remote(i))
    except ray.exceptions.RayActorError:
        if grace <= 0:
            raise
        print("RANK_LOST: waiting for the rank to come back", flush=True)
        while True:
            time.sleep(1)
    if i % 5 == 0:
        (ckpt / f"global_step_{i}").mkdir(exist_ok=True)
    print(f"step:{i} - loss:0.1", flush=True)
"""
