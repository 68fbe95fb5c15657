"""A resumable trainer with verl's command line and checkpoint layout, for the local stack (no GPU, no model).

Hydra overrides on the command line, as verl's `python3 -m verl.trainer.main_ppo key=value ...` takes them, with
the keys verl's trainer config has for checkpoints (`trainer.default_local_dir`, `trainer.resume_mode`: auto,
disable or resume_path, `trainer.resume_from_path`, `trainer.save_freq`) and a few of its other groups, so a
command line written for verl parses here. Checkpoints follow verl's layout: `<default_local_dir>/global_step_N/`,
then `latest_checkpointed_iteration.txt` holding N once the save is whole. Resuming follows verl's rules as read
in its ray_trainer.py `_load_checkpoint`: `disable` starts at 0; `auto` takes the folder the tracker file names,
or starts at 0 when there is none; `resume_path` takes `resume_from_path`, which must name a `global_step_N`
folder; the step is N, read from the folder's name, and training goes on at N + 1.

One rank is a Ray actor on a worker (any node with the `worker` resource), so losing its node fails the job.
It prints, for tests and benchmarks:

    RESUMED_AT_STEP=<N, 0 from scratch>
    RANK_NODE=<Ray node id of the rank>
    step:<i> - loss:0.1
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import ray
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

TRACKER = "latest_checkpointed_iteration.txt"


@dataclass
class Trainer:
    project_name: str = "stage"
    experiment_name: str = "run"
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    save_freq: int = 5
    total_training_steps: int = 100_000
    step_seconds: float = 0.2
    n_gpus_per_node: int = 0
    nnodes: int = 1


@dataclass
class Data:
    train_files: str = ""
    train_batch_size: int = 8


@dataclass
class Model:
    path: str = ""


@dataclass
class ActorRolloutRef:
    model: Model = field(default_factory=Model)


@dataclass
class Config:
    trainer: Trainer = field(default_factory=Trainer)
    data: Data = field(default_factory=Data)
    actor_rollout_ref: ActorRolloutRef = field(default_factory=ActorRolloutRef)


ConfigStore.instance().store(name="trainer", node=Config)


@ray.remote(num_cpus=0, resources={"worker": 0.01})
class Rank:
    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def step(self, i: int, seconds: float) -> int:
        time.sleep(seconds)
        return i


def resumed_step(cfg: DictConfig, folder: Path) -> int:
    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return 0
    if mode == "auto":
        try:
            named = folder / f"global_step_{int((folder / TRACKER).read_text().strip())}"
        except (OSError, ValueError):
            return 0
        return int(named.name.split("global_step_")[-1]) if named.is_dir() else 0
    if mode == "resume_path":
        path = cfg.trainer.resume_from_path
        assert isinstance(path, str), "resume ckpt must be str type"
        assert "global_step_" in path, "resume ckpt must specify the global_steps"
        return int(path.split("global_step_")[-1])
    raise ValueError(f"unknown trainer.resume_mode {mode!r}: auto, disable or resume_path")


@hydra.main(version_base="1.3", config_name="trainer")
def main(cfg: DictConfig) -> None:
    folder = Path(cfg.trainer.default_local_dir)
    if not folder.is_absolute():
        folder = Path(hydra.utils.get_original_cwd()) / folder
    start = resumed_step(cfg, folder)
    print(f"RESUMED_AT_STEP={start}", flush=True)
    ray.init()
    rank = Rank.remote()  # type: ignore[attr-defined]
    print("RANK_NODE=" + ray.get(rank.where.remote()), flush=True)
    for step in range(start + 1, cfg.trainer.total_training_steps + 1):
        ray.get(rank.step.remote(step, cfg.trainer.step_seconds))
        print(f"step:{step} - loss:0.1", flush=True)
        if step % cfg.trainer.save_freq == 0:
            saved = folder / f"global_step_{step}"
            saved.mkdir(parents=True, exist_ok=True)
            (saved / "state.txt").write_text(f"{step}\n")
            tmp = folder / f".{TRACKER}.{os.getpid()}"
            tmp.write_text(f"{step}\n")
            tmp.replace(folder / TRACKER)


if __name__ == "__main__":
    main()
