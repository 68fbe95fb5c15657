"""Idle GPUs: a RUNNING job whose GPUs have all stayed under a utilisation threshold for a whole window.

Inputs (signals, never collectors):
- the placement snapshot (METRIC `argus_gpu_placement`, subject the cluster: every Ray node's id, IP,
  name and GPU total) and one METRIC `argus_job_gpus` per job holding GPUs (attrs status, owner, nodes),
  both from collectors/placement.py;
- per-GPU DCGM utilisation (METRIC `DCGM_FI_DEV_GPU_UTIL`, subject the GPU UUID, attrs hostname and
  labels), from dcgm-exporter directly (collectors/dcgm.py) or through Prometheus.

Tying a DCGM series to a Ray node, tried in the order of `node_match`:
- "instance": the exporter's scrape address (Prometheus's `instance` label, or the URL a direct scrape
  used) has the node's IP as host: true when dcgm-exporter runs on each node and is scraped by IP;
- "hostname": dcgm-exporter's Hostname label, through `hostname_to_node_ip` if given, else equal to the
  Ray node's name (`ray start --node-name`; Ray defaults it to the IP) or IP.
A series that matches no node is ignored.

Ray does not say which GPU indices a job got (collectors/placement.py), so a job is judged per node: a
node counts as idle for the job when every GPU of that node has a fresh sample under the threshold.
When the job holds all of the node's GPUs this is exact; when it shares the node, the finding says the
attribution is per node, and a busy neighbour on the node keeps the job from being flagged (never
blame a job for GPUs that may not be its own). A GPU with no fresh sample is unknown, not idle; a node
with fewer sampled GPUs than Ray advertises is unknown.

Episodes: the window starts at the first poll that saw the job idle; any busy poll ends the episode, as
does the job leaving RUNNING or releasing its GPUs. One finding per episode, fingerprinted by the job alone, so a
later idle episode of the same job is the same fault coming back: the desk reopens its incident within
reopen_window_s, and opens a new one after that. A poll without placement (Ray unreachable)
changes nothing; a poll where the job's GPUs are unknown restarts a not-yet-reported window and keeps a
reported episode open (a scrape gap is not a new episode). Across an Argus restart, with a `memory`
(core.ports.DetectorMemory), episodes carry on: a job idle for 8 minutes of a 10-minute window before the
restart is reported 2 minutes after it. The detector only claims idleness it has watched, so a not-yet-reported
episode whose last idle poll is older than stale_after_s when Argus comes back starts again.

Recovery (`recoveries()`, read by the loop after each `detect()`): a reported episode that ends closes its
incident, told once, with what ended it. Ends are the ones above, judged as idleness is: one poll in which a GPU
of one of the job's nodes has a fresh sample at or over the threshold ("GPU utilisation back to 37% on 10.0.0.3
GPU 2"; on a shared node that GPU may be a neighbour's, as for flagging, and the reason says so), or the job
leaving RUNNING or holding no GPUs in a placement snapshot ("job raysubmit_x released its GPUs (STOPPED)"). A
job that left RUNNING while a detached actor keeps its GPUs ends the episode (the detector judges RUNNING jobs)
but is no recovery: the GPUs are still held, so the incident stays open for a person.
One busy poll is enough because it already ends the episode, and a later idle stretch is a new episode that must
last a whole window again before it is claimed, so a job hovering at the threshold cannot reopen an incident
every poll. No recovery without data: a poll without placement, or with the job's GPUs unknown
(no fresh samples), ends nothing. An episode reported before a restart is claimed after it only with a memory.

One module past 400 lines on purpose: matching samples to nodes, the per-node verdict and the episodes are one
algorithm over one state (its JSON form for restarts lives in detectors/idle_gpu_state.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from loguru import logger

from core import signal_keys as keys
from core.errors import ConfigError
from core.ports import DetectorMemory
from core.types import (
    Category,
    Evidence,
    Finding,
    Recovery,
    Severity,
    Signal,
    SignalKind,
    Subject,
    SubjectKind,
    fingerprint_of,
    utcnow,
)
from detectors.idle_gpu_state import GpuSample, IdleEpisode, recalled, remembered
from detectors.memory import SavedState, StateUnreadable

PLACEMENT_METRIC = keys.PLACEMENT_METRIC
JOB_GPUS_METRIC = keys.JOB_GPUS_METRIC
UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
NODE_MATCHES = ("instance", "hostname")
_MAX_GPU_EVIDENCE = 16


@dataclass
class _NodeVerdict:
    node: dict[str, Any]  # the job's share: node_id, node_ip, gpus, node_gpus_total, whole_node
    state: str  # idle, busy, unknown
    samples: list[GpuSample]


class IdleGpuDetector:
    name = "idle_gpu"

    def __init__(
        self,
        *,
        threshold_pct: float = 5.0,
        window_s: float = 600.0,
        metric: str = UTIL_METRIC,
        node_match: Sequence[str] = NODE_MATCHES,
        hostname_to_node_ip: Mapping[str, str] | None = None,
        stale_after_s: float = 120.0,
        memory: DetectorMemory | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`memory`: where idle episodes are kept across restarts (loaded here, saved after each poll with
        placement); None keeps them in this process only."""
        unknown = [m for m in node_match if m not in NODE_MATCHES]
        if unknown or not node_match:
            raise ConfigError(
                f"idle_gpu node_match {list(node_match)!r} is not a non-empty list of {list(NODE_MATCHES)}",
                hint="use 'instance' (exporter scraped at the node's IP) and/or 'hostname'",
            )
        if not 0 < threshold_pct <= 100:
            raise ConfigError(f"idle_gpu threshold_pct={threshold_pct} must be in (0, 100]", hint="e.g. 5")
        if window_s <= 0 or stale_after_s <= 0:
            raise ConfigError(
                f"idle_gpu window_s={window_s} and stale_after_s={stale_after_s} must be > 0",
                hint="e.g. window_s=600, stale_after_s=120 (4 dcgm-exporter collect intervals)",
            )
        self.threshold_pct = threshold_pct
        self.window = timedelta(seconds=window_s)
        self.metric = metric
        self.node_match = tuple(node_match)
        self.hostname_to_node_ip = dict(hostname_to_node_ip or {})
        self.stale_after = timedelta(seconds=stale_after_s)
        self._clock = clock
        self._samples: dict[str, GpuSample] = {}  # GPU UUID -> latest sample (max of one poll's values)
        self._episodes: dict[str, IdleEpisode] = {}  # job key -> current idle episode
        self._recovered: list[Recovery] = []
        self._saved = SavedState(memory, self.name)
        self._recall()

    # -- the one verb ----------------------------------------------------------------------------------

    def detect(self, signals: Sequence[Signal]) -> list[Finding]:
        now = self._clock()
        snapshot: Signal | None = None
        jobs: list[Signal] = []
        fresh: dict[str, GpuSample] = {}
        for signal in signals:
            if signal.kind is not SignalKind.METRIC:
                continue
            metric = signal.attrs.get(keys.METRIC)
            if metric == PLACEMENT_METRIC:
                snapshot = signal
            elif metric == JOB_GPUS_METRIC and signal.subject.kind is SubjectKind.JOB:
                jobs.append(signal)
            elif metric == self.metric and signal.subject.kind is SubjectKind.GPU:
                self._take_sample(signal, fresh)
        self._samples.update(fresh)
        self._samples = {u: s for u, s in self._samples.items() if now - s.at <= self.stale_after}
        if snapshot is None:
            return []  # placement not known this poll: neither start nor end an episode

        node_gpus = self._samples_by_node(snapshot)
        findings = []
        running = set()
        statuses = {job.subject.id: job.attrs.get(keys.STATUS) for job in jobs}
        for job in jobs:
            if statuses[job.subject.id] != "RUNNING":
                continue
            key = job.subject.id
            running.add(key)
            verdicts = [
                _NodeVerdict(node, *self._judge(node_gpus.get(node.get("node_id"), []), node))
                for node in job.attrs.get(keys.NODES) or []
            ]
            finding = self._advance(key, job, verdicts, now)
            if finding is not None:
                findings.append(finding)
        for key in list(self._episodes):
            if key not in running:  # the job ended or released its GPUs: the episode is over
                self._end(self._episodes.pop(key), _released(key, statuses.get(key), jobs), now)
        self._remember()
        return findings

    def recoveries(self) -> list[Recovery]:
        """The reported idle episodes that ended since the last call (the second verb: see core.ports)."""
        done, self._recovered = self._recovered, []
        return done

    # -- memory across restarts (detectors/idle_gpu_state.py) ------------------------------------------

    def _recall(self) -> None:
        """Episodes remembered from before a restart. One not yet reported whose last idle poll is older than
        stale_after_s starts again: the GPUs were not watched in between (a reported one is kept, as across a
        scrape gap, so its recovery can still close the incident)."""
        now = self._clock()
        for key, value in self._saved.load().items():
            try:
                episode = recalled(value)
            except StateUnreadable as err:
                logger.warning("idle_gpu detector: the remembered episode of job {} is unreadable ({}): it starts "
                               "fresh", key, err)
                self._saved.forget_loaded(key)
                continue
            if episode.fingerprint is None and now - episode.seen_idle_at > self.stale_after:
                self._saved.forget_loaded(key)
                continue
            self._episodes[key] = episode
        if self._episodes:
            logger.info("idle_gpu detector remembers {} idle episode(s) from before the restart", len(self._episodes))

    def _remember(self) -> None:
        """Save the episodes as they are after this poll (only what changed is written); forget ended ones."""
        values: dict[str, dict[str, Any] | None] = {key: None for key in self._saved.keys()}
        values.update((key, remembered(episode)) for key, episode in self._episodes.items())
        self._saved.save(values)

    # -- samples and nodes -----------------------------------------------------------------------------

    def _take_sample(self, signal: Signal, fresh: dict[str, GpuSample]) -> None:
        if signal.value is None:
            return
        labels = signal.attrs.get(keys.LABELS) or {}
        instance = labels.get("instance")
        if instance:
            host = urlsplit(f"//{instance}").hostname
        elif signal.source.startswith(("http://", "https://")):  # a direct scrape: the source is its URL
            host = urlsplit(signal.source).hostname
        else:
            host = None
        uuid = signal.subject.id
        sample = GpuSample(
            uuid=uuid,
            value=float(signal.value),
            at=signal.observed_at,
            source=signal.source,
            hostname=str(signal.attrs.get(keys.HOSTNAME) or ""),
            index=signal.attrs.get(keys.GPU),
            instance_host=host,
        )
        seen = fresh.get(uuid)
        if seen is not None:  # several values of one GPU in one poll: the busiest one counts
            sample.value, sample.at = max(seen.value, sample.value), max(seen.at, sample.at)
        fresh[uuid] = sample

    def _samples_by_node(self, snapshot: Signal) -> dict[str, list[GpuSample]]:
        by_ip: dict[str, str] = {}
        by_name: dict[str, str] = {}
        for node in snapshot.attrs.get(keys.NODES) or []:
            if node.get("state", "ALIVE") != "ALIVE":
                continue
            if node.get("node_ip"):
                by_ip[node["node_ip"]] = node["node_id"]
            if node.get("node_name"):
                by_name[node["node_name"]] = node["node_id"]
        grouped: dict[str, list[GpuSample]] = {}
        for sample in self._samples.values():
            node_id = self._node_of(sample, by_ip, by_name)
            if node_id is not None:
                grouped.setdefault(node_id, []).append(sample)
        return grouped

    def _node_of(self, sample: GpuSample, by_ip: dict[str, str], by_name: dict[str, str]) -> str | None:
        for how in self.node_match:
            if how == "instance" and sample.instance_host:
                found = by_ip.get(sample.instance_host) or by_name.get(sample.instance_host)
            elif how == "hostname" and sample.hostname:
                mapped = self.hostname_to_node_ip.get(sample.hostname)
                if mapped:
                    found = by_ip.get(mapped)
                else:
                    found = by_name.get(sample.hostname) or by_ip.get(sample.hostname)
            else:
                found = None
            if found is not None:
                return found
        return None

    def _judge(self, samples: list[GpuSample], node: dict[str, Any]) -> tuple[str, list[GpuSample]]:
        samples = sorted(samples, key=lambda s: (str(s.index), s.uuid))
        if any(s.value >= self.threshold_pct for s in samples):
            return "busy", samples
        if not samples or len(samples) < float(node.get("node_gpus_total") or 0):
            return "unknown", samples
        return "idle", samples

    # -- episodes --------------------------------------------------------------------------------------

    def _advance(self, key: str, job: Signal, verdicts: list[_NodeVerdict], now: datetime) -> Finding | None:
        states = {v.state for v in verdicts}
        episode = self._episodes.get(key)
        if not verdicts or "busy" in states:
            if episode is not None:
                del self._episodes[key]
                reason = self._busy_again(verdicts) if verdicts else _released(key, "RUNNING", [])
                self._end(episode, reason, now)
            return None
        if "unknown" in states:
            if episode is not None and episode.fingerprint is None:
                del self._episodes[key]
            return None
        if episode is None:
            episode = self._episodes[key] = IdleEpisode(idle_since=now, seen_idle_at=now)
        episode.seen_idle_at = now
        for verdict in verdicts:
            for sample in verdict.samples:
                episode.max_util = max(episode.max_util, sample.value)
                episode.gpu_samples[sample.uuid] = sample
        if episode.fingerprint is not None or now - episode.idle_since < self.window:
            return None
        finding = self._finding(job, verdicts, episode, now)
        episode.fingerprint = finding.fingerprint
        return finding

    def _end(self, episode: IdleEpisode, reason: str | None, now: datetime) -> None:
        """An episode is over; if it was reported here and `reason` says the fault ended, its incident may close."""
        if episode.fingerprint is not None and reason is not None:
            self._recovered.append(Recovery(fingerprint=episode.fingerprint, reason=reason, detector=self.name,
                                            observed_at=now))

    def _busy_again(self, verdicts: list[_NodeVerdict]) -> str:
        """Why a busy poll ended the episode: the busiest GPU of the job's busy nodes."""
        verdict, sample = max(
            ((v, s) for v in verdicts if v.state == "busy" for s in v.samples), key=lambda vs: vs[1].value
        )
        reason = (
            f"GPU utilisation back to {sample.value:g}% on {verdict.node.get('node_ip')} GPU {sample.index} "
            f"(at or over the {self.threshold_pct:g}% threshold)"
        )
        if not verdict.node.get("whole_node"):
            reason += "; the job shares that node and Ray does not say which GPUs are its own: it may be a neighbour's"
        return reason

    def _finding(
        self, job: Signal, verdicts: list[_NodeVerdict], episode: IdleEpisode, now: datetime
    ) -> Finding:
        attrs = job.attrs
        key = job.subject.id
        owner = attrs.get(keys.OWNER)
        gpus = sum(float(v.node.get("gpus") or 0) for v in verdicts)
        idle_s = (now - episode.idle_since).total_seconds()
        gpu_hours = gpus * idle_s / 3600.0
        shared = [str(v.node.get("node_ip")) for v in verdicts if not v.node.get("whole_node")]
        nodes = [
            {
                "node_id": v.node.get("node_id"),
                "node_ip": v.node.get("node_ip"),
                "gpus": v.node.get("gpus"),
                "node_gpus_total": v.node.get("node_gpus_total"),
                "attribution": "exact" if v.node.get("whole_node") else "per_node",
                "gpu_uuids": [s.uuid for s in v.samples],
            }
            for v in verdicts
        ]
        where = ", ".join(f"{v.node.get('node_ip')} ({float(v.node.get('gpus') or 0):g})" for v in verdicts)
        summary = (
            f"job {key} of {owner or 'an unknown owner'} holds {gpus:g} GPU(s) on {where}, all under "
            f"{self.threshold_pct:g}% utilisation for {idle_s / 60:.1f} min: "
            f"{gpu_hours:.2f} GPU-hours wasted so far"
        )
        if shared:
            summary += (
                f"; attribution is per node on {', '.join(shared)} (the job shares the node and Ray does "
                "not say which GPU indices it got: every GPU of the node is idle)"
            )
        evidence = [
            Evidence(
                source=job.source,
                text=f"job {key} (ray job {attrs.get(keys.JOB_ID)}, status {attrs.get(keys.STATUS)}) holds "
                f"{float(v.node.get('gpus') or 0):g} of {float(v.node.get('node_gpus_total') or 0):g} GPUs "
                f"on node {v.node.get('node_ip')} ({v.node.get('node_id')})",
                at=job.observed_at,
                value=float(v.node.get("gpus") or 0),
            )
            for v in verdicts
        ]
        for sample in list(episode.gpu_samples.values())[:_MAX_GPU_EVIDENCE]:
            evidence.append(
                Evidence(
                    source=sample.source,
                    text=f"{self.metric}{{Hostname={sample.hostname!r}, gpu={sample.index}, "
                    f"UUID={sample.uuid}}} = {sample.value:g}",
                    at=sample.at,
                    value=sample.value,
                )
            )
        subject = Subject(kind=SubjectKind.JOB, id=key, name=job.subject.name)
        return Finding(
            category=Category.IDLE_GPU,
            reason="JobGpusIdle",
            subject=subject,
            summary=summary,
            severity=Severity.WARNING,
            confidence=1.0 if not shared else 0.8,
            evidence=tuple(evidence),
            first_seen=episode.idle_since,
            detected_at=now,
            recommended_action=(
                f"Ask {owner or 'the job owner'} whether job {key} still does useful work; if not, stop it "
                f"(`ray job stop {key}`) so its GPUs return to the pool."
            ),
            fingerprint=fingerprint_of(Category.IDLE_GPU, subject),
            attrs={
                keys.JOB_ID: attrs.get(keys.JOB_ID),
                keys.SUBMISSION_ID: attrs.get(keys.SUBMISSION_ID),
                "owner": owner,
                "entrypoint": attrs.get(keys.ENTRYPOINT),
                "gpus": gpus,
                "nodes": nodes,
                "attribution": "per_node" if shared else "exact",
                "idle_since": episode.idle_since.isoformat(),
                "idle_seconds": round(idle_s, 1),
                "gpu_hours_wasted": round(gpu_hours, 4),
                "threshold_pct": self.threshold_pct,
                "window_s": self.window.total_seconds(),
                "max_util_pct": episode.max_util,
            },
        )


def _released(key: str, status: str | None, jobs: Sequence[Signal]) -> str | None:
    """Why the episode of a job no longer judged ended: it left RUNNING, or it holds no GPUs now. None when it
    left RUNNING but its actors still hold GPUs: that is no recovery."""
    if status is None or status == "RUNNING":
        return f"job {key} released its GPUs (it holds none in Ray's placement now)"
    held = sum(float(j.value or 0) for j in jobs if j.subject.id == key)
    if not held:
        return f"job {key} released its GPUs ({status})"
    # a detached actor outlives its job (collectors/placement.py): the episode, about a RUNNING job, is over,
    # but the GPUs are still held idle
    return None
