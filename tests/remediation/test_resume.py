"""How a resubmitted job resumes (remediation/resume.py): the trainer's command found by parsing the entrypoint as
shell, the checkpoint given where the trainer takes it (never after a pipe), the chain's newest checkpoint, and a
clear reason when it cannot resume. Hydra's own override parser checks that what Argus adds is valid for verl."""

from __future__ import annotations

import shlex
from pathlib import Path

import bashlex
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from remediation.resume import exit_status_is_the_trainers, latest_in, plan_resume, trainer_command

VERL = "python3 -m verl.trainer.main_ppo data.train_files=/d/train.parquet actor_rollout_ref.model.path=/m"


def verl_dir(root: Path, steps: list[int], tracker: int | None = None) -> Path:
    for step in steps:
        (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(f"{tracker}\n")
    return root


def trainer_argv(entrypoint: str) -> list[str]:
    """The words of the trainer's command in `entrypoint`, as the shell will pass them."""
    return trainer_command(entrypoint).argv


def plan(entrypoint: str, *, env: dict[str, str] | None = None, metadata: dict[str, str] | None = None,
         chain: list[Path] | None = None, cwd: str | None = None, adopted: bool = True):  # type: ignore[no-untyped-def]
    return plan_resume(entrypoint, env=env or {}, metadata=metadata or {}, chain_folders=chain or [], cwd=cwd,
                       adopted=adopted)


def test_verl_overrides_go_on_the_trainer_command_before_its_redirection_and_pipe(tmp_path: Path) -> None:
    ckpt = verl_dir(tmp_path / "ckpt", [5, 10], tracker=10)
    entry = f"cd /nfs/code && {VERL} trainer.default_local_dir={ckpt} 2>&1 | tee train.log"
    result = plan(entry)
    assert result.resumes and result.how == "verl" and result.checkpoint.step == 10
    argv = trainer_argv(result.entrypoint)
    assert argv[-2:] == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}/global_step_10"]
    assert result.entrypoint.endswith("2>&1 | tee train.log")  # the pipe still gets the trainer's output
    assert result.entrypoint.startswith(f"cd /nfs/code && {VERL}")
    OverridesParser.create().parse_overrides(argv[3:])  # Hydra accepts every override, Argus's included
    assert "verl overrides trainer.resume_mode=resume_path" in result.describe()
    assert "step 10" in result.describe()


def test_a_key_the_user_gave_is_replaced_in_place_never_given_twice(tmp_path: Path) -> None:
    ckpt = verl_dir(tmp_path / "c", [20])
    entry = (f"{VERL} trainer.resume_mode=disable +trainer.resume_from_path=/old/global_step_1 "
             f"trainer.default_local_dir={ckpt} trainer.resume_mode=auto")
    argv = trainer_argv(plan(entry).entrypoint)
    assert [a for a in argv if "resume_mode" in a] == ["trainer.resume_mode=resume_path"]
    assert [a for a in argv if "resume_from_path" in a] == [f"+trainer.resume_from_path={ckpt}/global_step_20"]
    assert "" not in argv


def test_a_relative_checkpoint_dir_is_read_from_the_directory_the_command_cd_into(tmp_path: Path) -> None:
    verl_dir(tmp_path / "checkpoints" / "proj" / "exp1", [3, 6], tracker=6)
    entry = f"cd {tmp_path} && {VERL} trainer.project_name=proj trainer.experiment_name=exp1"
    result = plan(entry)
    assert result.checkpoint.path == tmp_path / "checkpoints" / "proj" / "exp1" / "global_step_6"


def test_the_tracker_file_wins_over_a_newer_folder_that_may_be_half_written(tmp_path: Path) -> None:
    folder = verl_dir(tmp_path, [40, 45], tracker=40)
    assert latest_in(folder).step == 40
    (folder / "latest_checkpointed_iteration.txt").write_text("garbage")
    assert latest_in(folder).step == 45  # an unreadable tracker: the highest step


def test_a_resume_flag_value_is_replaced_and_a_declared_flag_is_added(tmp_path: Path) -> None:
    ckpts = tmp_path / "ck"
    ckpts.mkdir()
    for step in (5, 15):
        (ckpts / f"step_{step}.ckpt").write_text(str(step))
    given = plan(f"python train.py --ckpt-dir {ckpts} --resume {ckpts}/step_5.ckpt > out.log")
    assert trainer_argv(given.entrypoint)[-2:] == ["--resume", f"{ckpts}/step_15.ckpt"]
    assert given.entrypoint.endswith("> out.log")
    equals = plan(f"python train.py --resume={ckpts}/step_5.ckpt")
    assert trainer_argv(equals.entrypoint)[-1] == f"--resume={ckpts}/step_15.ckpt"
    declared = plan(f"python train.py --ckpt-dir {ckpts} | tee log", metadata={"argus_resume_flag": "--resume"})
    assert declared.how == "flag" and trainer_argv(declared.entrypoint)[-2:] == ["--resume", f"{ckpts}/step_15.ckpt"]


def test_an_adopted_job_whose_trainer_takes_no_checkpoint_is_not_resumable_and_says_why(tmp_path: Path) -> None:
    ckpts = tmp_path / "ck"
    (ckpts / "step_5.ckpt").parent.mkdir()
    (ckpts / "step_5.ckpt").write_text("5")
    result = plan(f"python train.py --ckpt-dir {ckpts}")
    assert not result.resumes and "argus_resume_flag" in result.problem
    assert result.describe().startswith("from scratch")
    # The same job submitted through Argus is told through ARGUS_RESUME_FROM, its documented contract.
    own = plan(f"python train.py --ckpt-dir {ckpts}", adopted=False)
    assert own.resumes and own.how == "env" and own.env["ARGUS_RESUME_FROM"] == str(ckpts / "step_5.ckpt")


def test_no_checkpoint_anywhere_names_where_it_looked(tmp_path: Path) -> None:
    result = plan(f"{VERL} trainer.default_local_dir={tmp_path}/none", chain=[tmp_path / "jobs" / "a"])
    assert not result.resumes
    assert f"{tmp_path}/none" in result.problem and "jobs/a/checkpoints" in result.problem


def test_the_chain_of_resubmissions_is_searched_and_its_newest_step_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "jobs" / "a", tmp_path / "jobs" / "a-r1"
    verl_dir(first / "checkpoints", [10, 20])
    verl_dir(second / "checkpoints", [25])
    entry = f"{VERL} trainer.default_local_dir=$ARGUS_JOB_DIR/checkpoints"
    result = plan(entry, env={"ARGUS_JOB_DIR": str(second)}, chain=[second, first], adopted=False)
    assert result.checkpoint.path == second / "checkpoints" / "global_step_25"
    stale = plan(entry, env={"ARGUS_JOB_DIR": str(first)}, chain=[second, first], adopted=False)
    assert stale.checkpoint.step == 25


def test_a_path_hydra_would_read_as_a_sweep_is_quoted_for_hydra(tmp_path: Path) -> None:
    ckpt = verl_dir(tmp_path / "a,b c", [7])
    argv = trainer_argv(plan(f"{VERL} trainer.default_local_dir='{ckpt}'").entrypoint)
    [parsed] = OverridesParser.create().parse_overrides([a for a in argv if a.startswith("trainer.resume_from")])
    assert parsed.value() == f"{ckpt}/global_step_7"


@pytest.mark.parametrize("entry", ["cd 'unterminated && python train.py", "$(", "| |", "a" * 5000 + " ' "])
def test_an_entrypoint_that_is_not_shell_is_not_resumed_when_adopted(tmp_path: Path, entry: str) -> None:
    ckpt = verl_dir(tmp_path / "c", [5])
    result = plan(entry, metadata={"argus_checkpoint_dir": str(ckpt)})
    assert not result.resumes and result.entrypoint == entry
    assert "shell" in result.problem or "command" in result.problem


def test_a_hostile_declared_flag_is_ignored(tmp_path: Path) -> None:
    ckpts = tmp_path / "ck"
    ckpts.mkdir()
    (ckpts / "step_5.ckpt").write_text("5")
    result = plan(f"python train.py --ckpt-dir {ckpts}", metadata={"argus_resume_flag": "--x; rm -rf /"})
    assert not result.resumes  # never put on a command line
    quoted = plan(f"python train.py --resume {ckpts}/step_5.ckpt",
                  metadata={"argus_checkpoint_dir": str(ckpts / "$(reboot)")})
    assert "reboot" not in quoted.entrypoint


def test_the_new_entrypoint_parses_as_shell_and_quotes_what_it_adds(tmp_path: Path) -> None:
    ckpt = verl_dir(tmp_path / "it's here", [9])
    result = plan(f"{VERL} trainer.default_local_dir=\"{ckpt}\" ; echo done")
    bashlex.parse(result.entrypoint)
    assert result.entrypoint.endswith(" ; echo done")
    [override] = [a for a in trainer_argv(result.entrypoint) if a.startswith("trainer.resume_from_path=")]
    [parsed] = OverridesParser.create().parse_overrides([override])
    assert parsed.value() == f"{ckpt}/global_step_9"


def test_a_trainer_inside_bash_c_is_resumed_inside_its_script(tmp_path: Path) -> None:
    """`ray job submit -- bash -c "cd x && python -m verl... | tee log"`: the script is planned and quoted back."""
    ckpt = verl_dir(tmp_path / "ck", [12], tracker=12)
    script = f"cd /nfs/code && {VERL} trainer.default_local_dir={ckpt} 2>&1 | tee train.log"
    result = plan(f"bash -c {shlex.quote(script)}")
    assert result.resumes and result.how == "verl"
    outer = shlex.split(result.entrypoint)
    assert outer[:2] == ["bash", "-c"] and len(outer) == 3
    assert trainer_argv(outer[2])[-1] == f"trainer.resume_from_path={ckpt}/global_step_12"
    assert outer[2].endswith("2>&1 | tee train.log")
    assert not exit_status_is_the_trainers(f"bash -c {shlex.quote(script)}")
    assert exit_status_is_the_trainers(f"bash -c {shlex.quote(VERL)}")
