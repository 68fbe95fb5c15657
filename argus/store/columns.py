"""Column types that decide what text, JSON and time look like on disk, so SQLite and PostgreSQL return the
same values:

- every datetime is stored in UTC and read back timezone-aware, also on SQLite (which has no time
  zones: it gets naive UTC text, which also keeps its string comparisons in time order);
- text never reaches the database with a NUL or an unpaired surrogate: PostgreSQL rejects NUL in text
  and JSON, and no UTF-8 driver can encode a lone surrogate. Both become U+FFFD, on every backend,
  so a hostile log line is stored (changed by one visible character) instead of failing the pipeline;
- JSON never holds NaN or infinity (not JSON; PostgreSQL rejects them): they become null.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from pydantic_core import to_jsonable_python
from sqlalchemy import JSON, DateTime, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

REPLACEMENT = "\ufffd"


def clean_text(value: str) -> str:
    """`value` with NUL and unpaired surrogates replaced by U+FFFD; unchanged (same object) when clean."""
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Round-trip through UTF-16 so valid surrogate pairs join into one character and only
        # unpaired halves are replaced.
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def clean_json(value: Any) -> Any:
    """A JSON-ready value with every string (keys too) cleaned and non-finite floats turned into None."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    raise TypeError(f"cannot store {type(value).__name__} as JSON; convert it to str, number, list or dict")


def jsonable(value: Any) -> Any:
    """Plain JSON values; datetimes become ISO strings, anything unknown its str()."""
    return clean_json(to_jsonable_python(value, fallback=str))


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a naive datetime is taken to be UTC already."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class CleanText(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else clean_text(value)


class CleanString(TypeDecorator[str]):
    """A bounded VARCHAR with the same cleaning as CleanText (ids, fingerprints, enum values)."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else clean_text(value)


class CleanJSON(TypeDecorator[Any]):
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return clean_json(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out. A naive datetime is taken to be UTC already."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = as_utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)
