"""When a log line was written, read from the line itself, so lines of several logs (ranks, nodes) can be
put in one time order.

Formats seen in training logs: ISO-like dates (Python logging, loguru, Ray, vLLM: "2024-05-01 12:34:56,789",
"[2024-05-01T12:34:56.789Z]"), glog (Ray's C++ and PyTorch's c10: "[2024-05-01 12:34:56,789 I 123 456]",
"I0501 12:34:56.789012"), and syslog/dmesg ("May  1 12:34:56"). A line without a date, or with only a
time of day, gets the date of the nearest dated line before it in the same log when there is one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

_SEARCH_CHARS = 120  # timestamps sit at the start of a line, after a prefix like "(pid=123) " at most
_ISO = re.compile(
    r"(?P<y>20\d\d)[-/](?P<mo>\d\d)[-/](?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
_GLOG = re.compile(
    r"(?:^|[\s\[(])[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,9}))?"
)
_SYSLOG = re.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}


def _micro(fraction: str | None) -> int:
    return int((fraction or "0")[:6].ljust(6, "0"))


def _tz(value: str | None) -> timezone:
    if not value or value == "Z":
        return timezone.utc
    sign = 1 if value[0] == "+" else -1
    digits = value[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def line_time(text: str, *, year: int | None = None) -> datetime | None:
    """The time a line carries, timezone-aware (UTC when the line names none); None when it has none.
    `year` completes formats without one (glog, syslog); without it they give None."""
    head = text[:_SEARCH_CHARS]
    try:
        if m := _ISO.search(head):
            return datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                            _micro(m["f"]), tzinfo=_tz(m["tz"]))
        if year is None:
            return None
        if m := _GLOG.search(head):
            return datetime(year, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), _micro(m["f"]),
                            tzinfo=timezone.utc)
        if m := _SYSLOG.match(head):
            return datetime(year, _MONTHS[m["mon"]], int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                            tzinfo=timezone.utc)
    except ValueError:  # 2024-13-45: looks like a date, is not one
        return None
    return None


def times_of(lines: Sequence[str], *, year: int | None = None) -> list[datetime | None]:
    """The time of every line: its own, else that of the last dated line before it (a traceback's lines
    belong to the moment its header was logged)."""
    out: list[datetime | None] = []
    last: datetime | None = None
    for text in lines:
        when = line_time(text, year=year)
        if when is not None:
            last = when
        out.append(when or last)
    return out
