"""Job artifact cleanup: keep a job's last N checkpoints and delete the older ones.

A checkpoint is an entry of `<job dir>/checkpoints/` whose name carries a step number (verl's
`global_step_120`, Megatron's `iter_0000120`, HF Trainer's `checkpoint-120`, DeepSpeed's `global_step120`,
`step_120.pt`). Entries without a number (tracker files such as verl's `latest_checkpointed_iteration.txt`,
DeepSpeed's `latest`, READMEs) are never touched. The checkpoint a tracker file names is always kept, even
when it is not among the last N: resuming reads it.

Safety: nothing outside the job's checkpoints folder is deleted. A symlinked checkpoint is removed as a link
(its target is left alone), and the folder itself must not be a link that leads elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ArgusError, InputError

MAX_KEEP = 1000
_STEP_RE = re.compile(r"^(?:global_step|checkpoint|iter|step|epoch|ckpt)[-_]?(\d{1,12})(?:\.[A-Za-z0-9]+)*\Z")
TRACKER_FILES = ("latest_checkpointed_iteration.txt", "latest", "latest_checkpointed_iteration")


@dataclass(frozen=True)
class Checkpoint:
    name: str
    step: int
    bytes: int


@dataclass(frozen=True)
class CleanupPlan:
    """What cleanup keeps and removes; `done` says whether the removal happened (False: a dry run)."""

    folder: Path
    keep_last: int
    kept: tuple[Checkpoint, ...]
    removed: tuple[Checkpoint, ...]
    pinned: str | None = None  # the checkpoint a tracker file names, kept whatever its age
    done: bool = False
    errors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def freed_bytes(self) -> int:
        return sum(c.bytes for c in self.removed) if self.done else 0


def step_of(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    total = 0
    for root, _dirs, files in os.walk(path):  # os.walk does not follow links into other folders
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return total


def _pinned(folder: Path) -> int | None:
    """The step a tracker file in `folder` names, if any."""
    for tracker in TRACKER_FILES:
        path = folder / tracker
        if path.is_file() and not path.is_symlink():
            try:
                text = path.read_text(encoding="utf-8", errors="replace")[:200].strip()
            except OSError:
                continue
            digits = re.search(r"(\d{1,12})\s*$", text)
            if digits:
                return int(digits.group(1))
    return None


def plan_cleanup(job_dir: Path, keep_last: int) -> CleanupPlan:
    """Which checkpoints of the job in `job_dir` go; changes nothing."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or not 1 <= keep_last <= MAX_KEEP:
        raise InputError(f"keep_last must be a whole number from 1 to {MAX_KEEP}, got {keep_last!r}",
                         hint="keep at least the latest checkpoint: resuming needs it")
    folder = job_dir / "checkpoints"
    if folder.is_symlink() or (folder.exists() and folder.resolve().parent != job_dir.resolve()):
        raise ArgusError(f"{folder} is a link out of the job's folder; refusing to delete through it",
                         hint="clean it by hand after checking where it leads")
    if not folder.is_dir():
        return CleanupPlan(folder=folder, keep_last=keep_last, kept=(), removed=())
    found = [(step, entry) for entry in folder.iterdir() if (step := step_of(entry.name)) is not None]
    found.sort(key=lambda item: (item[0], item[1].name), reverse=True)
    pin = _pinned(folder)
    kept: list[Checkpoint] = []
    removed: list[Checkpoint] = []
    pinned_name = None
    for index, (step, entry) in enumerate(found):
        checkpoint = Checkpoint(name=entry.name, step=step, bytes=_size(entry))
        if index < keep_last or step == pin:
            kept.append(checkpoint)
            if step == pin:
                pinned_name = entry.name
        else:
            removed.append(checkpoint)
    return CleanupPlan(folder=folder, keep_last=keep_last, kept=tuple(kept), removed=tuple(removed),
                       pinned=pinned_name)


def apply_cleanup(plan: CleanupPlan) -> CleanupPlan:
    """Delete what `plan` removes; a failure on one entry is recorded and the rest go on."""
    errors: list[str] = []
    gone: list[Checkpoint] = []
    for checkpoint in plan.removed:
        path = plan.folder / checkpoint.name
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)
            gone.append(checkpoint)
        except FileNotFoundError:
            gone.append(checkpoint)  # removed meanwhile: the goal holds
        except OSError as exc:
            errors.append(f"{checkpoint.name}: {exc.strerror or exc}")
    return CleanupPlan(folder=plan.folder, keep_last=plan.keep_last, kept=plan.kept, removed=tuple(gone),
                       pinned=plan.pinned, done=True, errors=tuple(errors))
