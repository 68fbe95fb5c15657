"""Actions (remediation steps): stored once per idempotency key, moved between states by compare-and-set
under a row lock, so of two runners claiming one action exactly one wins.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, or_, select
from sqlalchemy.orm import Session

from argus.store.columns import jsonable
from argus.store.incidents import require_incident
from argus.store.models import ActionRow
from argus.store.repository import new_id, parse_enum, retry_lost_races, saved, transaction
from core.errors import Conflict, InputError, NotFound
from core.types import Action, ActionState, utcnow

IDS_PER_QUERY = 500  # incident ids in one IN (...): under every database's parameter limit


class ActionRepository:
    """Actions, with or without an incident. Thread-safe; the Store holds one as `store.actions`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def add(self, action: Action) -> Action:
        """Store `action`; if its idempotency key is already stored, return that action instead.

        An empty `action.id` gets a new "act-" id.
        """
        # Another process may store the same key between our check and insert: the retry returns it.
        return retry_lost_races(lambda: self._add_once(action))

    def _add_once(self, action: Action) -> Action:
        with transaction(self._engine, "adding an action") as s:
            existing = s.scalars(select(ActionRow).where(ActionRow.idempotency_key == action.idempotency_key)).first()
            if existing is not None:
                return existing.to_domain()
            if action.incident_id is not None:
                require_incident(s, action.incident_id)
            if action.id and s.get(ActionRow, action.id) is not None:
                raise InputError(
                    f"action {action.id!r} already exists with another idempotency key",
                    hint="leave Action.id empty to get a new id, or reuse the first action's key",
                )
            row = ActionRow.from_domain(action, id=action.id or new_id("act"))
            s.add(row)
            return saved(s, row).to_domain()

    def get(self, action_id: str) -> Action:
        with transaction(self._engine, "reading an action", read_only=True) as s:
            return _action_row(s, action_id).to_domain()

    def update(self, action_id: str, state: ActionState | str, result: dict[str, Any] | None = None) -> Action:
        """Set an action's state (and its result, replacing the old one, when given)."""
        new = parse_enum(ActionState, state, "state")
        with transaction(self._engine, "updating an action") as s:
            row = _action_row(s, action_id, for_update=True)
            row.state = new.value
            if result is not None:
                row.result = jsonable(result)
            row.updated_at = self._clock()
            return saved(s, row).to_domain()

    def transition(
        self, action_id: str, from_states: tuple[ActionState, ...], to_state: ActionState,
        result: dict[str, Any] | None = None,
    ) -> Action:
        """Move an action only if it is still in one of `from_states` (a compare-and-set under a row lock), so of
        two runners claiming one action exactly one wins; Conflict for the other."""
        with transaction(self._engine, "moving an action") as s:
            row = _action_row(s, action_id, for_update=True)
            if row.state not in {state.value for state in from_states}:
                raise Conflict(
                    f"action {action_id} is {row.state}, not {' or '.join(x.value for x in from_states)}",
                    hint="another runner or person changed it first; read it again",
                )
            row.state = to_state.value
            if result is not None:
                row.result = jsonable(result)
            row.updated_at = self._clock()
            return saved(s, row).to_domain()

    def list(self, incident_id: str | None = None, *, updated_since: datetime | None = None,
             or_states: Collection[ActionState] = ()) -> list[Action]:
        """Actions, oldest first; only those of `incident_id` when given; with `updated_since`, only those changed
        since then or in one of `or_states` (the runner's view: open steps and the guards' recent history)."""
        query = select(ActionRow).order_by(ActionRow.created_at, ActionRow.id)
        if updated_since is not None:
            recent = ActionRow.updated_at >= updated_since
            query = query.where(or_(recent, ActionRow.state.in_([s.value for s in or_states])) if or_states
                                else recent)
        with transaction(self._engine, "listing actions", read_only=True) as s:
            if incident_id is not None:
                require_incident(s, incident_id)
                query = query.where(ActionRow.incident_id == incident_id)
            return [row.to_domain() for row in s.scalars(query)]

    def runnable(self) -> builtins.list[Action]:
        """The steps that are approved or planned as dry runs, oldest first: what the runner runs. One query on the
        state index, so the runner's pass reads only these (an alert storm plans thousands of steps; most have run or
        wait for people), not every step of the day."""
        runnable = or_(ActionRow.state == ActionState.APPROVED.value,
                       (ActionRow.state == ActionState.PLANNED.value) & ActionRow.dry_run.is_(True))
        with transaction(self._engine, "looking for runnable actions", read_only=True) as s:
            return [row.to_domain() for row in
                    s.scalars(select(ActionRow).where(runnable).order_by(ActionRow.created_at, ActionRow.id))]

    def of_incidents(self, incident_ids: Collection[str], states: Collection[ActionState]) -> builtins.list[Action]:
        """The steps of these incidents in one of `states`, oldest first (by the incident index, in chunks: a
        database takes only so many parameters in one statement)."""
        wanted, found = sorted(set(incident_ids)), builtins.list[Action]()
        with transaction(self._engine, "listing the actions of incidents", read_only=True) as s:
            for start in range(0, len(wanted), IDS_PER_QUERY):
                query = select(ActionRow).where(ActionRow.incident_id.in_(wanted[start:start + IDS_PER_QUERY]),
                                                ActionRow.state.in_([state.value for state in states]))
                found.extend(row.to_domain() for row in s.scalars(query))
        return sorted(found, key=lambda a: (a.created_at, a.id))


def _action_row(s: Session, action_id: str, *, for_update: bool = False) -> ActionRow:
    query = select(ActionRow).where(ActionRow.id == action_id)
    row = s.scalars(query.with_for_update() if for_update else query).first()
    if row is None:
        raise NotFound(f"action {action_id!r} does not exist", hint="list actions with GET /api/actions")
    return row
