"""Signals about jobs waiting for a place, as collectors.ray_state emits them (the keys are core.signal_keys'): a
node with what it has in all and free, a PENDING job with its driver's demand, a RUNNING job with placement groups
Ray has not placed."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from core import signal_keys as keys
from core.types import Signal, SignalKind, Subject, SubjectKind
from tests.support import T0


def node(ip: str, total: dict[str, float], free: dict[str, float] | None, *, at: datetime = T0,
         labels: dict[str, str] | None = None, state: str = "ALIVE") -> Signal:
    """A Ray node; `free` None: Ray's autoscaler report was not read this poll."""
    return Signal(kind=SignalKind.NODE_STATE, source="ray.state", observed_at=at,
                  subject=Subject(kind=SubjectKind.NODE, id=f"node-{ip}", name=ip),
                  attrs={keys.STATE: state, keys.NODE_IP: ip, keys.LABELS: dict(labels or {}),
                         keys.RESOURCES_TOTAL: dict(total), keys.RESOURCES_AVAILABLE: free, keys.JOBS: []})


def job(sid: str, status: str, *, at: datetime = T0, submitted: datetime | None = None,
        demand: dict[str, float] | None = None, selector: dict[str, str] | None = None,
        groups: list[dict[str, Any]] | None = None, placed: list[str] | None = None,
        job_id: str = "02000000") -> Signal:
    """A job's state; `groups` None: its placement groups were not read this poll; `placed`: its placed groups' ids
    (None: as `groups`, unread or none)."""
    attrs: dict[str, Any] = {
        keys.STATUS: status, keys.SUBMISSION_ID: sid, keys.JOB_ID: job_id, keys.ENTRYPOINT: "python train.py",
        keys.START_TIME: (submitted or at).isoformat(), keys.END_TIME: None, keys.METADATA: {},
        keys.ENTRYPOINT_RESOURCES: dict(demand or {}), keys.LABEL_SELECTOR: selector,
        keys.WAITING_GROUPS: groups, keys.PLACED_GROUPS: placed if placed is not None or groups is None else [],
    }
    return Signal(kind=SignalKind.JOB_STATE, source="ray.jobs", observed_at=at, attrs=attrs,
                  subject=Subject(kind=SubjectKind.JOB, id=sid, name="grpo"))


def group(bundles: list[dict[str, float]], *, since: datetime = T0, strategy: str | None = "STRICT_SPREAD",
          selectors: list[dict[str, str]] | None = None, gid: str = "3f2a1c9e0d4b", name: str | None = None,
          state: str = "PENDING", scheduling: str | None = "INFEASIBLE") -> dict[str, Any]:
    return {keys.GROUP_ID: gid, keys.GROUP_NAME: name, keys.STATE: state, keys.BUNDLES: bundles,
            keys.BUNDLE_SELECTORS: selectors or [{} for _ in bundles], keys.STRATEGY: strategy,
            keys.SCHEDULING_STATE: scheduling, keys.SINCE: since.isoformat()}


def gpu_cluster(at: datetime = T0) -> list[Signal]:
    """A CPU-only head and three GPU workers with 8, 8 and 4 GPUs free of 8 each."""
    return [node("10.0.0.1", {"CPU": 8}, {"CPU": 8}, at=at),
            node("10.0.0.2", {"CPU": 32, "GPU": 8}, {"CPU": 32, "GPU": 8}, at=at),
            node("10.0.0.3", {"CPU": 32, "GPU": 8}, {"CPU": 30, "GPU": 8}, at=at),
            node("10.0.0.4", {"CPU": 32, "GPU": 8}, {"CPU": 28, "GPU": 4}, at=at, labels={"argus.io/pool": "h100"})]


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)
