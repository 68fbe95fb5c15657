"""Times that collectors put into signal attributes as ISO 8601 text (`datetime.isoformat()`)."""

from __future__ import annotations

from datetime import datetime


def parse_iso(value: object) -> datetime | None:
    """The datetime in an ISO 8601 string; None when the attribute is missing, not text, or not a time."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
