"""A resubmitted job and the job it resubmits: the id scheme and the Ray job metadata that link them.

Remediation's resubmit_job names the new job `<root[:56]>-r<attempt>` (root: the first job of the chain of
resubmissions, attempt counting from 1; Ray refuses a second job with one id, so a retried resubmit cannot
start the job twice) and gives it Ray job metadata naming the job it resubmits, the chain's root and the
attempt (`Lineage.metadata()`, written by control.jobs). Detectors read both back from the JOB_STATE signals
of ray_state (detectors/resubmissions.py) to tell when the job of a fault runs again. Written once here so the
side that writes and the side that reads cannot spell them differently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Ray job metadata keys (Ray keeps metadata as str -> str, so the attempt is written as text).
RESUBMIT_OF = "argus_resubmit_of"
RESUBMIT_ROOT = "argus_resubmit_root"
RESUBMIT_ATTEMPT = "argus_resubmit_attempt"
# What a job may say about its checkpoints (a JobSpec's checkpoint_dir and resume_flag, or `ray job submit
# --metadata-json` for a job Argus did not submit): read by remediation/resume.py when it is resubmitted.
CHECKPOINT_DIR_KEY = "argus_checkpoint_dir"
RESUME_FLAG_KEY = "argus_resume_flag"
# control.jobs marks every job it submits with metadata argus=1.
SUBMITTED_BY_ARGUS = "argus"

ROOT_CHARS = 56  # the root's share of the id: 56 + "-r" + the attempt stays within a submission id's 64 characters
_RESUBMISSION_ID = re.compile(r"^(?P<stem>.+)-r(?P<attempt>[1-9]\d{0,5})\Z")


def resubmission_id(root: str, attempt: int) -> str:
    """The submission id of the `attempt`-th resubmission of the chain that starts with job `root`."""
    return f"{root[:ROOT_CHARS]}-r{attempt}"


def parse_resubmission_id(submission_id: str) -> tuple[str, int] | None:
    """(the root's first 56 characters, the attempt) when `submission_id` has the shape of a resubmission's id;
    None otherwise. The shape alone proves nothing (anyone may name a job `x-r1`): see `submitted_by_argus`."""
    m = _RESUBMISSION_ID.match(submission_id)
    if m is None or len(m["stem"]) > ROOT_CHARS:
        return None
    return m["stem"], int(m["attempt"])


def submitted_by_argus(metadata: Mapping[str, object]) -> bool:
    return metadata.get(SUBMITTED_BY_ARGUS) == "1"


@dataclass(frozen=True)
class Lineage:
    """Where a resubmitted job comes from: the job it resubmits (`of`), the chain's first job and its attempt."""

    of: str
    root: str
    attempt: int

    def metadata(self) -> dict[str, str]:
        return {RESUBMIT_OF: self.of, RESUBMIT_ROOT: self.root, RESUBMIT_ATTEMPT: str(self.attempt)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, object]) -> Lineage | None:
        """The lineage Argus wrote into a job's metadata; None when it is absent or not whole (metadata is
        anyone's to write, so a half-written one is not trusted)."""
        of, root, attempt = (metadata.get(k) for k in (RESUBMIT_OF, RESUBMIT_ROOT, RESUBMIT_ATTEMPT))
        if not (isinstance(of, str) and of and isinstance(root, str) and root and isinstance(attempt, str)):
            return None
        if not attempt.isdigit() or int(attempt) < 1:
            return None
        return cls(of=of, root=root, attempt=int(attempt))
