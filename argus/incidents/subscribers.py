"""The subscribers to incident events: who reacts to an incident opening, changing, or its report being ready.

Each is small and says which kinds it handles; `argus/wiring.py` puts them in one explicit list. They run on the
bus's workers, one worker each, so none of them can hold up detection or another subscriber.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from loguru import logger

from argus.incidents.events import LIFECYCLE, EventKind, IncidentEvent
from core.ports import Notifier
from core.types import Action, ActionState

if TYPE_CHECKING:
    from argus.approval_links import ApprovalLinks
    from argus.exporter import ArgusMetrics
    from argus.incidents.bus import EventSink
    from argus.notify.dispatcher import Dispatcher
    from argus.reports import ReportService
    from remediation.runner import Remediator


class NotifierSubscriber:
    """A Notifier (the generic JSON webhook, the ops agent's endpoint) told of each opened, updated and resolved
    incident, and of each remediation step that ended (what the agent waits for after it approved one)."""

    def __init__(self, notifier: Notifier, *, name: str | None = None) -> None:
        self.notifier = notifier
        self.name = name or notifier.name

    def receive(self, event: IncidentEvent) -> None:
        if event.kind in LIFECYCLE:
            self.notifier.notify(event.incident, event.kind.value)
        elif event.kind is EventKind.STEP_FINISHED and event.actions:
            self.notifier.notify(event.incident, event.kind.value, actions=event.actions)


class ImSubscriber:
    """The IM dispatcher: lifecycle messages, the report when it is ready, and approve/reject links for steps that
    wait (signed links where `links` is configured). `awaits`: what a new incident's first message waits for
    ("report_ready" where reports are written, "planned" where remediation plans), so one message tells all."""

    name = "im"

    def __init__(self, dispatcher: Dispatcher, links: ApprovalLinks | None = None, *,
                 awaits: frozenset[str] = frozenset()) -> None:
        self.dispatcher = dispatcher
        self.links = links
        self.awaits = awaits

    def receive(self, event: IncidentEvent) -> None:
        from argus.notify.message import approval_links_for

        if event.kind is EventKind.OPENED:
            self.dispatcher.notify(event.incident, event.kind.value, awaits=self.awaits)
        elif event.kind in LIFECYCLE:
            self.dispatcher.notify(event.incident, event.kind.value)
        elif event.kind is EventKind.PLANNED:
            self.dispatcher.notify_planned(event.incident, event.actions)
        elif event.kind is EventKind.STEP_FINISHED and event.actions:
            self.dispatcher.notify_step_finished(event.incident, event.actions[0])
        elif event.kind is EventKind.REPORT_READY and event.report is not None:
            self.dispatcher.notify_report(event.incident, event.report)
        elif event.kind is EventKind.APPROVAL_NEEDED and self.links is not None:
            self.dispatcher.notify_approval(event.incident, approval_links_for(event.actions, self.links))


class ReportSubscriber:
    """Queues a root-cause report for each new incident (ReportService writes it on its own workers). A reopened
    incident keeps its report: the fault is the same one, and its new findings are listed on the incident. Once
    remediation has planned its steps, the report's "What Argus did" is refreshed with them and their previews
    (the runner refreshes it again as each step ends: argus/wiring.py)."""

    name = "reports"

    def __init__(self, reports: ReportService) -> None:
        self.reports = reports

    def receive(self, event: IncidentEvent) -> None:
        if event.kind is EventKind.OPENED:
            self.reports.submit(event.incident.id)
        elif event.kind is EventKind.PLANNED and event.actions:
            self.reports.refresh(event.incident.id)


class RemediationSubscriber:
    """Plans the policy's steps for each new incident; steps that wait for a decision are announced."""

    name = "remediation"

    def __init__(self, remediator: Remediator, events: EventSink) -> None:
        self.remediator = remediator
        self.events = events

    def receive(self, event: IncidentEvent) -> None:
        # Only a new incident is planned. A reopened one (UPDATED, detail "reopened") is not planned again: its
        # steps are keyed by the incident's id, so a second plan would only find the first one's steps, and a
        # fault that keeps coming back after a drain or a resubmit is one that repeating them did not fix; the
        # safety rules say never repeat a drain or a resubmit on our own. The reopening reaches IM and the
        # webhooks (the ops agent), who can plan steps again (POST /v1/incidents/{id}/actions).
        if event.kind is not EventKind.OPENED:
            return
        planned = self.remediator.plan(event.incident)
        waiting = waiting_for_decision(planned)
        if waiting:
            self.events.publish(IncidentEvent.approval_needed(event.incident, waiting))
        self.events.publish(IncidentEvent.planned(event.incident, planned))


class MetricsSubscriber:
    """Counts opened incidents (wherever they came from) and keeps the open-incident series current: refreshed at
    most every `refresh_every_s`, so a storm of thousands of events reads the store a few times, not thousands; the
    loop refreshes them after every tick too (argus/wiring.py), so a change is seen a tick later at the latest."""

    name = "metrics"

    def __init__(self, metrics: ArgusMetrics, store: Any, *, refresh_every_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.store = store
        self.refresh_every_s = refresh_every_s
        self._clock = clock
        self._refreshed_at = float("-inf")

    def receive(self, event: IncidentEvent) -> None:
        if event.kind is EventKind.OPENED:
            self.metrics.incident_opened(event.incident)
        if event.kind in LIFECYCLE and self._clock() - self._refreshed_at >= self.refresh_every_s:
            self._refreshed_at = self._clock()
            try:
                self.metrics.refresh_incidents(self.store)
            except Exception as exc:  # the store being busy: the next tick refreshes them again
                logger.warning("could not refresh the open-incident series: {}", exc)


def waiting_for_decision(actions: Sequence[Action]) -> list[Action]:
    """The planned steps that wait for a person (a dry run waits for nobody)."""
    return [a for a in actions if a.state is ActionState.PLANNED and not a.dry_run]
