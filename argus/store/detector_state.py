"""What stateful detectors remember across restarts (core.ports.DetectorMemory): per detector, one JSON object
per key (a job's submission id), replaced as a whole on each save.

Bounded: a value is at most MAX_VALUE_CHARS of JSON, and a detector keeps at most `max_keys` keys. Detectors
forget finished jobs themselves (they save None for them); the cap is the backstop for a cluster with more jobs
than a detector should remember: a save that goes past it drops that detector's least recently saved keys.

Values are read row by row: a row that is not a JSON object (written by hand, or cut short) is left out of
`load_all` with a warning naming it, so one bad row never costs a detector the rest of its memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from loguru import logger
from sqlalchemy import Engine, delete, func, select

from argus.store.columns import clean_json
from argus.store.models import DETECTOR_NAME_MAX, SUBJECT_ID_MAX, DetectorStateRow
from argus.store.repository import retry_lost_races, transaction
from core.errors import InputError
from core.types import utcnow

MAX_VALUE_CHARS = 64 * 1024
MAX_KEYS_PER_DETECTOR = 5000
_IN_CHUNK = 500  # keys per IN (...) list: well under SQLite's bound-parameter limit


class DetectorStateRepository:
    """Detector state. Thread-safe; the Store holds one as `store.detector_state` (a core.ports.DetectorMemory)."""

    def __init__(
        self, engine: Engine, *, clock: Callable[[], datetime] = utcnow, max_keys: int = MAX_KEYS_PER_DETECTOR
    ) -> None:
        if max_keys < 1:
            raise InputError(f"detector state cap max_keys={max_keys} must be at least 1", hint="e.g. 5000")
        self._engine = engine
        self._clock = clock
        self._max_keys = max_keys

    def load_all(self, detector: str) -> dict[str, dict[str, Any]]:
        """Every object saved for `detector`, by key; rows that are not a JSON object are left out (logged)."""
        _check_detector(detector)
        with transaction(self._engine, f"reading the state of detector {detector}", read_only=True) as s:
            rows = s.execute(
                select(DetectorStateRow.key, DetectorStateRow.value).where(DetectorStateRow.detector == detector)
            ).all()
        out: dict[str, dict[str, Any]] = {}
        for key, text in rows:
            try:
                value = json.loads(text)
            except ValueError as err:
                logger.warning("detector {} state of {!r} is not JSON ({}): that key starts fresh", detector, key, err)
                continue
            if not isinstance(value, dict):
                logger.warning("detector {} state of {!r} is a JSON {}, not an object: that key starts fresh",
                               detector, key, type(value).__name__)
                continue
            out[key] = value
        return out

    def save(self, detector: str, changed: Mapping[str, dict[str, Any] | None]) -> None:
        """Replace the objects of `changed`'s keys in one transaction; None forgets a key. InputError (and nothing
        saved) for a key or object that cannot be stored."""
        _check_detector(detector)
        encoded = {_check_key(detector, key): None if value is None else _encode(detector, key, value)
                   for key, value in changed.items()}
        if encoded:
            retry_lost_races(lambda: self._write(detector, encoded),
                             retrying=f"detector {detector} state: another writer saved a key first, retrying")

    def _write(self, detector: str, encoded: dict[str, str | None]) -> None:
        now = self._clock()
        with transaction(self._engine, f"saving the state of detector {detector}") as s:
            keys = list(encoded)
            existing: dict[str, DetectorStateRow] = {}
            for i in range(0, len(keys), _IN_CHUNK):
                chunk = keys[i:i + _IN_CHUNK]
                query = select(DetectorStateRow).where(DetectorStateRow.detector == detector,
                                                       DetectorStateRow.key.in_(chunk))
                existing.update((row.key, row) for row in s.scalars(query))
            for key, text in encoded.items():
                row = existing.get(key)
                if text is None:
                    if row is not None:
                        s.delete(row)
                elif row is None:
                    s.add(DetectorStateRow(detector=detector, key=key, value=text, updated_at=now))
                else:
                    row.value, row.updated_at = text, now
            s.flush()
            self._cap(s, detector)

    def _cap(self, s: Any, detector: str) -> None:
        count = s.scalar(select(func.count()).select_from(DetectorStateRow)
                         .where(DetectorStateRow.detector == detector))
        over = int(count or 0) - self._max_keys
        if over <= 0:
            return
        oldest = list(s.scalars(
            select(DetectorStateRow.key).where(DetectorStateRow.detector == detector)
            .order_by(DetectorStateRow.updated_at, DetectorStateRow.key).limit(over)
        ))
        for i in range(0, len(oldest), _IN_CHUNK):
            s.execute(delete(DetectorStateRow).where(DetectorStateRow.detector == detector,
                                                     DetectorStateRow.key.in_(oldest[i:i + _IN_CHUNK])))
        logger.warning("detector {} remembers more than {} keys: forgot the {} saved longest ago",
                       detector, self._max_keys, over)


def _check_detector(detector: str) -> None:
    if not isinstance(detector, str) or not 1 <= len(detector) <= DETECTOR_NAME_MAX:
        raise InputError(f"detector name {detector!r} cannot key detector state",
                         hint=f"use the detector's name, 1 to {DETECTOR_NAME_MAX} characters")


def _check_key(detector: str, key: str) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= SUBJECT_ID_MAX:
        shown = key if not isinstance(key, str) else key[:80]
        raise InputError(f"detector {detector}: state key {shown!r} is not a string of 1 to {SUBJECT_ID_MAX} "
                         "characters", hint="key detector state by a job's submission id")
    return key


def _encode(detector: str, key: str, value: Any) -> str:
    if not isinstance(value, dict):
        raise InputError(f"detector {detector}: state of {key!r} is a {type(value).__name__}, not a dict",
                         hint="save one JSON object per key, or None to forget the key")
    try:
        text = json.dumps(clean_json(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise InputError(f"detector {detector}: state of {key!r} is not JSON: {err}",
                         hint="keep only str, numbers, bools, None, lists and dicts (times as ISO strings)") from None
    if len(text) > MAX_VALUE_CHARS:
        raise InputError(f"detector {detector}: state of {key!r} is {len(text)} characters of JSON, over the "
                         f"{MAX_VALUE_CHARS} a key may hold", hint="keep less per key (bounded histories, cut text)")
    return text
