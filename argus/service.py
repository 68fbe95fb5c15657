"""Argus as one service: the store, the detection loop, reports, remediation, notifications and the API.

`argus serve` runs it under uvicorn in the foreground; `argus demo` runs the same object with uvicorn in a
thread, so the demo shows exactly what a deployment does. Nothing here sets up logging (the entry points
do) or reads the environment (the Settings passed in are the whole configuration).

With `leader_election` several replicas share one database: each serves the API, and the loop (with its chores and
the recovery of interrupted remediation) runs only on the replica holding the leader lease (argus/leader.py). A
replica that loses the lease calls `on_deposed`, by default exiting the process (the service manager restarts it
as a follower), so nothing of an old tenure runs beside the new leader.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from core.settings import Settings

if TYPE_CHECKING:  # the modules load in start(): `argus --help` stays quick
    from argus.control_plane import ControlPlane
    from argus.daemon import Daemon
    from argus.exporter import ArgusMetrics
    from argus.incidents.alert_filer import AlertFiler
    from argus.incidents.bus import EventBus
    from argus.incidents.desk import IncidentDesk
    from argus.leader import LeaderElector
    from argus.notify.dispatcher import Dispatcher
    from argus.reports import ReportService
    from argus.store.store import Store
    from remediation.runner import Remediator


class ArgusService:
    """Build with settings, `start()` the background parts, serve `app`, `stop()` on the way out."""

    def __init__(self, settings: Settings, *, public_url: str | None = None,
                 on_deposed: Callable[[str], None] | None = None) -> None:
        """`on_deposed`: what a replica does when it loses the leader lease (default: exit with code 75, so the
        service manager starts it again as a follower)."""
        self.settings = settings
        self.public_url = public_url or f"http://{settings.api_host}:{settings.api_port}"
        self.on_deposed = on_deposed or _exit_deposed
        self.elector: LeaderElector | None = None
        # Set by start(); None before it (and after a failed start, for what it did not reach).
        self.store: Store | None = None
        self.app: FastAPI | None = None
        self.reports: ReportService | None = None
        self.remediator: Remediator | None = None
        self.dispatcher: Dispatcher | None = None
        self.control: ControlPlane | None = None
        self.daemon: Daemon | None = None
        self.metrics: ArgusMetrics | None = None
        self.events: EventBus | None = None
        self.incidents: IncidentDesk | None = None
        self.alert_filer: AlertFiler | None = None

    def start(self) -> FastAPI:
        """Open the store, recover interrupted remediation, start the loop and the writers; return the app."""
        from argus.api.app import create_app
        from argus.daemon import Daemon
        from argus.exporter import ArgusMetrics
        from argus.incidents.bus import EventBus
        from argus.web.sessions import Sessions, secret_in
        from argus.web.ui import WebUi
        from argus.wiring import (
            build_approval_links,
            build_control,
            build_dispatcher,
            build_incidents,
            build_metric_queries,
            build_node_agents,
            build_pipeline,
            build_remediator,
            build_reports,
            open_store,
        )
        from core.readers import Readers

        settings, public = self.settings, self.public_url
        self.store = store = open_store(settings)
        self.metrics = metrics = ArgusMetrics()
        self.dispatcher = dispatcher = build_dispatcher(settings, store, public_url=public, metrics=metrics)
        links = build_approval_links(settings, public)
        # The API's requests being answered: the background workers give way to them between items (core/readers.py)
        readers = Readers()
        self.events = events = EventBus(readers=readers)  # the report service announces its reports on it too
        self.reports = reports = build_reports(settings, store, events=events, readers=readers)
        reports.start()
        self.control = control = build_control(settings, store, metrics=metrics)
        self.remediator = remediator = build_remediator(settings, store, control, metrics=metrics, reports=reports,
                                                        readers=readers, events=events)
        if not settings.leader_election:  # else the elected leader does it (a follower must not touch steps)
            remediator.recover()  # steps a crash left running: finished, re-run when safe, or reported
        self.incidents = incidents = build_incidents(
            settings, store, events=events, public_url=public, metrics=metrics, reports=reports,
            remediator=remediator, dispatcher=dispatcher, links=links)
        # Every replica files the alerts its webhook accepted (claimed under its replica id); started now, so what a
        # killed Argus had accepted and not filed is filed at once.
        from argus.incidents.alert_filer import LOCAL_HOLDER, AlertFiler
        from argus.leader import default_replica_id

        replica = (settings.replica_id or default_replica_id()) if settings.leader_election else LOCAL_HOLDER
        self.alert_filer = alert_filer = AlertFiler(store, incidents, holder=replica, readers=readers).start()
        chores = {"jobs": (lambda: control.jobs.sweep(metrics.set_job_info), settings.job_timeout_check_s),
                  "job queue": (control.queue.tick, settings.job_queue_interval_s),
                  "remediation": (remediator.run_pending, settings.remediation_interval_s)}
        inbox = None
        if settings.node_agents:  # an agent on every node sends what it reads; the poller covers nodes without one
            inbox, fleet = build_node_agents(settings, store, control, metrics)
            chores["node agents"] = (fleet.ensure, 30.0)
        # the detectors' state lives in the store: a restart neither forgets a hang nor restarts an idle window
        pipeline = build_pipeline(settings, incidents, metrics=metrics, memory=store.detector_state, agents=inbox)
        self.daemon = daemon = Daemon(pipeline, interval_s=settings.poll_interval_s, chores=chores)
        health: Callable[[], dict[str, Any]] = pipeline.health
        if settings.leader_election:
            from argus.leader import LeaderElector

            def lead(term: int) -> None:
                remediator.recover()  # the steps the last leader left running: finished, re-run when safe, reported
                reports.catch_up()  # the reports the last leader did not get to write
                daemon.start()

            self.elector = elector = LeaderElector(
                store.leases, replica=replica, on_elected=lead,
                on_deposed=self.on_deposed, ttl_s=settings.lease_ttl_s, renew_s=settings.lease_renew_s)

            def health() -> dict[str, Any]:
                seen = elector.view()
                return {**pipeline.health(), "replica": {"id": seen.replica, "role": "leader" if seen.leader
                                                         else "follower", "leader": seen.holder, "term": seen.term,
                                                         "lease_error": seen.last_error}}
        # The web page's sessions are signed with a secret kept in the data dir: they survive a restart.
        app = create_app(store=store, incidents=incidents, health_provider=health, metrics=metrics,
                         metric_queries=build_metric_queries(settings),
                         control=control, remediator=remediator, approval_links=links,
                         web=WebUi(Sessions(secret_in(settings.data_dir))), node_agents=inbox,
                         leader=self.elector.view if self.elector else None, alert_filer=alert_filer,
                         readers=readers)
        self.app = app
        if self.elector is not None:
            self.elector.start()  # the loop starts when this replica is elected
        else:
            reports.catch_up()  # the reports a killed Argus did not get to write
            daemon.start()
        return app

    def stop(self, *, reports_timeout_s: float = 30.0) -> None:
        """Stop what start() started, in reverse; safe after a failed or partial start."""
        if self.elector is not None:
            self.elector.stop()  # no election from here on, so the loop cannot start after it stops
        if self.daemon is not None:
            self.daemon.stop()
        if self.elector is not None:
            self.elector.resign()  # nothing of this tenure runs now: a follower may take over at once
        if self.alert_filer is not None:
            self.alert_filer.close()  # what it did not file stays queued for the next start
        if self.reports is not None:
            self.reports.stop(timeout_s=reports_timeout_s)
        if self.events is not None:
            self.events.close()  # what is waiting still reaches IM and webhooks, then the workers stop
        if self.dispatcher is not None:
            self.dispatcher.close()
        if self.store is not None:
            self.store.close()


def _exit_deposed(why: str) -> None:
    # A replica that lost the lease may still have a tick or a step under way: ending the process is the one sure
    # way that none of it runs beside the new leader. EX_TEMPFAIL: the service manager starts it again.
    from loguru import logger

    logger.critical("this replica lost the leader lease ({}): exiting so that a fresh start follows", why)
    os._exit(75)
