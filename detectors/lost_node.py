"""Lost node: a Ray node that Ray has declared DEAD, with the jobs that had work on it.

Stateful: a node that was ALIVE and is now DEAD is reported once per process; after a restart of Argus,
nodes that died within the lookback window are reported again and the store folds the repeat into the
same incident (the fingerprint is the node id). Nodes that died before the window are history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from core.types import (
    Category,
    Evidence,
    Finding,
    Severity,
    Signal,
    SignalKind,
    utcnow,
)
from detectors.timestamps import parse_iso

ACTION = (
    "Check the node's host (power, network, kernel log, raylet.out and gcs_server.out); resubmit the jobs "
    "that had ranks there from their last checkpoint; drain the node if it rejoins and fails again."
)


class LostNodeDetector:
    name = "lost_node"

    def __init__(self, *, lookback_s: float = 3600.0, clock: Callable[[], datetime] = utcnow) -> None:
        self.lookback = timedelta(seconds=lookback_s)
        self._clock = clock
        self._reported: set[str] = set()

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        findings = []
        for signal in signals:
            if signal.kind is not SignalKind.NODE_STATE or signal.attrs.get("state") != "DEAD":
                continue
            node_id = signal.subject.id
            if node_id in self._reported:
                continue
            died_at = parse_iso(signal.attrs.get("end_time")) or signal.observed_at
            if self._clock() - died_at > self.lookback:
                self._reported.add(node_id)
                continue
            self._reported.add(node_id)
            findings.append(self._finding(signal, died_at))
        return findings

    def _finding(self, signal: Signal, died_at: datetime) -> Finding:
        attrs = signal.attrs
        ip = attrs.get("node_ip") or "unknown IP"
        reason = (attrs.get("state_message") or "no reason given by Ray").strip()
        jobs = attrs.get("jobs") or []
        active = [j for j in jobs if j.get("status") in {None, "RUNNING", "PENDING"}]
        names = [j.get("submission_id") or j.get("job_id") for j in jobs]
        who = f"; jobs with work there: {', '.join(names)}" if names else "; no jobs had work there"
        role = "head node" if attrs.get("is_head_node") else "node"
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
            severity=Severity.CRITICAL if active or attrs.get("is_head_node") else Severity.WARNING,
            confidence=1.0,
            evidence=tuple(evidence),
            first_seen=died_at,
            detected_at=self._clock(),
            recommended_action=ACTION,
            attrs={
                "node_id": signal.subject.id,
                "node_ip": attrs.get("node_ip"),
                "death_reason": reason,
                "died_at": died_at.isoformat(),
                "jobs": jobs,
            },
        )
