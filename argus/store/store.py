"""The store: findings deduplicated into incidents, actions, reports, API tokens and the audit log,
in SQLite or PostgreSQL.

One Store is shared by the API and the daemon loop, from different threads: every method opens its own
short transaction. Every database error leaves here as one of core.errors, with the password masked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from loguru import logger
from pydantic_core import to_jsonable_python
from sqlalchemy import exc, select
from sqlalchemy.orm import Session

from argus.store import migrate
from argus.store.models import (
    FINGERPRINT_MAX,
    SUBJECT_ID_MAX,
    ActionRow,
    ApiTokenRow,
    AuditRow,
    DeliveryRow,
    FindingRow,
    IncidentRow,
    ReportRow,
    clean_json,
)
from argus.store.nodes import SqlNodeRegistry
from argus.store.tokens import (
    NAME_MAX,
    AuditRecord,
    Role,
    TokenRecord,
    hash_token,
    new_token,
    outcome_of,
    prefix_of,
    valid_name,
)
from core.errors import Conflict, InputError, NotFound, StoreError
from core.types import (
    Action,
    ActionState,
    Category,
    Evidence,
    Finding,
    Incident,
    IncidentState,
    Report,
    Severity,
    Subject,
    utcnow,
)

MAX_FINDINGS_PER_INCIDENT = 50
MAX_LIST_LIMIT = 1000
# Losing the open-incident race raises an IntegrityError; the retry then finds the winner's row.
_RECORD_ATTEMPTS = 5
# last_used_at is written at most this often per token, so reads do not each cost a write.
_LAST_USED_EVERY = timedelta(seconds=60)
# Compared against when no row has the token's prefix, so a miss costs the same compare as a hit.
_NO_HASH = "0" * 64


def new_id(prefix: str) -> str:
    """A short readable id: "inc-", "act-" or "rep-" and 12 hex characters."""
    return f"{prefix}-{secrets.token_hex(6)}"


class Store:
    """Incidents, their findings, actions and reports. Thread-safe; one per process is enough."""

    def __init__(
        self,
        url: str,
        *,
        auto_migrate: bool = True,
        clock: Callable[[], datetime] = utcnow,
        max_findings_per_incident: int = MAX_FINDINGS_PER_INCIDENT,
    ) -> None:
        self._engine = migrate.open_engine(url)
        self._url = self._engine.url
        self._clock = clock
        self._max_findings = max_findings_per_incident
        try:
            if auto_migrate:
                migrate.upgrade_engine(self._engine)
            else:
                self._check_revision()
        except BaseException:
            self._engine.dispose()
            raise
        logger.debug("incident store ready at {}", self.address)

    @property
    def address(self) -> str:
        """The database URL with the password masked: safe to log and show."""
        return migrate.mask_url(self._url)

    def close(self) -> None:
        self._engine.dispose()

    def nodes(self) -> SqlNodeRegistry:
        """The registry of GPU nodes in this store's database, sharing its connections and clock."""
        return SqlNodeRegistry(self._engine, clock=self._clock)

    def _check_revision(self) -> None:
        have, want = migrate.revision_of(self._engine), migrate.head_revision()
        if have != want:
            raise StoreError(
                f"database {self.address} is at schema revision {have or 'none'}, this Argus needs {want}",
                hint="run `argus db upgrade`, or start the Store with auto_migrate=True",
            )

    @contextmanager
    def _session(self, doing: str) -> Iterator[Session]:
        with migrate.connected(self._engine, doing) as conn:
            # The Session works inside the connection's transaction, which `connected` commits and
            # whose errors it wraps; rows are re-read after writes (`_saved`) so callers get what the
            # database holds: cleaned text, UTC times.
            with Session(bind=conn, expire_on_commit=False, join_transaction_mode="rollback_only") as s:
                yield s
                s.flush()

    # ---- incidents ----------------------------------------------------------------------------------

    def record_finding(self, finding: Finding) -> tuple[Incident, bool]:
        """File `finding` under the not-resolved incident with its fingerprint, opening one if none.

        Returns the incident and whether it was opened now. A repeat bumps occurrences and last_seen,
        raises the severity if higher, and keeps the finding itself only if its reason or evidence is
        new, up to the per-incident cap.
        """
        if len(finding.fingerprint) > FINGERPRINT_MAX:
            raise InputError(
                f"finding {finding.reason!r} has a fingerprint of {len(finding.fingerprint)} characters",
                hint=f"fingerprints are at most {FINGERPRINT_MAX}; use core.types.fingerprint_of",
            )
        for attempt in range(1, _RECORD_ATTEMPTS + 1):
            try:
                return self._record_once(finding)
            except StoreError as err:
                if not isinstance(err.__cause__, exc.IntegrityError) or attempt == _RECORD_ATTEMPTS:
                    raise
                logger.debug("lost the race to open incident {}; retrying", finding.fingerprint)
        raise AssertionError("unreachable")

    def _record_once(self, finding: Finding) -> tuple[Incident, bool]:
        digest = _finding_digest(finding)
        with self._session("recording a finding") as s:
            row = s.scalars(
                select(IncidentRow)
                .where(IncidentRow.fingerprint == finding.fingerprint)
                .where(IncidentRow.state != IncidentState.RESOLVED.value)
                .with_for_update()
            ).first()
            if row is None:
                row = _incident_row(finding, new_id("inc"), self._clock())
                s.add(row)
                s.flush()
                s.add(_finding_row(finding, row.id, digest))
                logger.info("opened incident {} ({}: {})", row.id, row.category, row.reason)
                return _incident(_saved(s, row)), True
            row.occurrences += 1
            row.last_seen = max(row.last_seen, _utc(finding.detected_at))
            row.first_seen = min(row.first_seen, _utc(finding.first_seen))
            if finding.severity.rank > Severity(row.severity).rank:
                row.severity = finding.severity.value
            if row.recommended_action is None and finding.recommended_action:
                row.recommended_action = finding.recommended_action
            known = s.scalars(select(FindingRow.digest).where(FindingRow.incident_id == row.id)).all()
            if digest not in known and len(known) < self._max_findings:
                s.add(_finding_row(finding, row.id, digest))
            return _incident(_saved(s, row)), False

    def attach_finding(self, incident_id: str, finding: Finding) -> Incident:
        """File `finding` under an existing incident it is an echo of (another fingerprint, same cause).

        The echo counts as an occurrence and is kept as a finding row (within the cap); the incident's
        category, subject and severity stay those of its root cause.
        """
        digest = _finding_digest(finding)
        with self._session("attaching a finding") as s:
            row = self._incident_row(s, incident_id, for_update=True)
            row.occurrences += 1
            row.last_seen = max(row.last_seen, _utc(finding.detected_at))
            echoes = dict(row.attrs or {}).get("echoes", [])
            if finding.fingerprint not in echoes:
                row.attrs = {**(row.attrs or {}), "echoes": [*echoes, finding.fingerprint][-50:]}
            known = s.scalars(select(FindingRow.digest).where(FindingRow.incident_id == row.id)).all()
            if digest not in known and len(known) < self._max_findings:
                s.add(_finding_row(finding, row.id, digest))
            return _incident(_saved(s, row))

    def merge_into(self, echo_id: str, root_id: str) -> Incident:
        """Fold incident `echo_id` into `root_id`: its findings join the root and it is resolved as merged."""
        if echo_id == root_id:
            raise InputError(f"cannot merge incident {echo_id} into itself", hint="name two incidents")
        with self._session("merging incidents") as s:
            echo = self._incident_row(s, echo_id, for_update=True)
            root = self._incident_row(s, root_id, for_update=True)
            known = set(s.scalars(select(FindingRow.digest).where(FindingRow.incident_id == root.id)).all())
            for f in s.scalars(select(FindingRow).where(FindingRow.incident_id == echo.id).order_by(FindingRow.id)):
                if f.digest not in known and len(known) < self._max_findings:
                    known.add(f.digest)
                    s.add(_finding_row(_finding(f), root.id, f.digest))
            root.occurrences += echo.occurrences
            root.first_seen = min(root.first_seen, echo.first_seen)
            root.last_seen = max(root.last_seen, echo.last_seen)
            echoes = dict(root.attrs or {}).get("echoes", [])
            if echo.fingerprint not in echoes:
                root.attrs = {**(root.attrs or {}), "echoes": [*echoes, echo.fingerprint][-50:]}
            if echo.state != IncidentState.RESOLVED.value:
                echo.state = IncidentState.RESOLVED.value
                echo.resolved_at = self._clock()
            echo.attrs = {**(echo.attrs or {}), "merged_into": root.id}
            logger.info("incident {} merged into {} (an echo of its root cause)", echo_id, root_id)
            return _incident(_saved(s, root))

    def get_incident(self, incident_id: str) -> Incident:
        with self._session("reading an incident") as s:
            return _incident(self._incident_row(s, incident_id))

    def find_open(self, fingerprint: str) -> Incident | None:
        """The not-resolved incident with `fingerprint`, if any."""
        with self._session("finding an open incident") as s:
            row = s.scalars(
                select(IncidentRow)
                .where(IncidentRow.fingerprint == fingerprint)
                .where(IncidentRow.state != IncidentState.RESOLVED.value)
            ).first()
            return None if row is None else _incident(row)

    def list_incidents(
        self,
        *,
        state: IncidentState | str | None = None,
        category: Category | str | None = None,
        subject_id: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Incident]:
        """Incidents, newest opened first. `since` keeps those seen (last_seen) at or after it."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InputError(f"limit {limit} is out of range", hint=f"use 1 to {MAX_LIST_LIMIT}")
        if offset < 0:
            raise InputError(f"offset {offset} is negative", hint="use 0 or more")
        query = select(IncidentRow)
        if state is not None:
            query = query.where(IncidentRow.state == _enum(IncidentState, state, "state").value)
        if category is not None:
            query = query.where(IncidentRow.category == _enum(Category, category, "category").value)
        if subject_id is not None:
            query = query.where(IncidentRow.subject_id == subject_id[:SUBJECT_ID_MAX])
        if since is not None:
            query = query.where(IncidentRow.last_seen >= since)
        # The id breaks ties so pages never overlap or skip when two incidents open in one instant.
        query = query.order_by(IncidentRow.detected_at.desc(), IncidentRow.id.desc()).limit(limit).offset(offset)
        with self._session("listing incidents") as s:
            return [_incident(row) for row in s.scalars(query)]

    def findings_for(self, incident_id: str) -> list[Finding]:
        """The findings kept for an incident, oldest first."""
        with self._session("reading findings") as s:
            self._incident_row(s, incident_id)
            rows = s.scalars(select(FindingRow).where(FindingRow.incident_id == incident_id).order_by(FindingRow.id))
            return [_finding(row) for row in rows]

    def set_state(self, incident_id: str, state: IncidentState | str) -> Incident:
        """Move an incident to `state`. Resolving stamps resolved_at; reopening clears it."""
        new = _enum(IncidentState, state, "state")
        with self._session("changing an incident's state") as s:
            row = self._incident_row(s, incident_id, for_update=True)
            if row.state == new.value:
                return _incident(row)
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
            row.state = new.value
            row.resolved_at = self._clock() if new is IncidentState.RESOLVED else None
            logger.info("incident {} is now {}", incident_id, new.value)
            return _incident(_saved(s, row))

    def _incident_row(self, s: Session, incident_id: str, *, for_update: bool = False) -> IncidentRow:
        query = select(IncidentRow).where(IncidentRow.id == incident_id)
        row = s.scalars(query.with_for_update() if for_update else query).first()
        if row is None:
            raise NotFound(
                f"incident {incident_id!r} does not exist",
                hint="list incidents with `argus incidents list` or GET /api/incidents",
            )
        return row

    # ---- actions ------------------------------------------------------------------------------------

    def add_action(self, action: Action) -> Action:
        """Store `action`; if its idempotency key is already stored, return that action instead.

        An empty `action.id` gets a new "act-" id.
        """
        for attempt in range(1, _RECORD_ATTEMPTS + 1):
            try:
                return self._add_action_once(action)
            except StoreError as err:
                # Another process stored the same key between our check and insert: the retry returns it.
                if not isinstance(err.__cause__, exc.IntegrityError) or attempt == _RECORD_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _add_action_once(self, action: Action) -> Action:
        with self._session("adding an action") as s:
            existing = s.scalars(select(ActionRow).where(ActionRow.idempotency_key == action.idempotency_key)).first()
            if existing is not None:
                return _action(existing)
            if action.incident_id is not None:
                self._incident_row(s, action.incident_id)
            if action.id and s.get(ActionRow, action.id) is not None:
                raise InputError(
                    f"action {action.id!r} already exists with another idempotency key",
                    hint="leave Action.id empty to get a new id, or reuse the first action's key",
                )
            row = _action_row(action, action.id or new_id("act"))
            s.add(row)
            return _action(_saved(s, row))

    def get_action(self, action_id: str) -> Action:
        with self._session("reading an action") as s:
            return _action(self._action_row(s, action_id))

    def update_action(self, action_id: str, state: ActionState | str, result: dict[str, Any] | None = None) -> Action:
        """Set an action's state (and its result, replacing the old one, when given)."""
        new = _enum(ActionState, state, "state")
        with self._session("updating an action") as s:
            row = self._action_row(s, action_id, for_update=True)
            row.state = new.value
            if result is not None:
                row.result = _jsonable(result)
            row.updated_at = self._clock()
            return _action(_saved(s, row))

    def transition_action(
        self, action_id: str, from_states: tuple[ActionState, ...], to_state: ActionState,
        result: dict[str, Any] | None = None,
    ) -> Action:
        """Move an action only if it is still in one of `from_states` (a compare-and-set under a row lock), so of
        two runners claiming one action exactly one wins; Conflict for the other."""
        with self._session("moving an action") as s:
            row = self._action_row(s, action_id, for_update=True)
            if row.state not in {state.value for state in from_states}:
                raise Conflict(
                    f"action {action_id} is {row.state}, not {' or '.join(x.value for x in from_states)}",
                    hint="another runner or person changed it first; read it again",
                )
            row.state = to_state.value
            if result is not None:
                row.result = _jsonable(result)
            row.updated_at = self._clock()
            return _action(_saved(s, row))

    def list_actions(self, incident_id: str | None = None) -> list[Action]:
        """Actions, oldest first; only those of `incident_id` when given."""
        query = select(ActionRow).order_by(ActionRow.created_at, ActionRow.id)
        with self._session("listing actions") as s:
            if incident_id is not None:
                self._incident_row(s, incident_id)
                query = query.where(ActionRow.incident_id == incident_id)
            return [_action(row) for row in s.scalars(query)]

    def _action_row(self, s: Session, action_id: str, *, for_update: bool = False) -> ActionRow:
        query = select(ActionRow).where(ActionRow.id == action_id)
        row = s.scalars(query.with_for_update() if for_update else query).first()
        if row is None:
            raise NotFound(f"action {action_id!r} does not exist", hint="list actions with GET /api/actions")
        return row

    # ---- reports ------------------------------------------------------------------------------------

    def add_report(self, report: Report) -> Report:
        """Store `report` for its incident. An empty `report.id` gets a new "rep-" id."""
        with self._session("adding a report") as s:
            self._incident_row(s, report.incident_id)
            row = ReportRow(
                id=report.id or new_id("rep"),
                incident_id=report.incident_id,
                category=report.category.value,
                confidence=report.confidence,
                summary=report.summary,
                markdown=report.markdown,
                generator=report.generator,
                created_at=report.created_at,
                data=_jsonable(report.data),
            )
            s.add(row)
            return _report(_saved(s, row))

    def reports_for(self, incident_id: str) -> list[Report]:
        """An incident's reports, oldest first (the last is the latest)."""
        with self._session("reading reports") as s:
            self._incident_row(s, incident_id)
            rows = s.scalars(
                select(ReportRow)
                .where(ReportRow.incident_id == incident_id)
                .order_by(ReportRow.created_at, ReportRow.id)
            )
            return [_report(row) for row in rows]


    # ---- API tokens and audit -------------------------------------------------------------------------

    def create_token(
        self, name: str, role: Role | str, created_by: str, expires_at: datetime | None = None
    ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself, which is not stored and cannot be shown again."""
        if not valid_name(name):
            raise InputError(
                f"token name {name[:80]!r} is not allowed",
                hint=f"use letters, digits and . _ @ -, starting with a letter or digit, at most {NAME_MAX}",
            )
        role = _enum(Role, role, "role")
        now = self._clock()
        if expires_at is not None and _utc(expires_at) <= now:
            raise InputError(f"token {name!r} would expire at {expires_at.isoformat()}, already past",
                             hint="give an expiry in the future, or none")
        token, prefix = new_token()
        row = ApiTokenRow(
            id=new_id("tok"), name=name, role=role.value, prefix=prefix, token_hash=hash_token(token),
            created_at=now, created_by=created_by, expires_at=expires_at,
        )
        try:
            with self._session("creating a token") as s:
                if s.scalars(select(ApiTokenRow.id).where(ApiTokenRow.name == name)).first() is not None:
                    raise _name_taken(name)
                s.add(row)
                record = _token(_saved(s, row))
        except StoreError as err:
            if isinstance(err.__cause__, exc.IntegrityError):  # another process took the name meanwhile
                raise _name_taken(name) from None
            raise
        logger.info("API token {} ({}) created for role {} by {}", name, prefix, role.value, created_by)
        return record, token

    def verify_token(self, token: str) -> TokenRecord | None:
        """The record of a token that exists, is not revoked and has not expired; None for anything else."""
        prefix = prefix_of(token)
        if prefix is None:
            return None
        now = self._clock()
        with self._session("checking a token") as s:
            row = s.scalars(select(ApiTokenRow).where(ApiTokenRow.prefix == prefix)).first()
            matches = hmac.compare_digest(hash_token(token), row.token_hash if row else _NO_HASH)
            if row is None or not matches:
                return None
            record = _token(row)
            if not record.usable_at(now):
                return None
            if record.last_used_at is None or now - record.last_used_at >= _LAST_USED_EVERY:
                row.last_used_at = now
                record = _token(_saved(s, row))
            return record

    def revoke_token(self, name_or_id: str) -> TokenRecord:
        """Revoke a token by name or id; revoking twice keeps the first time. NotFound if there is none."""
        with self._session("revoking a token") as s:
            row = s.scalars(
                select(ApiTokenRow).where((ApiTokenRow.name == name_or_id) | (ApiTokenRow.id == name_or_id))
            ).first()
            if row is None:
                raise NotFound(f"no API token named {name_or_id[:80]!r}", hint="list them with `argus tokens list`")
            if row.revoked_at is None:
                row.revoked_at = self._clock()
                logger.info("API token {} ({}) revoked", row.name, row.prefix)
            return _token(_saved(s, row))

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones too, oldest first."""
        with self._session("listing tokens") as s:
            rows = s.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id))
            return [_token(row) for row in rows]

    def audit(
        self,
        *,
        actor: str,
        role: Role | str | None,
        method: str,
        path: str,
        status: int,
        target: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditRecord:
        """Record one call: who (token name, role), what (method, path, target), when (now), the result."""
        row = AuditRow(
            at=self._clock(), actor=actor, role=None if role is None else Role(role).value,
            method=method.upper()[:16], path=path, target=target, status=status, outcome=outcome_of(status),
            detail=_jsonable(detail or {}),
        )
        with self._session("writing the audit log") as s:
            s.add(row)
            return _audit(_saved(s, row))

    def list_audit(self, limit: int = 100, since: datetime | None = None) -> list[AuditRecord]:
        """Audit records, newest first; `since` keeps those at or after it."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InputError(f"limit {limit} is out of range", hint=f"use 1 to {MAX_LIST_LIMIT}")
        query = select(AuditRow)
        if since is not None:
            query = query.where(AuditRow.at >= since)
        query = query.order_by(AuditRow.at.desc(), AuditRow.id.desc()).limit(limit)
        with self._session("reading the audit log") as s:
            return [_audit(row) for row in s.scalars(query)]

    # ---- notification deliveries (append only) --------------------------------------------------------

    def record_delivery(
        self, *, key: str, incident_id: str | None, event: str, channel: str, ok: bool, attempts: int,
        status: int | None = None, error: str | None = None, detail: dict[str, Any] | None = None,
    ) -> DeliveryRecord:
        """Append one attempt to tell `channel` about `event` of an incident (argus.notify.dispatcher)."""
        if not key or len(key) > 255:
            raise InputError(f"delivery key of {len(key)} characters", hint="keys are 1 to 255 characters")
        row = DeliveryRow(
            key=key, incident_id=incident_id, event=event[:32], channel=channel[:64], ok=ok, attempts=attempts,
            status=status, error=error[:2000] if error else None, at=self._clock(), detail=_jsonable(detail or {}),
        )
        with self._session("recording a notification delivery") as s:
            s.add(row)
            return _delivery(_saved(s, row))

    def delivery_sent(self, key: str) -> bool:
        """Whether a delivery with `key` succeeded: the dispatcher's dedup, which survives a restart."""
        with self._session("checking a notification delivery") as s:
            query = select(DeliveryRow.id).where(DeliveryRow.key == key).where(DeliveryRow.ok.is_(True)).limit(1)
            return s.scalars(query).first() is not None

    def list_deliveries(self, incident_id: str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        """Delivery attempts, newest first; only those about `incident_id` when given."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InputError(f"limit {limit} is out of range", hint=f"use 1 to {MAX_LIST_LIMIT}")
        query = select(DeliveryRow)
        if incident_id is not None:
            query = query.where(DeliveryRow.incident_id == incident_id)
        query = query.order_by(DeliveryRow.at.desc(), DeliveryRow.id.desc()).limit(limit)
        with self._session("listing notification deliveries") as s:
            return [_delivery(row) for row in s.scalars(query)]

# ---- conversions between rows and core.types ----------------------------------------------------------


def _enum(kind: Any, value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise InputError(f"{name} {value!r} is not one of {allowed}", hint=f"use one of {allowed}") from None


def _saved(s: Session, row: Any) -> Any:
    s.flush()
    s.refresh(row)
    return row


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _jsonable(value: Any) -> Any:
    """Plain JSON values; datetimes become ISO strings, anything unknown its str()."""
    return clean_json(to_jsonable_python(value, fallback=str))


def _finding_digest(finding: Finding) -> str:
    evidence = [(e.source, e.text, e.line) for e in finding.evidence]
    raw = json.dumps([finding.reason, evidence], ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def _incident_row(finding: Finding, incident_id: str, now: datetime) -> IncidentRow:
    return IncidentRow(
        id=incident_id,
        fingerprint=finding.fingerprint,
        category=finding.category.value,
        subject_kind=finding.subject.kind.value,
        subject_id=finding.subject.id[:SUBJECT_ID_MAX],
        subject=_jsonable(finding.subject.model_dump(mode="json")),
        state=IncidentState.OPEN.value,
        severity=finding.severity.value,
        summary=finding.summary,
        reason=finding.reason,
        first_seen=finding.first_seen,
        last_seen=max(finding.first_seen, finding.detected_at),
        detected_at=now,
        resolved_at=None,
        occurrences=1,
        recommended_action=finding.recommended_action,
        attrs=_jsonable(finding.attrs),
    )


def _finding_row(finding: Finding, incident_id: str, digest: str) -> FindingRow:
    return FindingRow(
        incident_id=incident_id,
        digest=digest,
        category=finding.category.value,
        reason=finding.reason,
        subject=_jsonable(finding.subject.model_dump(mode="json")),
        summary=finding.summary,
        severity=finding.severity.value,
        confidence=finding.confidence,
        evidence=_jsonable([e.model_dump(mode="json") for e in finding.evidence]),
        first_seen=finding.first_seen,
        detected_at=finding.detected_at,
        recommended_action=finding.recommended_action,
        fingerprint=finding.fingerprint,
        attrs=_jsonable(finding.attrs),
    )


def _action_row(action: Action, action_id: str) -> ActionRow:
    return ActionRow(
        id=action_id,
        incident_id=action.incident_id,
        kind=action.kind,
        target=_jsonable(action.target.model_dump(mode="json")),
        state=action.state.value,
        idempotency_key=action.idempotency_key,
        requested_by=action.requested_by,
        reason=action.reason,
        dry_run=action.dry_run,
        result=_jsonable(action.result),
        created_at=action.created_at,
        updated_at=action.updated_at,
    )


def _incident(row: IncidentRow) -> Incident:
    return Incident(
        id=row.id,
        fingerprint=row.fingerprint,
        category=Category(row.category),
        subject=Subject.model_validate(row.subject),
        state=IncidentState(row.state),
        severity=Severity(row.severity),
        summary=row.summary,
        reason=row.reason,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        detected_at=row.detected_at,
        occurrences=row.occurrences,
        recommended_action=row.recommended_action,
        attrs=row.attrs,
        resolved_at=row.resolved_at,
    )


def _finding(row: FindingRow) -> Finding:
    return Finding(
        category=Category(row.category),
        reason=row.reason,
        subject=Subject.model_validate(row.subject),
        summary=row.summary,
        severity=Severity(row.severity),
        confidence=row.confidence,
        evidence=tuple(Evidence.model_validate(e) for e in row.evidence),
        first_seen=row.first_seen,
        detected_at=row.detected_at,
        recommended_action=row.recommended_action,
        fingerprint=row.fingerprint,
        attrs=row.attrs,
    )


def _action(row: ActionRow) -> Action:
    return Action(
        id=row.id,
        incident_id=row.incident_id,
        kind=row.kind,
        target=Subject.model_validate(row.target),
        state=ActionState(row.state),
        idempotency_key=row.idempotency_key,
        requested_by=row.requested_by,
        reason=row.reason,
        dry_run=row.dry_run,
        result=row.result,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _report(row: ReportRow) -> Report:
    return Report(
        id=row.id,
        incident_id=row.incident_id,
        category=Category(row.category),
        confidence=row.confidence,
        summary=row.summary,
        markdown=row.markdown,
        generator=row.generator,
        created_at=row.created_at,
        data=row.data,
    )


def _name_taken(name: str) -> InputError:
    return InputError(
        f"an API token named {name!r} exists already",
        hint="choose another name; revoked tokens keep theirs so the audit log names one token each",
    )


def _token(row: ApiTokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id, name=row.name, role=Role(row.role), prefix=row.prefix, created_at=row.created_at,
        created_by=row.created_by, expires_at=row.expires_at, revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )


def _audit(row: AuditRow) -> AuditRecord:
    return AuditRecord(
        id=row.id, at=row.at, actor=row.actor, role=row.role, method=row.method, path=row.path,
        target=row.target, status=row.status, outcome=row.outcome, detail=row.detail,
    )


@dataclass(frozen=True)
class DeliveryRecord:
    """One notification delivery attempt as stored."""

    id: int
    key: str
    incident_id: str | None
    event: str
    channel: str
    ok: bool
    attempts: int
    status: int | None
    error: str | None
    at: datetime
    detail: dict[str, Any]


def _delivery(row: DeliveryRow) -> DeliveryRecord:
    return DeliveryRecord(
        id=row.id, key=row.key, incident_id=row.incident_id, event=row.event, channel=row.channel, ok=row.ok,
        attempts=row.attempts, status=row.status, error=row.error, at=row.at, detail=row.detail,
    )
