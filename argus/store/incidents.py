"""Incidents and their findings: a finding is filed under the not-resolved incident with its fingerprint
(reopening the one resolved moments ago, or opening one if none), echoes of a root cause are attached or merged
into it, and incidents move between states. Incidents and findings are one aggregate: every change to both
happens in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Literal

from loguru import logger
from sqlalchemy import Engine, Text, cast, func, or_, select
from sqlalchemy.orm import Session

from argus.store.columns import as_utc
from argus.store.models import FINGERPRINT_MAX, SUBJECT_ID_MAX, FindingRow, IncidentRow
from argus.store.repository import check_limit, new_id, parse_enum, retry_lost_races, saved, transaction
from core.errors import InputError, NotFound
from core.signal_keys import JOBS
from core.types import (
    REOPENED,
    REOPENED_AT,
    RESOLUTION,
    RESOLVED_BEFORE,
    Category,
    Finding,
    Incident,
    IncidentState,
    Severity,
    SubjectKind,
    utcnow,
)

MAX_FINDINGS_PER_INCIDENT = 50
# An incident keeps this many of its severity changes (the newest) in attrs["severity_changes"].
_SEVERITY_CHANGES_KEPT = 10
# An incident names at most this many fingerprints it absorbed as echoes (the newest).
_ECHOES_KEPT = 50
_PLAIN_WORD = re.compile(r"[A-Za-z0-9._:-]{4,200}")  # JSON writes these as they are (LIKE's _ is escaped)

# A resolution's by and reason (core.types.RESOLUTION) are cut to this many characters each.
RESOLUTION_CHARS = 500
# What filing a finding did: opened a new incident, folded it into the open one (raised: and its severity rose, the
# change recorded in attrs["severity_changes"]), or reopened a resolved one.
Recorded = Literal["opened", "folded", "raised", "reopened"]


class IncidentRepository:
    """Incidents and the findings kept for them. Thread-safe; the Store holds one as `store.incidents`."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], datetime] = utcnow,
        max_findings_per_incident: int = MAX_FINDINGS_PER_INCIDENT,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._max_findings = max_findings_per_incident

    def record(self, finding: Finding) -> tuple[Incident, bool]:
        """File `finding` under the not-resolved incident with its fingerprint, opening one if none.

        Returns the incident and whether it was opened now. A repeat bumps occurrences and last_seen,
        raises the severity if higher, and keeps the finding itself only if its reason or evidence is
        new, up to the per-incident cap.
        """
        incident, recorded = self.file(finding)
        return incident, recorded == "opened"

    def file(self, finding: Finding, *, reopen_within_s: float = 0.0) -> tuple[Incident, Recorded]:
        """File `finding` like `record`, and also reopen: when no incident with its fingerprint is open and the
        latest one with it was resolved at most `reopen_within_s` ago (0: never), that incident opens again, its
        reopen count (attrs "reopened") one higher, instead of a new one opening.

        The fault came back; a person's resolve counts like a detector's recovery. An incident merged into its root
        cause is not reopened (it lives on there). Concurrent filers reopen once: the row is locked, and the index of
        open fingerprints turns a second opening into a lost race that is retried and folds.
        """
        if len(finding.fingerprint) > FINGERPRINT_MAX:
            raise InputError(
                f"finding {finding.reason!r} has a fingerprint of {len(finding.fingerprint)} characters",
                hint=f"fingerprints are at most {FINGERPRINT_MAX}; use core.types.fingerprint_of",
            )
        if reopen_within_s < 0:
            raise InputError(f"reopen window of {reopen_within_s} s is negative", hint="use 0 (never) or more")
        return retry_lost_races(
            lambda: self._file_once(finding, reopen_within_s),
            retrying=f"lost the race to open incident {finding.fingerprint}; retrying",
        )

    def _file_once(self, finding: Finding, reopen_within_s: float) -> tuple[Incident, Recorded]:
        digest = finding_digest(finding)
        with transaction(self._engine, "recording a finding") as s:
            row = s.scalars(
                select(IncidentRow)
                .where(IncidentRow.fingerprint == finding.fingerprint)
                .where(IncidentRow.state != IncidentState.RESOLVED.value)
                .with_for_update()
            ).first()
            recorded: Recorded = "folded"
            if row is None and reopen_within_s > 0:
                row = self._resolved_since(s, finding.fingerprint, self._clock() - timedelta(seconds=reopen_within_s))
                if row is not None:
                    self._reopen(row)
                    recorded = "reopened"
            if row is None:
                row = IncidentRow.from_finding(finding, id=new_id("inc"), detected_at=self._clock())
                s.add(row)
                s.flush()
                s.add(FindingRow.from_domain(finding, incident_id=row.id, digest=digest))
                logger.info("opened incident {} ({}: {})", row.id, row.category, row.reason)
                return saved(s, row).to_domain(), "opened"
            row.occurrences += 1
            row.last_seen = max(row.last_seen, as_utc(finding.detected_at))
            row.first_seen = min(row.first_seen, as_utc(finding.first_seen))
            if finding.severity.rank > Severity(row.severity).rank:
                self._record_severity(row, finding.severity, f"{finding.reason}: {finding.summary}")
                recorded = "raised" if recorded == "folded" else recorded
            if row.recommended_action is None and finding.recommended_action:
                row.recommended_action = finding.recommended_action
            self._keep_if_new(s, row, finding, digest)
            return saved(s, row).to_domain(), recorded

    def _resolved_since(self, s: Session, fingerprint: str, since: datetime) -> IncidentRow | None:
        """The incident with `fingerprint` resolved last, locked, if that was at or after `since` and it was not
        merged into another."""
        row = s.scalars(
            select(IncidentRow)
            .where(IncidentRow.fingerprint == fingerprint)
            .where(IncidentRow.state == IncidentState.RESOLVED.value)
            .where(IncidentRow.resolved_at.is_not(None))
            .order_by(IncidentRow.resolved_at.desc(), IncidentRow.id.desc())
            .limit(1)
            .with_for_update()
        ).first()
        if row is None or row.resolved_at is None or as_utc(row.resolved_at) < since:
            return None
        return None if (row.attrs or {}).get("merged_into") else row

    def _reopen(self, row: IncidentRow) -> None:
        attrs = dict(row.attrs or {})
        count = attrs.get(REOPENED, 0)
        count = (count if isinstance(count, int) and not isinstance(count, bool) else 0) + 1
        resolved = {RESOLVED_BEFORE: as_utc(row.resolved_at).isoformat()} if row.resolved_at else {}
        attrs.pop(RESOLUTION, None)
        row.attrs = {**attrs, REOPENED: count, REOPENED_AT: self._clock().isoformat(), **resolved}
        row.state = IncidentState.OPEN.value
        row.resolved_at = None
        logger.info("reopened incident {} ({}: {}), {} time(s) now", row.id, row.category, row.reason, count)

    def attach(self, incident_id: str, finding: Finding) -> Incident:
        """File `finding` under an existing incident it is an echo of (another fingerprint, same cause).

        The echo counts as an occurrence and is kept as a finding row (within the cap); the incident's
        category, subject and severity stay those of its root cause.
        """
        digest = finding_digest(finding)
        with transaction(self._engine, "attaching a finding") as s:
            row = incident_row(s, incident_id, for_update=True)
            row.occurrences += 1
            row.last_seen = max(row.last_seen, as_utc(finding.detected_at))
            _note_echo(row, finding.fingerprint)
            _learn_jobs(row, finding)
            self._keep_if_new(s, row, finding, digest)
            return saved(s, row).to_domain()

    def merge(self, echo_id: str, root_id: str) -> Incident:
        """Fold incident `echo_id` into `root_id`: its findings join the root and it is resolved as merged."""
        if echo_id == root_id:
            raise InputError(f"cannot merge incident {echo_id} into itself", hint="name two incidents")
        with transaction(self._engine, "merging incidents") as s:
            echo = incident_row(s, echo_id, for_update=True)
            root = incident_row(s, root_id, for_update=True)
            known = set(s.scalars(select(FindingRow.digest).where(FindingRow.incident_id == root.id)).all())
            for f in s.scalars(select(FindingRow).where(FindingRow.incident_id == echo.id).order_by(FindingRow.id)):
                if f.digest not in known and len(known) < self._max_findings:
                    known.add(f.digest)
                    s.add(FindingRow.from_domain(f.to_domain(), incident_id=root.id, digest=f.digest))
            root.occurrences += echo.occurrences
            root.first_seen = min(root.first_seen, echo.first_seen)
            root.last_seen = max(root.last_seen, echo.last_seen)
            _note_echo(root, echo.fingerprint)
            attrs = {**(echo.attrs or {}), "merged_into": root.id}
            if echo.state != IncidentState.RESOLVED.value:
                echo.state = IncidentState.RESOLVED.value
                echo.resolved_at = self._clock()
                attrs[RESOLUTION] = {"by": "argus", "reason": f"merged into {root.id}: the same fault, told there",
                                     "at": as_utc(echo.resolved_at).isoformat()}
            echo.attrs = attrs
            logger.info("incident {} merged into {} (an echo of its root cause)", echo_id, root_id)
            return saved(s, root).to_domain()

    def get(self, incident_id: str) -> Incident:
        with transaction(self._engine, "reading an incident", read_only=True) as s:
            return incident_row(s, incident_id).to_domain()

    def find_open(self, fingerprint: str) -> Incident | None:
        """The not-resolved incident with `fingerprint`, if any."""
        with transaction(self._engine, "finding an open incident", read_only=True) as s:
            row = s.scalars(
                select(IncidentRow)
                .where(IncidentRow.fingerprint == fingerprint)
                .where(IncidentRow.state != IncidentState.RESOLVED.value)
            ).first()
            return None if row is None else row.to_domain()

    def findings(self, incident_id: str) -> list[Finding]:
        """The findings kept for an incident, oldest first."""
        with transaction(self._engine, "reading findings", read_only=True) as s:
            require_incident(s, incident_id)
            rows = s.scalars(select(FindingRow).where(FindingRow.incident_id == incident_id).order_by(FindingRow.id))
            return [row.to_domain() for row in rows]

    def set_state(self, incident_id: str, state: IncidentState | str, *, by: str = "", reason: str = "") -> Incident:
        """Move an incident to `state`. Resolving stamps resolved_at and records who resolved it and why in
        attrs["resolution"] ({by, reason, at}: what the API, the web page, webhooks and IM show); reopening clears
        both (the reopen count keeps the history)."""
        new = parse_enum(IncidentState, state, "state")
        with transaction(self._engine, "changing an incident's state") as s:
            row = incident_row(s, incident_id, for_update=True)
            if row.state == new.value:
                return row.to_domain()
            if row.state == IncidentState.RESOLVED.value:
                other = s.scalars(
                    select(IncidentRow.id)
                    .where(IncidentRow.fingerprint == row.fingerprint)
                    .where(IncidentRow.state != IncidentState.RESOLVED.value)
                ).first()
                if other is not None:
                    raise InputError(
                        f"cannot reopen incident {incident_id}: incident {other} is already open for the "
                        "same fingerprint",
                        hint=f"work on {other} instead",
                    )
            now = self._clock()
            row.state = new.value
            row.resolved_at = now if new is IncidentState.RESOLVED else None
            attrs = {k: v for k, v in (row.attrs or {}).items() if k != RESOLUTION}
            if new is IncidentState.RESOLVED:
                attrs[RESOLUTION] = {"by": by[:RESOLUTION_CHARS], "reason": reason[:RESOLUTION_CHARS],
                                     "at": as_utc(now).isoformat()}
            row.attrs = attrs
            logger.info("incident {} is now {}", incident_id, new.value)
            return saved(s, row).to_domain()

    def set_severity(self, incident_id: str, severity: Severity | str, *, reason: str) -> Incident:
        """Set an incident's severity, recording the change (from, to, why, when) in attrs["severity_changes"]: how
        a fault ended can show it mattered less than the finding that opened it claimed."""
        new = parse_enum(Severity, severity, "severity")
        with transaction(self._engine, "changing an incident's severity") as s:
            row = incident_row(s, incident_id, for_update=True)
            if row.severity == new.value:
                return row.to_domain()
            self._record_severity(row, new, reason)
            return saved(s, row).to_domain()

    def _record_severity(self, row: IncidentRow, new: Severity, reason: str) -> None:
        change = {"from": row.severity, "to": new.value, "reason": reason[:500], "at": self._clock().isoformat()}
        changes = [*dict(row.attrs or {}).get("severity_changes", []), change][-_SEVERITY_CHANGES_KEPT:]
        row.attrs = {**(row.attrs or {}), "severity_changes": changes}
        row.severity = new.value
        logger.info("incident {} severity {} -> {}: {}", row.id, change["from"], new.value, reason[:200])

    def list(
        self,
        *,
        state: IncidentState | str | None = None,
        category: Category | str | None = None,
        subject_id: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
        states: Collection[IncidentState] | None = None,
        categories: Collection[Category] | None = None,
        not_subject_kind: SubjectKind | None = None,
        mentions: str | None = None,
    ) -> list[Incident]:
        """Incidents, newest opened first. `since` keeps those seen (last_seen) at or after it. For the correlator,
        which reads open incidents on every finding: `states` and `categories` (any of them), `not_subject_kind`,
        and `mentions`, a word that is the incident's fingerprint or appears in its attrs (an echo's fingerprint):
        filters in the database, so a storm of alerts does not turn every open incident into an object per finding.
        `mentions` narrows by the attrs' JSON text, so callers still check what they need; a word JSON would escape
        is not used."""
        check_limit(limit)
        if offset < 0:
            raise InputError(f"offset {offset} is negative", hint="use 0 or more")
        query = select(IncidentRow)
        if state is not None:
            query = query.where(IncidentRow.state == parse_enum(IncidentState, state, "state").value)
        if states is not None:
            query = query.where(IncidentRow.state.in_([s.value for s in states]))
        if category is not None:
            query = query.where(IncidentRow.category == parse_enum(Category, category, "category").value)
        if categories is not None:
            query = query.where(IncidentRow.category.in_([c.value for c in categories]))
        if not_subject_kind is not None:
            query = query.where(IncidentRow.subject_kind != not_subject_kind.value)
        if mentions is not None and _PLAIN_WORD.fullmatch(mentions):
            query = query.where(or_(IncidentRow.fingerprint == mentions,
                                    cast(IncidentRow.attrs, Text).contains(mentions, autoescape=True)))
        if subject_id is not None:
            query = query.where(IncidentRow.subject_id == subject_id[:SUBJECT_ID_MAX])
        if since is not None:
            query = query.where(IncidentRow.last_seen >= since)
        # The id breaks ties so pages never overlap or skip when two incidents open in one instant.
        query = query.order_by(IncidentRow.detected_at.desc(), IncidentRow.id.desc()).limit(limit).offset(offset)
        with transaction(self._engine, "listing incidents", read_only=True) as s:
            return [row.to_domain() for row in s.scalars(query)]

    def count_by_category(self, states: Collection[IncidentState]) -> dict[str, int]:
        """How many incidents in `states` there are of each category (one GROUP BY, whatever the count)."""
        query = (select(IncidentRow.category, func.count()).where(IncidentRow.state.in_([s.value for s in states]))
                 .group_by(IncidentRow.category))
        with transaction(self._engine, "counting incidents", read_only=True) as s:
            return {str(category): int(n) for category, n in s.execute(query).all()}

    def _keep_if_new(self, s: Session, row: IncidentRow, finding: Finding, digest: str) -> None:
        """Keep `finding` under `row` unless one with its digest is kept already or the cap is reached."""
        known = s.scalars(select(FindingRow.digest).where(FindingRow.incident_id == row.id)).all()
        if digest not in known and len(known) < self._max_findings:
            s.add(FindingRow.from_domain(finding, incident_id=row.id, digest=digest))


def require_incident(s: Session, incident_id: str) -> None:
    """NotFound unless the incident exists: its id alone is read (the repositories of what belongs to an incident
    check it on every call; loading the row would parse its JSON each time)."""
    if s.scalars(select(IncidentRow.id).where(IncidentRow.id == incident_id)).first() is None:
        raise _no_incident(incident_id)


def incident_row(s: Session, incident_id: str, *, for_update: bool = False) -> IncidentRow:
    """The incident's row, locked when `for_update`; NotFound if there is none. Also used by the
    repositories of what belongs to an incident (actions, reports), inside their own transaction."""
    query = select(IncidentRow).where(IncidentRow.id == incident_id)
    row = s.scalars(query.with_for_update() if for_update else query).first()
    if row is None:
        raise _no_incident(incident_id)
    return row


def _no_incident(incident_id: str) -> NotFound:
    return NotFound(f"incident {incident_id!r} does not exist",
                    hint="list incidents with `argus incidents list` or GET /v1/incidents")


def finding_digest(finding: Finding) -> str:
    """sha256 of the finding's reason and evidence: a repeat with the same digest adds nothing."""
    evidence = [(e.source, e.text, e.line) for e in finding.evidence]
    raw = json.dumps([finding.reason, evidence], ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def _learn_jobs(row: IncidentRow, finding: Finding) -> None:
    """A lost node's incident opened by a finding that did not know the node's jobs (a log line saying it died, read
    before Ray's state listed them) learns them from a later finding about the same node: remediation resubmits the
    jobs the incident lists."""
    jobs = finding.attrs.get(JOBS)
    same_subject = (finding.subject.kind.value == row.subject_kind
                    and finding.subject.id[:SUBJECT_ID_MAX] == row.subject_id)
    if jobs and same_subject and not dict(row.attrs or {}).get(JOBS):
        row.attrs = {**(row.attrs or {}), JOBS: jobs}


def _note_echo(row: IncidentRow, fingerprint: str) -> None:
    echoes = dict(row.attrs or {}).get("echoes", [])
    if fingerprint not in echoes:
        row.attrs = {**(row.attrs or {}), "echoes": [*echoes, fingerprint][-_ECHOES_KEPT:]}
