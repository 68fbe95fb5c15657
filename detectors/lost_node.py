"""Lost node: a Ray node that Ray has declared DEAD, with the jobs that had work on it.

Planned ends are not losses: Ray's "Expected termination" (a graceful `ray stop`), "Terminated due to
idle" (the autoscaler), and a preemption drain Argus itself asked for (its reason starts with "argus:",
see control/node_manager.py). A preemption anyone else asked for (a spot reclaim, an operator's
drain-node) still is one: jobs lose their ranks without having planned it.

Stateful: a node that was ALIVE and is now DEAD is reported once per process; after a restart of Argus,
nodes that died within the lookback window are reported again and the store folds the repeat into the
same incident (the fingerprint is the node id). Nodes that died before the window are history.

Recovery (`recoveries()`), whichever comes first:
- the host rejoined: it comes back to Ray as a new node (a new node id) with the same IP. When a node with the
  IP of a node reported lost is ALIVE again, the lost node's incident may close.
- the jobs it hit run again: every job the finding listed as active (RUNNING or PENDING when the node died)
  runs again. A job runs again when a resubmission of it reached RUNNING (detectors/resubmissions.py); one that
  was PENDING when it is RUNNING; one that was RUNNING when it is still RUNNING `job_survives_s` after the
  death (default 600 s, NCCL's default collective timeout: ranks that lost a peer on the node fail by then,
  so a job still RUNNING carried on without the node; a hang past it is the stall detector's incident), or
  when it SUCCEEDED after all. A node that listed no active job has no jobs to wait for: only its host closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from core import signal_keys as keys
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    utcnow,
)
from detectors.resubmissions import JobRuns
from detectors.timestamps import parse_iso

ACTION = (
    "Check the node's host (power, network, kernel log, raylet.out and gcs_server.out); resubmit the jobs "
    "that had ranks there from their last checkpoint; drain the node if it rejoins and fails again."
)


ACTIVE = frozenset({None, "RUNNING", "PENDING"})  # a listed job's status while it had work on the node
PLANNED_PREFIXES = ("Expected termination", "Terminated due to idle", "Terminated due to preemption: argus:")


def planned_end(state_message: str | None) -> bool:
    """Whether Ray's state message of a DEAD node says it was ended on purpose (see the module docstring)."""
    return (state_message or "").strip().startswith(PLANNED_PREFIXES)


@dataclass
class _Lost:
    """A node reported lost, until its fault ends: what either way of recovering needs."""

    ip: str | None
    fingerprint: str
    died_at: datetime
    jobs: dict[str, str | None]  # the jobs active on it when it died (submission id, else Ray job id) -> status


class LostNodeDetector:
    name = "lost_node"

    def __init__(self, *, lookback_s: float = 3600.0, job_survives_s: float = 600.0,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.lookback = timedelta(seconds=lookback_s)
        self.job_survives = timedelta(seconds=job_survives_s)
        self._clock = clock
        self._reported: set[str] = set()
        self._lost: dict[str, _Lost] = {}  # node id -> the lost node, until its host rejoins or its jobs run again
        self._runs = JobRuns()
        self._recovered: list[Recovery] = []

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        self._runs.observe(signals)
        findings = []
        for signal in signals:
            if signal.kind is not SignalKind.NODE_STATE or signal.attrs.get(keys.STATE) != "DEAD":
                continue
            node_id = signal.subject.id
            if node_id in self._reported:
                continue
            died_at = parse_iso(signal.attrs.get(keys.END_TIME)) or signal.observed_at
            if self._clock() - died_at > self.lookback:
                self._reported.add(node_id)
                continue
            self._reported.add(node_id)
            if planned_end(signal.attrs.get(keys.STATE_MESSAGE)):
                continue
            finding = self._finding(signal, died_at)
            findings.append(finding)
            ip = signal.attrs.get(keys.NODE_IP)
            self._lost[node_id] = _Lost(ip if isinstance(ip, str) and ip else None, finding.fingerprint, died_at,
                                        _active_jobs(signal.attrs.get(keys.JOBS)))
        self._rejoined(signals)
        self._jobs_back()
        return findings

    def recoveries(self) -> list[Recovery]:
        """Lost nodes whose host is ALIVE in Ray again, or whose jobs run again, since the last call (see the module
        docstring)."""
        done, self._recovered = self._recovered, []
        return done

    def _rejoined(self, signals: Sequence[Signal]) -> None:
        if not self._lost:
            return
        alive = {
            str(s.attrs.get(keys.NODE_IP)): s.subject.id
            for s in signals
            if s.kind is SignalKind.NODE_STATE and s.attrs.get(keys.STATE) == "ALIVE" and s.attrs.get(keys.NODE_IP)
        }
        for node_id, lost in list(self._lost.items()):
            new_id = alive.get(lost.ip) if lost.ip else None
            if new_id is None or new_id == node_id:
                continue
            del self._lost[node_id]
            self._recovered.append(Recovery(
                fingerprint=lost.fingerprint, detector=self.name, observed_at=self._clock(),
                reason=f"host {lost.ip} rejoined Ray and is ALIVE as node {new_id} (was {node_id})"))

    def _jobs_back(self) -> None:
        now = self._clock()
        for node_id, lost in list(self._lost.items()):
            if not lost.jobs:
                continue
            how = [self._running_again(job, was, lost.died_at, now) for job, was in lost.jobs.items()]
            if not all(how):
                continue
            del self._lost[node_id]
            where = f"{lost.ip} ({node_id})" if lost.ip else node_id
            self._recovered.append(Recovery(
                fingerprint=lost.fingerprint, detector=self.name, observed_at=now,
                reason=f"every job that had work on node {where} runs again: {'; '.join(h for h in how if h)}"))

    def _running_again(self, job: str, was: str | None, died_at: datetime, now: datetime) -> str | None:
        """How `job` runs again since its node died (for the reason), or None while it does not."""
        new = self._runs.resubmission_ran(job)
        if new is not None:
            return f"{job} was resubmitted as {new}, which reached RUNNING"
        status = self._runs.status(job)
        if status == "SUCCEEDED":
            return f"{job} SUCCEEDED"
        if status != "RUNNING":
            return None
        if was == "PENDING":
            return f"{job} was PENDING and is RUNNING"
        survived = (now - died_at).total_seconds()
        if now - died_at >= self.job_survives:
            return f"{job} is still RUNNING {survived:.0f} s after the node died"
        return None

    def _finding(self, signal: Signal, died_at: datetime) -> Finding:
        attrs = signal.attrs
        ip = attrs.get(keys.NODE_IP) or "unknown IP"
        reason = (attrs.get(keys.STATE_MESSAGE) or "no reason given by Ray").strip()
        jobs = attrs.get(keys.JOBS) or []
        active = [j for j in jobs if j.get("status") in ACTIVE]
        names = [j.get("submission_id") or j.get("job_id") for j in jobs]
        who = f"; jobs with work there: {', '.join(names)}" if names else "; no jobs had work there"
        role = "head node" if attrs.get(keys.IS_HEAD_NODE) else "node"
        evidence = [
            Evidence(
                source=signal.source,
                text=f"node {signal.subject.id} ({ip}) state=DEAD: {reason}",
                at=died_at,
            )
        ]
        evidence += [
            Evidence(
                source="ray.jobs",
                text=f"job {j.get('submission_id') or j.get('job_id')} status={j.get('status')} "
                f"entrypoint={(j.get('entrypoint') or '')[:200]}",
            )
            for j in jobs[:10]
        ]
        return Finding(
            category=Category.NODE_LOST,
            reason="RayNodeDead",
            subject=signal.subject,
            summary=f"Ray {role} {ip} died: {reason}{who}",
            severity=Severity.CRITICAL if active or attrs.get(keys.IS_HEAD_NODE) else Severity.WARNING,
            confidence=1.0,
            evidence=tuple(evidence),
            first_seen=died_at,
            detected_at=self._clock(),
            recommended_action=ACTION,
            attrs={
                keys.NODE_ID: signal.subject.id,
                keys.NODE_IP: attrs.get(keys.NODE_IP),
                "death_reason": reason,
                "died_at": died_at.isoformat(),
                keys.JOBS: jobs,
            },
        )


def _active_jobs(listed: object) -> dict[str, str | None]:
    """The jobs a DEAD node's signal lists as active when it died (as the finding counts them): id -> status."""
    active: dict[str, str | None] = {}
    for job in listed if isinstance(listed, (list, tuple)) else ():
        if not isinstance(job, dict) or job.get(keys.STATUS) not in ACTIVE:
            continue
        key = job.get(keys.SUBMISSION_ID) or job.get(keys.JOB_ID)
        if isinstance(key, str) and key:
            active[key] = job.get(keys.STATUS)
    return active
