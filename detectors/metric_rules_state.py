"""What the metric-rule detector knows of each (rule, subject) that is pending or firing, and how that is
remembered across an Argus restart (detectors/memory.py).

Remembered per (rule, subject), as one JSON object: the rule's reason and the subject's key (the pair the
detector keys its state by), since when it is active, whether it fired and then its finding's fingerprint and
subject (a recovery after the restart closes the incident the earlier process opened, and names the subject as
it did), and since when a firing one's series are absent. A restart is to the detector what an evaluation
outage is: nothing is learned in between, so a pending one goes on counting its `for` from `since`, and a
firing one absent on both sides of the restart has been absent since `absent_since`.

The memory key is the reason and the subject key, "HotGpu/gpu:GPU-1"; one too long for a memory key (a subject
built from odd labels) is the reason and a digest of the subject key. The object itself holds both in full, and
the key must be the one they make, so a row cannot be read back as another (rule, subject).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.types import Subject
from detectors.memory import StateUnreadable, read_optional_time, read_str, read_time, read_version

STATE_VERSION = 1
# Well under the store's key column (SUBJECT_ID_MAX, 512): a key it refused would fail the whole tick's save.
_MAX_KEY_CHARS = 200


@dataclass
class ActiveRule:
    """One (rule, subject) whose series are active: pending until active for the rule's `for`, then firing until
    absent for it."""

    since: datetime
    fired: bool = False
    fingerprint: str = ""  # of the finding, once fired
    subject: Subject | None = None  # of the finding, once fired
    absent_since: datetime | None = None  # a fired one's series are missing from evaluations since then


def memory_key(reason: str, subject_key: str) -> str:
    key = f"{reason}/{subject_key}"
    if len(key) <= _MAX_KEY_CHARS:
        return key
    return f"{reason}/sha256:{hashlib.sha256(subject_key.encode('utf-8')).hexdigest()}"


def remembered(reason: str, subject_key: str, active: ActiveRule) -> dict[str, Any]:
    return {
        "v": STATE_VERSION,
        "reason": reason,
        "subject_key": subject_key,
        "since": active.since.isoformat(),
        "fired": active.fired,
        "fingerprint": active.fingerprint if active.fired else None,
        "subject": None if active.subject is None else active.subject.model_dump(mode="json"),
        "absent_since": None if active.absent_since is None else active.absent_since.isoformat(),
    }


def recalled(key: str, value: dict[str, Any]) -> tuple[tuple[str, str], ActiveRule]:
    """The (reason, subject key) and state remembered as `value` under memory key `key`; StateUnreadable when any
    part of it is not what this version writes, or it does not belong under `key`."""
    read_version(value, STATE_VERSION)
    reason = read_str(value.get("reason"), "reason")
    subject_key = read_str(value.get("subject_key"), "subject_key")
    if not reason or not subject_key:
        raise StateUnreadable(f"its reason {reason!r} or subject key {subject_key!r} is empty")
    if memory_key(reason, subject_key) != key:
        raise StateUnreadable(f"it is the state of {reason} on {subject_key}, saved under another key")
    fired = value.get("fired")
    if not isinstance(fired, bool):
        raise StateUnreadable(f"fired is {fired!r}, not true or false")
    active = ActiveRule(since=read_time(value.get("since"), "since"), fired=fired,
                        absent_since=read_optional_time(value.get("absent_since"), "absent_since"))
    if not fired:
        if active.absent_since is not None:
            raise StateUnreadable("it is pending yet absent: only a firing one waits out an absence")
        return (reason, subject_key), active
    active.fingerprint = read_str(value.get("fingerprint"), "fingerprint")
    if not active.fingerprint:
        raise StateUnreadable("it fired, but its fingerprint is empty")
    try:
        active.subject = Subject.model_validate(value.get("subject"))
    except ValueError as err:
        raise StateUnreadable(f"its subject is unreadable: {err}") from None
    if active.subject.key() != subject_key:
        raise StateUnreadable(f"its subject {active.subject.key()} is not {subject_key}")
    return (reason, subject_key), active
