"""When a log line was written, read from the line itself: to put lines of several logs (ranks, nodes) in one
time order (rca.evidence), and to tell history from news when a log is read for the first time (collectors).

Formats seen in training logs: ISO-like dates (Python logging, loguru, Ray, vLLM: "2024-05-01 12:34:56,789",
"[2024-05-01T12:34:56.789Z]"), glog (Ray's C++ and PyTorch's c10: "[2024-05-01 12:34:56,789 I 123 456]",
"I0501 12:34:56.789012"), and syslog/dmesg ("May  1 12:34:56"). A line without a date, or with only a
time of day, gets the date of the nearest dated line before it in the same log when there is one.

A stamp that names no zone is read in `tz` (UTC unless the caller knows better: a collector passes the zone its
cluster's logs are written in). Only the first 120 characters are searched, so a 100 MB line costs no more
than a short one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone, tzinfo

_SEARCH_CHARS = 120  # timestamps sit at the start of a line, after a prefix like "(pid=123) " at most
_ISO = re.compile(
    r"(?P<y>20\d\d)[-/](?P<mo>\d\d)[-/](?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?(?!\d)"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
_GLOG = re.compile(
    r"(?:^|[\s\[(])[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,9}))?(?!\d)"
)
_SYSLOG = re.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
# Every format above has a time of day, so ":MM:" in the head: a line without one is dismissed by this one cheap
# search (a literal prefix `re` scans for fast), and the glog search starts just before it.
_CLOCK = re.compile(r":[0-9][0-9]:")
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}
# A year-less stamp this far after the file's last write belongs to the year before (a December line read
# in January); less than this is clock skew between the writer and the file server.
_YEAR_WRAP = timedelta(days=1)


def _micro(fraction: str | None) -> int:
    return int((fraction or "0")[:6].ljust(6, "0"))


def _tz(value: str | None, default: tzinfo) -> tzinfo:
    if not value:
        return default
    if value == "Z":
        return timezone.utc
    sign = 1 if value[0] == "+" else -1
    digits = value[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def line_time(text: str, *, year: int | None = None, tz: tzinfo = timezone.utc) -> datetime | None:
    """The time a line carries, timezone-aware (in `tz` when the line names no zone); None when it has none.
    `year` completes formats without one (glog, syslog); without it they give None."""
    head = text[:_SEARCH_CHARS]
    clock = _CLOCK.search(head)
    if clock is None:
        return None
    try:
        if m := _ISO.search(head):
            return datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                            _micro(m["f"]), tzinfo=_tz(m["tz"], tz))
        if year is None:
            return None
        if m := _GLOG.search(head, max(0, clock.start() - 9)):  # "[I1123 10:00:01": 9 characters before ":00:"
            return datetime(year, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), _micro(m["f"]),
                            tzinfo=tz)
        if m := _SYSLOG.match(head):
            return datetime(year, _MONTHS[m["mon"]], int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), tzinfo=tz)
    except ValueError:  # 2024-13-45: looks like a date, is not one
        return None
    return None


def times_of(lines: Sequence[str], *, year: int | None = None, tz: tzinfo = timezone.utc) -> list[datetime | None]:
    """The time of every line: its own, else that of the last dated line before it (a traceback's lines
    belong to the moment its header was logged)."""
    out: list[datetime | None] = []
    last: datetime | None = None
    for text in lines:
        when = line_time(text, year=year, tz=tz)
        if when is not None:
            last = when
        out.append(when or last)
    return out


def written_times(
    lines: Sequence[str], *, modified_at: datetime, tz: tzinfo = timezone.utc, carried: datetime | None = None
) -> tuple[list[datetime], datetime | None]:
    """When each line of one log was written, as well as the log tells: its own time, else that of the last
    dated line above it (`carried`: the last dated line of the part of the file read before these), else the
    file's last modification `modified_at`. Never later than `modified_at`: a file holds no line newer than its
    last write, so a later stamp has its clock or zone wrong and the file's time is the better bound. Year-less
    stamps take `modified_at`'s year, or the year before when that would put them after it.

    Returns the times and the time of the last dated line, to carry into the next part of the same file.
    """
    year = modified_at.astimezone(tz).year
    out: list[datetime] = []
    last = carried
    for text in lines:
        when = line_time(text, year=year, tz=tz)
        if when is not None and when > modified_at + _YEAR_WRAP:
            when = line_time(text, year=year - 1, tz=tz) or when  # a stamp with its own year stays as it is
        if when is not None:
            when = min(when, modified_at)
            last = when
        out.append(when or last or modified_at)
    return out, last
