"""Checkpoint cleanup on real folders: the newest N stay, the tracked one stays, links are not followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.artifacts import apply_cleanup, plan_cleanup, step_of
from core.errors import ArgusError, InputError


def checkpoint(folder: Path, name: str, size: int = 10) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(b"x" * size)
    return path


@pytest.mark.parametrize(
    ("name", "step"),
    [("global_step_120", 120), ("global_step120", 120), ("iter_0000120", 120), ("checkpoint-120", 120),
     ("step_7.pt", 7), ("epoch_3", 3), ("ckpt-15.safetensors", 15),
     ("latest_checkpointed_iteration.txt", None), ("latest", None), ("README.md", None), ("global_step_", None),
     ("global_step_1\n", None), ("global_step_1/../x", None)],
)
def test_step_numbers_are_read_from_common_checkpoint_names(name: str, step: int | None) -> None:
    assert step_of(name) == step


def test_keeps_the_newest_and_the_tracked_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40, 100):
        checkpoint(folder, f"global_step_{step}", size=step)
    (folder / "latest_checkpointed_iteration.txt").write_text("20\n")
    (folder / "notes.txt").write_text("keep me")

    plan = plan_cleanup(tmp_path, keep_last=2)
    assert [c.name for c in plan.kept] == ["global_step_100", "global_step_40", "global_step_20"]
    assert plan.pinned == "global_step_20"
    assert sorted(c.name for c in plan.removed) == ["global_step_10", "global_step_30"]
    assert all((folder / c.name).exists() for c in plan.removed), "planning deleted something"
    assert plan.freed_bytes == 0

    done = apply_cleanup(plan)
    assert done.done and not done.errors and done.freed_bytes == 40
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["global_step_100", "global_step_20", "global_step_40", "latest_checkpointed_iteration.txt",
                    "notes.txt"]


def test_numeric_order_not_name_order(tmp_path: Path) -> None:
    for step in (9, 10, 100):
        checkpoint(tmp_path / "checkpoints", f"checkpoint-{step}")
    plan = plan_cleanup(tmp_path, keep_last=1)
    assert [c.name for c in plan.kept] == ["checkpoint-100"]


def test_a_linked_checkpoint_is_unlinked_and_its_target_kept(tmp_path: Path) -> None:
    outside = checkpoint(tmp_path / "elsewhere", "precious")
    folder = tmp_path / "job" / "checkpoints"
    checkpoint(folder, "global_step_2")
    (folder / "global_step_1").symlink_to(outside, target_is_directory=True)
    done = apply_cleanup(plan_cleanup(tmp_path / "job", keep_last=1))
    assert [c.name for c in done.removed] == ["global_step_1"]
    assert not (folder / "global_step_1").exists() and (outside / "model.pt").is_file()


def test_a_checkpoints_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    checkpoint(real, "global_step_1")
    checkpoint(real, "global_step_2")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "checkpoints").symlink_to(real, target_is_directory=True)
    with pytest.raises(ArgusError, match="link out of the job's folder"):
        plan_cleanup(tmp_path / "job", keep_last=1)
    assert (real / "global_step_1").is_dir()


@pytest.mark.parametrize("keep", [0, -1, 10_001, True, 1.5, "2"])
def test_keep_last_must_be_a_sane_whole_number(tmp_path: Path, keep: object) -> None:
    with pytest.raises(InputError, match="keep_last"):
        plan_cleanup(tmp_path, keep_last=keep)


def test_no_checkpoints_folder_is_an_empty_plan(tmp_path: Path) -> None:
    plan = plan_cleanup(tmp_path, keep_last=3)
    assert plan.kept == () and plan.removed == ()
    assert apply_cleanup(plan).freed_bytes == 0
