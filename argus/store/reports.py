"""Reports (root-cause analyses) of incidents: appended, never changed; the latest is an incident's current one."""

from __future__ import annotations

from sqlalchemy import Engine, select

from argus.store.incidents import require_incident
from argus.store.models import ReportRow
from argus.store.repository import new_id, saved, transaction
from core.types import Report


class ReportRepository:
    """Reports of incidents. Thread-safe; the Store holds one as `store.reports`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def add(self, report: Report) -> Report:
        """Store `report` for its incident. An empty `report.id` gets a new "rep-" id."""
        with transaction(self._engine, "adding a report") as s:
            require_incident(s, report.incident_id)
            row = ReportRow.from_domain(report, id=report.id or new_id("rep"))
            s.add(row)
            return saved(s, row).to_domain()

    def for_incident(self, incident_id: str) -> list[Report]:
        """An incident's reports, oldest first (the last is the latest)."""
        with transaction(self._engine, "reading reports", read_only=True) as s:
            require_incident(s, incident_id)
            rows = s.scalars(
                select(ReportRow)
                .where(ReportRow.incident_id == incident_id)
                .order_by(ReportRow.created_at, ReportRow.id)
            )
            return [row.to_domain() for row in rows]
