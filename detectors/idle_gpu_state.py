"""What the idle-GPU detector knows of each job's idle episode, and how it is remembered across an Argus restart
(detectors/memory.py).

Remembered per job, as one JSON object: when the episode started, the last poll that saw the job idle, the
highest utilisation seen in it, and the fingerprint once it was reported (so a recovery after the restart closes
the incident the earlier process opened). Not remembered: the GPU samples (evidence only; the next idle poll
brings them again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from detectors.memory import read_number, read_optional_str, read_time, read_version

STATE_VERSION = 1


@dataclass
class GpuSample:
    uuid: str
    value: float
    at: datetime
    source: str
    hostname: str
    index: Any
    instance_host: str | None


@dataclass
class IdleEpisode:
    idle_since: datetime
    seen_idle_at: datetime  # the last poll that saw every GPU of the job idle
    fingerprint: str | None = None  # set when the episode is reported: its incident's, for the recovery
    max_util: float = 0.0
    gpu_samples: dict[str, GpuSample] = field(default_factory=dict)


def remembered(episode: IdleEpisode) -> dict[str, Any]:
    return {
        "v": STATE_VERSION,
        "idle_since": episode.idle_since.isoformat(),
        "seen_idle_at": episode.seen_idle_at.isoformat(),
        "fingerprint": episode.fingerprint,
        "max_util": episode.max_util,
    }


def recalled(value: dict[str, Any]) -> IdleEpisode:
    """The episode remembered as `value`; StateUnreadable when any part is not what this version writes."""
    read_version(value, STATE_VERSION)
    return IdleEpisode(
        idle_since=read_time(value.get("idle_since"), "idle_since"),
        seen_idle_at=read_time(value.get("seen_idle_at"), "seen_idle_at"),
        fingerprint=read_optional_str(value.get("fingerprint"), "fingerprint"),
        max_util=read_number(value.get("max_util"), "max_util"),
    )
