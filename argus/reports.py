"""Reports for incidents, written off the loop's thread.

For each incident the service gathers what rca needs (the findings, the job's logs and spec from its
folder on shared storage, the newest checkpoint's time, the actions taken), asks the RcaEngine for a
report, stores it, and writes it to `<shared_root>/jobs/<submission_id>/rca/<incident>.md` (and `.json`).
A deterministic report comes first, at once; where an LLM is configured its report follows and becomes
the latest. A failure is logged and leaves the incident without that report; it never reaches the loop.

Remediation's steps end after the report was written. `refresh` (once the steps are planned, and each time one
reaches a final state) stores the latest report again with its "What Argus did" rewritten from the steps as they
are now (rca.report.with_actions: no LLM call, nothing else re-read), as the new latest; an LLM pass that was
under way when a step ended tells the steps as they are when it is stored. A refresh is not announced
(report_ready): the group was told of the report once, and its link always shows the latest. Step texts in a
refresh are redacted with a fresh Redactor: where IPs or users are pseudonymised, their numbers there may
differ from the rest of the report's.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from argus.incidents.bus import EventSink
from argus.incidents.events import IncidentEvent
from control.artifacts import step_of
from core.jobfolder import JobFolder, is_submission_id
from core.readers import Readers
from core.refs import refs_of
from core.types import Incident, IncidentState, Report, utcnow
from rca.engine import RcaEngine
from rca.evidence import LogSource, read_tail
from rca.report import with_actions

MAX_LOG_FILES = 16
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")


class ReportService:
    def __init__(self, store: Any, engine: RcaEngine, shared_root: Path, *, events: EventSink | None = None,
                 readers: Readers | None = None) -> None:
        """`events`: where each report written is announced (report_ready), for IM and the ops agent. `readers`: the
        API's requests being answered; the workers give way to them between reports (core/readers.py)."""
        self.readers = readers
        self.store = store
        self.engine = engine
        self.shared_root = Path(shared_root)
        self.events = events
        # Two workers: the deterministic report of a new incident must not wait behind LLM passes, which take
        # a minute each on a CPU. Each queue holds (incident id, "write" | "refresh"); None stops its worker.
        self._queues: dict[bool, queue.Queue[tuple[str, str] | None]] = {False: queue.Queue(), True: queue.Queue()}
        self._pending: dict[bool, set[tuple[str, str]]] = {False: set(), True: set()}
        self._busy = 0  # items being worked on
        self._lock = threading.Lock()
        self._storing = threading.Lock()  # reading the steps and storing a report that tells them: one at a time
        self._threads: list[threading.Thread] = []

    # -- the worker --------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self._threads:
            for use_llm, name in ((False, "argus-reports"), (True, "argus-reports-llm")):
                thread = threading.Thread(target=self._run, args=(use_llm,), name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    def catch_up(self, limit: int = 1000) -> list[str]:
        """Queue a report for each not-resolved incident that has none (the newest `limit`): a process killed
        between opening an incident and storing its report writes it after the restart. The ids queued."""
        missing = [i.id for i in self.store.list_incidents(states=(IncidentState.OPEN, IncidentState.MITIGATING),
                                                             limit=limit) if not self.store.reports_for(i.id)]
        for incident_id in missing:
            self.submit(incident_id)
        if missing:
            logger.info("{} open incident(s) had no report (Argus stopped before writing it): writing them now",
                        len(missing))
        return missing

    def stop(self, timeout_s: float = 30.0) -> None:
        for q in self._queues.values():
            q.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def submit(self, incident_id: str) -> None:
        """Queue a report for the incident (the deterministic one first, then the LLM's); never queued twice."""
        self._enqueue(incident_id, use_llm=False)

    def refresh(self, incident_id: str) -> None:
        """Queue a refresh of the incident's latest report with its remediation steps as they are (cheap: on the
        deterministic worker, after what is queued there before it)."""
        self._enqueue(incident_id, use_llm=False, what="refresh")

    def _enqueue(self, incident_id: str, *, use_llm: bool, what: str = "write") -> None:
        item = (incident_id, what)
        with self._lock:
            if item in self._pending[use_llm]:
                return
            self._pending[use_llm].add(item)
        self._queues[use_llm].put(item)

    def idle(self) -> bool:
        with self._lock:
            return not self._pending[False] and not self._pending[True] and not self._busy

    def _run(self, use_llm: bool) -> None:
        while (item := self._queues[use_llm].get()) is not None:
            incident_id, what = item
            if self.readers is not None:
                self.readers.give_way()
            with self._lock:
                self._busy += 1
                if what == "refresh":  # a step ending from now on queues another: this one may read too early
                    self._pending[use_llm].discard(item)
            try:
                if what == "refresh":
                    self.refresh_now(incident_id)
                    continue
                self._write_pass(incident_id, use_llm=use_llm)
                if not use_llm and self.engine.writer is not None:
                    self._enqueue(incident_id, use_llm=True)
            except Exception as exc:  # noqa: BLE001 - one bad incident must not stop reports for the others
                logger.opt(exception=exc).bind(incident=incident_id).error("report for {} failed: {}", incident_id, exc)
            finally:
                with self._lock:
                    self._pending[use_llm].discard(item)
                    self._busy -= 1

    # -- one report ----------------------------------------------------------------------------------------

    def write(self, incident_id: str, *, llm: bool = True) -> list[Report]:
        """Write the incident's report(s) now: the deterministic one, then the LLM's where configured."""
        passes = [False, True] if llm and self.engine.writer is not None else [False]
        return [self._write_pass(incident_id, use_llm=use_llm) for use_llm in passes]

    def _write_pass(self, incident_id: str, *, use_llm: bool) -> Report:
        """One report, from the incident's current findings and actions; a pass whose LLM failed or was
        overruled is still stored: it says so, as the latest."""
        incident = self.store.get_incident(incident_id)
        findings = self.store.findings_for(incident_id)
        sid = self.submission_id(incident)
        folder = JobFolder(self.shared_root, sid) if sid else None
        context = {
            "logs": self.job_logs(folder) if folder else [],
            "job": self.job_facts(folder) if folder else None,
            "last_checkpoint_at": self.last_checkpoint_at(folder) if folder else None,
            "actions": self.store.list_actions(incident_id),
        }
        report = self.engine.report(incident, findings, use_llm=use_llm, **context)
        with self._storing:
            actions = self.store.list_actions(incident_id)
            if actions != context["actions"]:  # a step moved while this pass ran (an LLM pass takes a minute)
                report = with_actions(report, actions, self.engine.redactor().redact)
            saved = self.store.add_report(report.model_copy(update={"created_at": utcnow()}))
        self._save_file(folder, saved)
        log = logger.bind(incident=incident_id)
        log.info("report {} for {} ({}, {} {:.2f})", saved.id, incident_id, saved.generator, saved.category.value,
                 saved.confidence)
        if self.events is not None:
            self.events.publish(IncidentEvent.report_ready(incident, saved))
        return saved

    def refresh_now(self, incident_id: str) -> Report | None:
        """Store the latest report again telling the incident's steps as they are now, as the new latest; None
        when there is no report yet (the pass to come reads the steps) or it tells them as they are already."""
        with self._storing:
            reports = self.store.reports_for(incident_id)
            if not reports:
                return None
            latest = reports[-1]
            refreshed = with_actions(latest, self.store.list_actions(incident_id), self.engine.redactor().redact)
            if refreshed.data.get("actions") == latest.data.get("actions") and refreshed.markdown == latest.markdown:
                return None
            saved = self.store.add_report(refreshed.model_copy(update={
                "id": "", "created_at": max(utcnow(), latest.created_at + timedelta(microseconds=1))}))
        incident = self.store.get_incident(incident_id)
        sid = self.submission_id(incident)
        self._save_file(JobFolder(self.shared_root, sid) if sid else None, saved)
        logger.bind(incident=incident_id).info("report {} for {}: its steps as they are now (from {})", saved.id,
                                               incident_id, latest.id)
        return saved

    @staticmethod
    def submission_id(incident: Incident) -> str | None:
        """The job the incident is about (core.refs), when its id may name a job folder."""
        sid = refs_of(incident).submission_id
        return sid if is_submission_id(sid) else None

    def job_logs(self, job: JobFolder) -> list[LogSource]:
        """The job's log files on shared storage, newest first, the tail of each."""
        folder = job.logs
        if not folder.is_dir():
            return []
        try:
            files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
                     and p.suffix in LOG_SUFFIXES]
        except OSError:
            return []
        files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        return [read_tail(p, name=str(p.relative_to(job.root))) for p in files[:MAX_LOG_FILES]]

    @staticmethod
    def job_facts(job: JobFolder) -> dict[str, Any] | None:
        facts: dict[str, Any] = {"submission_id": job.submission_id}
        try:
            spec = yaml.safe_load(job.spec_file.read_text(encoding="utf-8")[:256 * 1024])
        except (OSError, yaml.YAMLError):
            spec = None
        if isinstance(spec, dict):
            facts["spec"] = {k: spec.get(k) for k in ("name", "workload", "entrypoint", "nnodes", "gpus_per_node",
                                                      "pool", "code_path", "env", "owner", "resume", "timeout_s")}
            facts["owner"] = spec.get("owner")
        try:
            facts["status"] = json.loads(job.status_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        return facts

    @staticmethod
    def last_checkpoint_at(job: JobFolder) -> datetime | None:
        try:
            stamps = [p.stat().st_mtime for p in job.checkpoints.iterdir() if step_of(p.name) is not None]
        except OSError:
            return None
        return datetime.fromtimestamp(max(stamps), tz=timezone.utc) if stamps else None

    def _save_file(self, job: JobFolder | None, report: Report) -> None:
        if job is None or not job.exists():
            return
        folder = job.rca
        try:
            folder.mkdir(exist_ok=True)
            for suffix, text in ((".md", report.markdown),
                                 (".json", json.dumps(report.model_dump(mode="json"), indent=2) + "\n")):
                tmp = folder / f".{report.incident_id}{suffix}.tmp"
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(folder / f"{report.incident_id}{suffix}")
        except OSError as exc:
            logger.bind(incident=report.incident_id).warning("could not write the report into {}: {}", folder, exc)
