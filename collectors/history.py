"""History is not news: the lines a log reader finds in a file it sees for the first time are dated, and the
ones written longer than a window ago are marked as history, so detectors open no incident for a fault that
ended days before Argus started.

Only a file's backlog is dated (what it held when first seen, however many polls reading it takes); lines
written while Argus watches are news by definition and cost nothing here. A line's time is its own stamp
(core.line_time), else that of the last dated line above it, else the file's last modification. Stamps that
name no zone are read in the zone the cluster's logs are written in: by default this host's, since Ray nodes
and the head normally share one; a stamp that still lands after the file's mtime is capped at the mtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from core import signal_keys as keys
from core.errors import ConfigError
from core.line_time import written_times
from core.types import utcnow


def local_zone() -> tzinfo:
    """This host's time zone as it is now (the zone naive log stamps are most likely written in)."""
    zone = datetime.now().astimezone().tzinfo
    assert zone is not None  # astimezone() on a naive datetime always sets one
    return zone


def saved_time(value: object) -> datetime | None:
    """A time saved in an offsets file as ISO text; None when absent or not a time (a file edited by hand)."""
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


class HistoryMarker:
    """Dates a file's backlog lines and marks those older than `window_s` as history (see the module doc)."""

    def __init__(
        self, window_s: float, *, clock: Callable[[], datetime] = utcnow, tz: tzinfo | None = None
    ) -> None:
        if not window_s > 0:
            raise ConfigError(
                f"history window must be more than 0 seconds, got {window_s}",
                hint="set history_window_s to how old a line read at first start may be and still be news "
                "(default 900)",
            )
        self.window = timedelta(seconds=window_s)
        self._clock = clock
        self.tz = tz or local_zone()

    def mark(
        self, texts: Sequence[str], *, modified_at: datetime | None, carried: datetime | None = None
    ) -> tuple[list[dict[str, Any]], datetime | None]:
        """Per line, the attrs to add to its signal (LINE_TIME, HISTORY; lines of one time share one dict: copy
        it, do not change it); and the time of the last dated line, to pass as `carried` with the next part of
        the same file's backlog. `modified_at` None: unknown, lines without a stamp of their own count as now."""
        now = self._clock()
        times, last = written_times(texts, modified_at=modified_at or now, tz=self.tz, carried=carried)
        cutoff = now - self.window
        by_time: dict[datetime, dict[str, Any]] = {}  # a traceback, or a file of unstamped lines: one time
        out = []
        for t in times:
            attrs = by_time.get(t)
            if attrs is None:
                attrs = by_time[t] = {keys.LINE_TIME: t.isoformat(), keys.HISTORY: t < cutoff}
            out.append(attrs)
        return out, last
