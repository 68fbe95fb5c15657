"""One pass of the loop: collectors -> signals -> detectors -> findings, filed as incidents by the IncidentDesk
(which tells the subscribers, off this thread).

A collector that cannot reach its source is recorded as down and the others carry on; a detector that
fails is logged with its name and the loop carries on. What each source last said is kept for the API's
health route, so `argus serve` can say what it cannot reach.

A collector that does not return (a read of a hung NFS mount, a socket with no timeout) must not stop the loop:
each call runs on a worker thread and the tick waits for it at most `collect_timeout_s`. Past that the source is
marked stuck and the tick goes on without it; later ticks do not call it again while that call still hangs, and
when it returns its signals are taken in the next tick (a log collector has moved its offsets: they are not lost).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loguru import logger

from argus.incidents.correlate import filing_order
from argus.incidents.desk import IncidentDesk, Outcome
from argus.naming import Directory
from core.errors import ArgusError
from core.ports import Collector, Committing, Detector, Recovering
from core.types import Finding, Incident, Recovery, Signal, utcnow


@dataclass
class SourceStatus:
    name: str
    ok: bool | None = None  # None: not polled yet
    last_ok_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "last_ok_at": self.last_ok_at.isoformat() if self.last_ok_at else None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at.isoformat() if self.last_error_at else None,
        }


@dataclass
class TickResult:
    started_at: datetime
    duration_s: float
    finished_at: datetime | None = None  # set when the tick is done, before the tick hook runs
    signals: int = 0
    findings: list[Finding] = field(default_factory=list)
    opened: list[Incident] = field(default_factory=list)
    reopened: list[Incident] = field(default_factory=list)  # resolved incidents whose fault came back this tick
    recoveries: list[Recovery] = field(default_factory=list)  # faults detectors saw end this tick
    resolved: list[Incident] = field(default_factory=list)  # the open incidents those recoveries closed
    errors: dict[str, str] = field(default_factory=dict)


class Pipeline:
    def __init__(
        self,
        *,
        collectors: Sequence[Collector],
        detectors: Sequence[Detector],
        incidents: IncidentDesk,
        clock: Callable[[], datetime] = utcnow,
        needs: dict[str, set[str]] | None = None,
        on_tick: Callable[[TickResult], None] | None = None,
        names: Directory | None = None,
        collect_timeout_s: float = 60.0,
    ) -> None:
        """`names`: what the loop knows of jobs and nodes, learnt from each tick's signals and added to every
        finding before it is filed (argus/naming.py); a fresh one if None. `collect_timeout_s`: how long a tick
        waits for one collector before calling it stuck (see the module docstring)."""
        self.collectors = list(collectors)
        self.detectors = list(detectors)
        self.incidents = incidents
        self._clock = clock
        self._on_tick = on_tick
        self.names = names if names is not None else Directory()
        # detector name -> collectors whose failure this tick makes its verdict unreliable: it skips the tick
        self.needs = {name: set(sources) for name, sources in (needs or {}).items()}
        self._lock = threading.Lock()  # one tick at a time, whoever calls it
        self.sources = {c.name: SourceStatus(c.name) for c in self.collectors}
        self.last_tick: TickResult | None = None
        self.ticks = 0
        self.collect_timeout_s = collect_timeout_s
        self._calls: dict[str, tuple[Future[list[Signal]], float]] = {}  # collector -> its call and its start

    def run_once(self) -> TickResult:
        with self._lock:
            started, t0 = self._clock(), time.monotonic()
            result = TickResult(started_at=started, duration_s=0.0)
            signals, taken = self._collect(result)
            result.signals = len(signals)
            self._learn_names(signals)
            findings, recovering = self._detect(signals, result)
            for finding in sorted(findings, key=filing_order):
                finding = self.names.name(finding)
                result.findings.append(finding)
                self._record(finding, result)
            self._recover(recovering, result)
            self._commit(taken, result)
            result.duration_s = time.monotonic() - t0
            result.finished_at = self._clock()
            self.last_tick, self.ticks = result, self.ticks + 1
            if self._on_tick is not None:
                try:
                    self._on_tick(result)
                except Exception as exc:  # metrics bookkeeping must not break detection
                    logger.opt(exception=exc).error("tick hook failed")
            return result

    def _learn_names(self, signals: list[Signal]) -> None:
        try:
            self.names.learn(signals)
        except Exception as exc:  # unnamed findings are still findings: naming must not stop detection
            logger.opt(exception=exc).error("learning job and node names failed")

    def _collect(self, result: TickResult) -> tuple[list[Signal], list[Collector]]:
        """This tick's signals, and the collectors they came from (whose positions to commit after filing)."""
        signals: list[Signal] = []
        taken: list[Collector] = []
        for collector in self.collectors:
            status = self.sources[collector.name]
            call = self._calls.get(collector.name)
            if call is None:
                call = (_in_thread(collector.collect, f"argus-collect-{collector.name}"), time.monotonic())
                self._calls[collector.name] = call
            future, began = call
            try:
                collected = future.result(timeout=max(0.0, began + self.collect_timeout_s - time.monotonic()))
            except FutureTimeout:
                self._mark_down(status, f"stuck: its collect has not returned for {time.monotonic() - began:.0f} s "
                                "(a read that hangs, e.g. a hung NFS mount or a peer that never answers); the loop "
                                "goes on without it", result)
                continue
            except ArgusError as exc:
                self._mark_down(status, str(exc), result)
            except Exception as exc:  # a bug in one collector must not stop the loop
                logger.opt(exception=exc).error("collector {} failed", collector.name)
                self._mark_down(status, f"{type(exc).__name__}: {exc}", result)
            else:
                signals.extend(collected)
                taken.append(collector)
                if status.ok is False:
                    logger.info("source {} is reachable again", collector.name)
                status.ok, status.last_ok_at = True, self._clock()
            del self._calls[collector.name]
        return signals, taken

    def _commit(self, collectors: list[Collector], result: TickResult) -> None:
        """Save what the collectors read, now that its findings are filed (core.ports.Committing)."""
        for collector in collectors:
            if isinstance(collector, Committing):
                try:
                    collector.commit()
                except Exception as exc:  # a full data dir: the lines are read again after a restart, not lost
                    logger.opt(exception=exc).error("collector {} could not save its read positions", collector.name)
                    result.errors[f"commit:{collector.name}"] = f"{type(exc).__name__}: {exc}"

    def _mark_down(self, status: SourceStatus, message: str, result: TickResult) -> None:
        if status.ok is not False or status.last_error != message:
            logger.warning("source {} unavailable: {}", status.name, message)
        status.ok, status.last_error, status.last_error_at = False, message, self._clock()
        result.errors[status.name] = message

    def _detect(self, signals: list[Signal], result: TickResult) -> tuple[list[Finding], list[Recovering]]:
        """Every detector's findings, and the detectors that ran this tick and can tell recoveries."""
        findings: list[Finding] = []
        ran: list[Recovering] = []
        for detector in self.detectors:
            blind = self.needs.get(detector.name, set()) & set(result.errors)
            if blind:
                logger.debug("detector {} skips this tick: {} down", detector.name, ", ".join(sorted(blind)))
                continue
            try:
                findings.extend(detector.detect(signals))
            except Exception as exc:
                logger.opt(exception=exc).error("detector {} failed", detector.name)
                result.errors[f"detector:{detector.name}"] = f"{type(exc).__name__}: {exc}"
                continue
            if isinstance(detector, Recovering):  # the optional second verb: which faults it saw end
                ran.append(detector)
        return findings, ran

    def _recover(self, detectors: list[Recovering], result: TickResult) -> None:
        """Close the open incidents whose fault a detector saw end (after this tick's findings are filed, so a
        fault that ended and came back within one tick stays open)."""
        for detector in detectors:
            try:
                recoveries = detector.recoveries()
            except Exception as exc:
                logger.opt(exception=exc).error("detector {} failed to tell its recoveries", detector.name)
                result.errors[f"detector:{detector.name}"] = f"{type(exc).__name__}: {exc}"
                continue
            for recovery in recoveries:
                result.recoveries.append(recovery)
                closed = self.incidents.recover(recovery)
                if closed is not None:
                    result.resolved.append(closed)

    def _record(self, finding: Finding, result: TickResult) -> None:
        filed = self.incidents.file(finding)
        if filed.outcome is Outcome.OPENED:
            result.opened.append(filed.incident)
        elif filed.outcome is Outcome.REOPENED:
            result.reopened.append(filed.incident)

    def health(self) -> dict[str, Any]:
        return {
            "sources": [s.as_dict() for s in self.sources.values()],
            "ticks": self.ticks,
            "last_tick_at": self.last_tick.started_at.isoformat() if self.last_tick else None,
            "last_tick_duration_s": round(self.last_tick.duration_s, 3) if self.last_tick else None,
        }


def _in_thread(call: Callable[[], list[Signal]], name: str) -> Future[list[Signal]]:
    """`call()` on a daemon thread of its own: a call stuck in a read must not keep the process from exiting (an
    executor's threads are joined at exit)."""
    future: Future[list[Signal]] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the tick, which says what it was
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
