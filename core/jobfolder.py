"""A job's folder on shared storage: `<shared_root>/jobs/<submission_id>/{config,logs,checkpoints,rca,scene}`.

Control creates it at submit, collectors read its logs, remediation keeps scenes and resubmits from it, the
report service writes the RCA into it: one spelling of the layout for all of them. The submission id is
checked before it becomes a path part, so an id from an API call, a Ray job or an incident's attrs cannot
name a folder outside `jobs/` (`..`, `/`, NUL and over-long ids are refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError

JOBS_DIR_NAME = "jobs"
# Outside any job's folder: where keep_scene writes when the incident names no job with a folder.
SCENE_DIR_NAME = "scene"

SUBMISSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
SUBMISSION_ID_HINT = "ids are 1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit"


def is_submission_id(value: object) -> bool:
    """Whether `value` is a submission id that may name a job folder (a string the pattern accepts)."""
    return isinstance(value, str) and SUBMISSION_ID_RE.match(value) is not None


def check_submission_id(value: object) -> str:
    """`value` itself when it is a valid submission id; InputError naming it otherwise."""
    if not is_submission_id(value):
        shown = value[:80] if isinstance(value, str) else value
        raise InputError(f"{shown!r} is not a valid submission id", hint=SUBMISSION_ID_HINT)
    return value  # type: ignore[return-value]  # checked just above


@dataclass(frozen=True)
class JobFolder:
    """The folder of one job; building one checks the id, nothing touches the disk until asked."""

    shared_root: Path
    submission_id: str

    # Created at submit; rca/ and scene/ appear when a report or a scene is first written.
    SUBMIT_SUBFOLDERS = ("config", "logs", "checkpoints")

    def __post_init__(self) -> None:
        check_submission_id(self.submission_id)
        object.__setattr__(self, "shared_root", Path(self.shared_root))

    @property
    def root(self) -> Path:
        return self.shared_root / JOBS_DIR_NAME / self.submission_id

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rca(self) -> Path:
        """RCA reports, `<incident>.md` and `.json`."""
        return self.root / "rca"

    @property
    def scene(self) -> Path:
        """Kept scenes, one folder per incident."""
        return self.root / "scene"

    # -- files in config/ ------------------------------------------------------------------------------

    @property
    def spec_file(self) -> Path:
        """The JobSpec as submitted."""
        return self.config / "jobspec.yaml"

    @property
    def submit_file(self) -> Path:
        """The arguments given to Ray's submit_job."""
        return self.config / "submit.json"

    @property
    def status_file(self) -> Path:
        """Argus's mark on the job (stopped on purpose, and why)."""
        return self.config / "status.json"

    @property
    def adopted_file(self) -> Path:
        """For a job Argus did not submit: Ray's record of it (control/adopt.py), as kept or resubmitted."""
        return self.config / "adopted.json"

    @property
    def resubmit_file(self) -> Path:
        """Which job and incident this one was resubmitted for."""
        return self.config / "resubmit.json"

    @property
    def driver_log(self) -> Path:
        """The driver's log, saved when the job ends."""
        return self.logs / "driver.log"

    def scene_of(self, incident_id: str) -> Path:
        return self.scene / incident_id

    def exists(self) -> bool:
        return self.root.is_dir()


@dataclass(frozen=True)
class JobFolders:
    """Every job's folder under one shared root."""

    shared_root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "shared_root", Path(self.shared_root))

    @property
    def jobs_dir(self) -> Path:
        return self.shared_root / JOBS_DIR_NAME

    def of(self, submission_id: str) -> JobFolder:
        """The folder of one job; InputError when the id could name a path outside `jobs/`."""
        return JobFolder(self.shared_root, submission_id)

    def scene_of(self, incident_id: str) -> Path:
        """A scene that belongs to no job: `<shared_root>/scene/<incident>`."""
        return self.shared_root / SCENE_DIR_NAME / incident_id

    def all(self) -> list[JobFolder]:
        """The folders under `jobs/` by name, those whose name is a submission id (anything else there was
        not made by Argus). Raises OSError when `jobs/` cannot be listed."""
        return [JobFolder(self.shared_root, entry.name) for entry in sorted(self.jobs_dir.iterdir())
                if entry.is_dir() and is_submission_id(entry.name)]
