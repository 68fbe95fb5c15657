"""A JobSpec's `wandb:`: validated, refused where the env says the same, and turned into the job's W&B environment
and metadata (the run's id is the submission id, its group the chain's first job, its folder the job's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.jobs import WANDB_PROJECT_KEY, WANDB_URL_KEY, JobController
from control.jobspec import JobSpec
from core.errors import InputError
from core.lineage import Lineage

BASE = {"name": "grpo", "entrypoint": "python train.py", "owner": "alice"}


def call_of(tmp_path: Path, spec: JobSpec, lineage: Lineage | None = None) -> dict:
    jobs = JobController("http://127.0.0.1:1", tmp_path)
    return jobs.submit_call(spec, "grpo-1-r2", tmp_path / "jobs" / "grpo-1-r2", lineage=lineage)


def test_an_offline_run_lands_in_the_job_folder_under_the_submission_id(tmp_path: Path) -> None:
    spec = JobSpec.from_dict({**BASE, "wandb": {"project": "qwen-grpo"}})
    call = call_of(tmp_path, spec, Lineage(of="grpo-1-r1", root="grpo-1", attempt=2))
    env = call["runtime_env"]["env_vars"]
    assert {k: v for k, v in env.items() if k.startswith("WANDB_")} == {
        "WANDB_PROJECT": "qwen-grpo", "WANDB_NAME": "grpo", "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "jobs" / "grpo-1-r2"), "WANDB_RUN_ID": "grpo-1-r2", "WANDB_RUN_GROUP": "grpo-1"}
    assert call["metadata"][WANDB_PROJECT_KEY] == "qwen-grpo" and WANDB_URL_KEY not in call["metadata"]


def test_an_online_run_with_an_entity_has_a_url(tmp_path: Path) -> None:
    spec = JobSpec.from_dict({**BASE, "wandb": {"project": "p", "entity": "team-a", "mode": "online",
                                                "run_name": "lr-3e-6", "base_url": "https://wandb.example.com/"}})
    call = call_of(tmp_path, spec)
    assert call["metadata"][WANDB_URL_KEY] == "https://wandb.example.com/team-a/p/runs/grpo-1-r2"
    env = call["runtime_env"]["env_vars"]
    assert env["WANDB_ENTITY"] == "team-a" and env["WANDB_NAME"] == "lr-3e-6" and env["WANDB_RUN_GROUP"] == "grpo-1-r2"
    assert "WANDB_PROJECT" not in call_of(tmp_path, JobSpec.from_dict(BASE))["runtime_env"]["env_vars"]


@pytest.mark.parametrize("wandb", [
    {"project": "../etc"}, {"project": ""}, {"project": "p", "mode": "cloud"}, {"project": "p", "entity": "a b"},
    {"project": "p", "base_url": "javascript:alert(1)"}, {"project": "p", "base_url": "https://x.example/a b"},
    {"project": "p", "colour": "red"}, {"run_name": "r"}, "qwen",
])
def test_bad_wandb_sections_are_refused(wandb: object) -> None:
    with pytest.raises(InputError):
        JobSpec.from_dict({**BASE, "wandb": wandb})


def test_the_env_may_not_set_what_wandb_sets_but_may_bring_a_key() -> None:
    with pytest.raises(InputError, match="WANDB_PROJECT"):
        JobSpec.from_dict({**BASE, "wandb": {"project": "p"}, "env": {"WANDB_PROJECT": "other"}})
    spec = JobSpec.from_dict({**BASE, "wandb": {"project": "p", "mode": "online"}, "env": {"WANDB_API_KEY": "k"}})
    assert spec.env == {"WANDB_API_KEY": "k"}
