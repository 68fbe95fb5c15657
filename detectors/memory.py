"""A stateful detector's link to its core.ports.DetectorMemory: what it loads at start, what it saves after a
tick, and the strict readers of what it loads back.

Saving writes only keys whose value differs from what was last saved, so a detector may offer every key it
touched in a tick: a job whose state did not change costs no write. The store being down costs nothing but the
memory: detection goes on, and the unsaved keys are tried again with the next save. A value that cannot be read
back (another version wrote it, or a person) is the detector's to refuse: its reader raises StateUnreadable and
the detector starts that key fresh.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from loguru import logger

from core.errors import ArgusError, InputError
from core.ports import DetectorMemory

# Well under the store's key column (SUBJECT_ID_MAX, 512): a key it refused would fail the whole tick's save.
_MAX_KEY_CHARS = 200


class StateUnreadable(ValueError):
    """A remembered value this detector version cannot use; the message says which part."""


class SavedState:
    """Loads a detector's state once and saves what changed since (nothing at all without a memory)."""

    def __init__(self, memory: DetectorMemory | None, detector: str) -> None:
        self.memory = memory
        self.detector = detector
        self._saved: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, dict[str, Any] | None] = {}

    def load(self) -> dict[str, dict[str, Any]]:
        """Everything saved for this detector; nothing (logged) when the memory cannot be read."""
        if self.memory is None:
            return {}
        try:
            loaded = self.memory.load_all(self.detector)
        except ArgusError as err:
            logger.warning("detector {} starts without its saved state: {}", self.detector, err)
            return {}
        self._saved = dict(loaded)
        return loaded

    def keys(self) -> set[str]:
        """The keys saved, or waiting to be saved, with a value (not those waiting to be forgotten)."""
        pending = {key for key, value in self._pending.items() if value is not None}
        gone = {key for key, value in self._pending.items() if value is None}
        return (set(self._saved) - gone) | pending

    def forget_loaded(self, key: str) -> None:
        """A loaded key the detector refused: forget it in the memory with the next save."""
        if key in self._saved:
            self._pending[key] = None

    def save(self, values: Mapping[str, dict[str, Any] | None]) -> None:
        """Save those of `values` that differ from what was last saved (None: forget the key), in one call."""
        if self.memory is None:
            return
        for key, value in values.items():
            if value is None:
                if key in self._saved or key in self._pending:
                    self._pending[key] = None
            elif self._saved.get(key) != value:
                self._pending[key] = value
            else:
                self._pending.pop(key, None)
        if not self._pending:
            return
        changed, self._pending = self._pending, {}
        try:
            self.memory.save(self.detector, changed)
        except InputError as err:  # a value this detector built that the memory refuses: a bug, not worth retrying
            logger.error("detector {} could not save its state of {} key(s): {}", self.detector, len(changed), err)
            return
        except ArgusError as err:
            logger.warning("detector {} could not save its state (tried again next tick): {}", self.detector, err)
            self._pending = {**changed, **self._pending}
            return
        for key, value in changed.items():
            if value is None:
                self._saved.pop(key, None)
            else:
                self._saved[key] = value


def job_key(job_id: str) -> str:
    """The memory key of a job's state: its id, or a digest of an id too long to key it (a submission id is the
    user's to choose). The value should hold the id in full, so a reader can check the key is the one it makes."""
    if len(job_id) <= _MAX_KEY_CHARS:
        return job_id
    return f"sha256:{hashlib.sha256(job_id.encode('utf-8')).hexdigest()}"


# -- strict readers of remembered values: StateUnreadable for anything unexpected ---------------------------


def read_time(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise StateUnreadable(f"{what} is {value!r}, not an ISO time")
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise StateUnreadable(f"{what} {value!r} is not an ISO time") from None
    if at.tzinfo is None:
        raise StateUnreadable(f"{what} {value!r} has no time zone")
    return at.astimezone(timezone.utc)


def read_optional_time(value: Any, what: str) -> datetime | None:
    return None if value is None else read_time(value, what)


def read_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StateUnreadable(f"{what} is {value!r}, not a number")
    return float(value)


def read_optional_number(value: Any, what: str) -> float | None:
    return None if value is None else read_number(value, what)


def read_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateUnreadable(f"{what} is {value!r}, not a whole number")
    return value


def read_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise StateUnreadable(f"{what} is {value!r}, not text")
    return value


def read_optional_str(value: Any, what: str) -> str | None:
    return None if value is None else read_str(value, what)


def read_version(value: Mapping[str, Any], version: int) -> None:
    """The value's format version must be `version` (an older or newer Argus wrote it otherwise)."""
    if value.get("v") != version:
        raise StateUnreadable(f"it is format version {value.get('v')!r}, this Argus reads version {version}")


def keep_newest(saved: SavedState, readable: list[tuple[str, str, Any]], cap: int,
                newest: Callable[[Any], Any]) -> list[tuple[str, Any]]:
    """Of the (memory key, id, value) loaded back, the `cap` whose `newest(value)` is latest, as (id, value), oldest
    first; the keys of the others are forgotten with the next save (the bound the detector keeps in memory)."""
    readable = sorted(readable, key=lambda item: newest(item[2]))
    over = max(0, len(readable) - cap)
    for key, _, _ in readable[:over]:
        saved.forget_loaded(key)
    return [(ident, value) for _, ident, value in readable[over:]]
