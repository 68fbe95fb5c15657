"""core.jobfolder: the layout of a job's folder, and ids that must not leave `jobs/`."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import InputError
from core.jobfolder import (
    SUBMISSION_ID_RE,
    JobFolder,
    JobFolders,
    check_submission_id,
    is_submission_id,
)


def test_the_layout(tmp_path: Path) -> None:
    job = JobFolder(tmp_path, "raysubmit_a-1.2")
    assert job.root == tmp_path / "jobs" / "raysubmit_a-1.2"
    assert (job.config, job.logs, job.checkpoints, job.rca, job.scene) == tuple(
        job.root / n for n in ("config", "logs", "checkpoints", "rca", "scene"))
    assert (job.spec_file, job.submit_file, job.status_file, job.resubmit_file) == tuple(
        job.root / "config" / n for n in ("jobspec.yaml", "submit.json", "status.json", "resubmit.json"))
    assert job.driver_log == job.root / "logs" / "driver.log"
    assert job.scene_of("inc-1") == job.root / "scene" / "inc-1"
    assert JobFolders(str(tmp_path)).of("raysubmit_a-1.2") == job  # a str root is a Path too
    assert JobFolders(tmp_path).jobs_dir == tmp_path / "jobs"
    assert JobFolders(tmp_path).scene_of("inc-1") == tmp_path / "scene" / "inc-1"
    assert not job.exists()
    job.root.mkdir(parents=True)
    assert job.exists()


@pytest.mark.parametrize("hostile", [
    "", ".", "..", "../x", "a/../../etc", "/etc/passwd", "a/b", "a\\b", "a\x00b", "x" * 65, "a\n", " a",
    ".hidden", "-rf", "a b", "ünïcode", "a" * 10_000_000,
])
def test_ids_that_could_leave_the_jobs_folder_are_refused(tmp_path: Path, hostile: str) -> None:
    assert not is_submission_id(hostile)
    with pytest.raises(InputError) as caught:
        JobFolder(tmp_path, hostile)
    assert "is not a valid submission id" in caught.value.message and caught.value.hint
    assert len(caught.value.message) < 200  # a huge id is not echoed whole


@pytest.mark.parametrize("wrong", [None, 5, b"abc", ["a"]])
def test_ids_that_are_not_strings_are_refused(wrong: object) -> None:
    assert not is_submission_id(wrong)
    with pytest.raises(InputError):
        check_submission_id(wrong)


@pytest.mark.parametrize("good", ["a", "raysubmit_XYZ123", "grpo-20261122T081944Z-71d9-r2", "a..b", "x" * 64])
def test_ids_argus_makes_are_accepted(good: str) -> None:
    assert is_submission_id(good) and check_submission_id(good) == good
    assert SUBMISSION_ID_RE.match(good)


def test_all_lists_job_folders_by_name_and_skips_what_argus_did_not_make(tmp_path: Path) -> None:
    folders = JobFolders(tmp_path)
    for name in ("b-job", "a-job", ".tmp", "bad name"):
        (folders.jobs_dir / name).mkdir(parents=True)
    (folders.jobs_dir / "c-file").write_text("not a folder")
    assert [f.submission_id for f in folders.all()] == ["a-job", "b-job"]


def test_all_without_a_jobs_folder_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JobFolders(tmp_path).all()
