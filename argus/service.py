"""Argus as one service: the store, the detection loop, reports, remediation, notifications and the API.

`argus serve` runs it under uvicorn in the foreground; `argus demo` runs the same object with uvicorn in a
thread, so the demo shows exactly what a deployment does. Nothing here sets up logging (the entry points
do) or reads the environment (the Settings passed in are the whole configuration).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from core.settings import Settings


class ArgusService:
    """Build with settings, `start()` the background parts, serve `app`, `stop()` on the way out."""

    def __init__(self, settings: Settings, *, public_url: str | None = None) -> None:
        self.settings = settings
        self.public_url = public_url or f"http://{settings.api_host}:{settings.api_port}"
        self.store: Any = None
        self.app: FastAPI | None = None
        self.reports: Any = None
        self.remediator: Any = None
        self.dispatcher: Any = None
        self.control: Any = None
        self.daemon: Any = None
        self.metrics: Any = None

    def start(self) -> FastAPI:
        """Open the store, recover interrupted remediation, start the loop and the writers; return the app."""
        from argus.api.app import create_app
        from argus.daemon import Daemon
        from argus.exporter import ArgusMetrics
        from argus.notify.message import approval_links_for
        from argus.web.sessions import Sessions, secret_in
        from argus.web.ui import WebUi
        from argus.wiring import (
            build_approval_links,
            build_control,
            build_dispatcher,
            build_notifiers,
            build_pipeline,
            build_remediator,
            build_reports,
            open_store,
        )

        settings, public = self.settings, self.public_url
        self.store = store = open_store(settings)
        self.metrics = metrics = ArgusMetrics()
        self.dispatcher = dispatcher = build_dispatcher(settings, store, public_url=public, metrics=metrics)
        links = build_approval_links(settings, public)
        self.reports = reports = build_reports(settings, store)
        if dispatcher is not None:
            reports.on_report = dispatcher.notify_report
        reports.start()
        self.control = control = build_control(settings, store)

        def on_plan(incident, waiting) -> None:  # type: ignore[no-untyped-def] # steps waiting: links in the IM message
            if dispatcher is not None:
                dispatcher.notify_approval(incident, approval_links_for(waiting, links))

        self.remediator = remediator = build_remediator(settings, store, control, on_plan=on_plan,
                                                          metrics=metrics)
        remediator.recover()  # steps a crash left running: finished, re-run when safe, or reported
        extra = [dispatcher] if dispatcher is not None else []
        pipeline = build_pipeline(settings, store, public_url=public, metrics=metrics, reports=reports,
                                  remediator=remediator,
                                  notifiers=build_notifiers(settings, public_url=public) + extra)
        self.daemon = Daemon(pipeline, interval_s=settings.poll_interval_s,
                             chores={"job timeouts": (control.jobs.enforce_timeouts, settings.job_timeout_check_s),
                                     "remediation": (remediator.run_pending, settings.remediation_interval_s)})
        app = create_app(store=store, health_provider=pipeline.health, metrics=metrics, control=control,
                         remediator=remediator)

        def on_alert_incident(incident) -> None:  # type: ignore[no-untyped-def] # Alertmanager's incidents too
            reports.submit(incident.id)
            remediator.plan(incident)

        app.state.on_alert_incident = on_alert_incident
        # The web page's sessions are signed with a secret kept in the data dir: they survive a restart.
        app.state.web = WebUi(Sessions(secret_in(settings.data_dir)))
        app.state.approval_links = links
        if dispatcher is not None:
            app.state.on_incident_change = dispatcher.notify_state_change
        self.app = app
        self.daemon.start()
        return app

    def stop(self, *, reports_timeout_s: float = 30.0) -> None:
        """Stop what start() started, in reverse; safe after a failed or partial start."""
        if self.daemon is not None:
            self.daemon.stop()
        if self.reports is not None:
            self.reports.stop(timeout_s=reports_timeout_s)
        if self.dispatcher is not None:
            self.dispatcher.close()
        if self.store is not None:
            self.store.close()
