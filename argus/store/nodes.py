"""control.nodes.NodeRegistry kept in the store's database, so nodes and their history survive restarts.

Behaves exactly like control.nodes.MemoryNodeRegistry, with one difference the database imposes: text
is cleaned on the way in (NUL and unpaired surrogates become U+FFFD, see models.py), so a hostile reason
is stored changed by one visible character instead of failing the move.

A move is a compare-and-set in one transaction: the node's row is locked (SELECT ... FOR UPDATE on
PostgreSQL; SQLite's BEGIN IMMEDIATE, see migrate.py, locks the whole file) before its state is compared,
so of two callers moving a node from the same state exactly one wins and the other gets InputError.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import datetime

from loguru import logger
from pydantic import ValidationError
from sqlalchemy import Engine, exc, select

from argus.store.models import RAY_NODE_ID_MAX, NodeRow, NodeTransitionRow
from argus.store.repository import saved, transaction
from control.nodes import NodeRecord, NodeSpec, NodeState, Transition, check_move, name_taken, transition
from core.errors import InputError, NotFound, StoreError
from core.types import utcnow


class SqlNodeRegistry:
    """A NodeRegistry over the store's engine. Thread-safe; get one from `Store.nodes()`.

    The engine's database must be at the schema head (Store migrates it on start).
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def get(self, name: str) -> NodeRecord:
        with transaction(self._engine, "reading a node", read_only=True) as s:
            row = s.get(NodeRow, name)
            if row is None:
                raise NotFound(f"no node named {name!r} is registered", hint="register it first, or list nodes")
            return _record(row)

    def list(self) -> list[NodeRecord]:
        with transaction(self._engine, "listing nodes", read_only=True) as s:
            records = [_record(row) for row in s.scalars(select(NodeRow))]
        # Sorted here, not by ORDER BY: PostgreSQL's collation may order '-' and '.' unlike Python.
        return sorted(records, key=lambda r: r.name)

    def add(self, spec: NodeSpec, *, actor: str, reason: str) -> NodeRecord:
        try:
            with transaction(self._engine, "registering a node") as s:
                existing = s.get(NodeRow, spec.name)
                if existing is not None:
                    raise name_taken(spec.name, existing.state)
                now = self._clock()
                row = NodeRow(name=spec.name, spec=spec.model_dump(mode="json"), state=NodeState.PENDING.value,
                              ray_node_id=None, created_at=now, updated_at=now)
                s.add(row)
                s.flush()  # the node's row first: the transition's foreign key points at it
                s.add(NodeTransitionRow(node=spec.name, from_state=None, to_state=NodeState.PENDING.value,
                                        actor=actor, reason=reason, at=now, ray_node_id=None))
                record = _record(saved(s, row))
        except StoreError as err:
            if isinstance(err.__cause__, exc.IntegrityError):  # another caller registered the name meanwhile
                raise name_taken(spec.name, None) from None
            raise
        logger.info("node {} registered by {}", spec.name, actor)
        return record

    def record_transition(
        self,
        name: str,
        from_state: NodeState,
        to_state: NodeState,
        *,
        actor: str,
        reason: str,
        ray_node_id: str | None = None,
        spec: NodeSpec | None = None,
    ) -> NodeRecord:
        transition(from_state, to_state)
        if ray_node_id is not None and len(ray_node_id) > RAY_NODE_ID_MAX:
            raise InputError(
                f"node {name}: Ray node id of {len(ray_node_id)} characters is too long",
                hint=f"Ray node ids are 56 hex characters; at most {RAY_NODE_ID_MAX} are stored",
            )
        with transaction(self._engine, "moving a node") as s:
            row = s.scalars(select(NodeRow).where(NodeRow.name == name).with_for_update()).first()
            check_move(name, None if row is None else row.state, from_state, spec)
            assert row is not None
            now = self._clock()
            row.state = to_state.value
            row.updated_at = now
            if ray_node_id is not None:
                row.ray_node_id = ray_node_id
            if spec is not None:
                row.spec = spec.model_dump(mode="json")
            s.add(NodeTransitionRow(node=name, from_state=from_state.value, to_state=to_state.value,
                                    actor=actor, reason=reason, at=now, ray_node_id=row.ray_node_id))
            record = _record(saved(s, row))
        logger.info("node {} {} -> {} by {}", name, from_state.value, to_state.value, actor)
        return record

    def transitions(self, name: str) -> builtins.list[Transition]:
        with transaction(self._engine, "reading a node's transitions", read_only=True) as s:
            rows = s.scalars(
                select(NodeTransitionRow).where(NodeTransitionRow.node == name).order_by(NodeTransitionRow.id)
            )
            return [
                Transition(
                    node=row.node,
                    from_state=None if row.from_state is None else NodeState(row.from_state),
                    to_state=NodeState(row.to_state),
                    actor=row.actor,
                    reason=row.reason,
                    at=row.at,
                )
                for row in rows
            ]


def _record(row: NodeRow) -> NodeRecord:
    try:
        spec = NodeSpec.model_validate(row.spec)
    except ValidationError as err:
        # Only a hand-edited row or a spec rule tightened since it was stored gets here.
        raise StoreError(
            f"node {row.name!r} has a stored spec this Argus refuses: {err.errors()[0]['msg']}",
            hint="fix the row in the nodes table, or remove the node and register it again",
        ) from None
    return NodeRecord(spec=spec, state=NodeState(row.state), ray_node_id=row.ray_node_id, updated_at=row.updated_at)
