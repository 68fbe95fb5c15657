"""People waiting on the API now, and background work giving way to them.

Argus answers its API and does its background work (filing alerts, writing reports, notifying, running remediation
steps) in one process, and Python runs one thread at a time. In an alert storm the background threads held the
interpreter three quarters of the time, so a person's `GET /v1/incidents` waited for its turn again and again and
took 20 times longer at the tail. Each background worker therefore calls `give_way()` between two items: while a
request is being answered it pauses (a few milliseconds at a time, at most `max_s`), then goes on, so readers get
the interpreter nearly to themselves and background work is delayed, never starved.

The API's middleware (argus/api/limits.py InFlight) counts requests in `now`, on the event loop only; the workers
only read it.
"""

from __future__ import annotations

import time

GIVE_WAY_MAX_S = 0.05  # the longest one item waits for readers: background work slows, it does not stop
GIVE_WAY_STEP_S = 0.002


class Readers:
    """How many API requests are being answered now; `give_way()` for the workers that should not slow them."""

    def __init__(self) -> None:
        self.now = 0

    def busy(self) -> bool:
        return self.now > 0

    def give_way(self, max_s: float = GIVE_WAY_MAX_S) -> float:
        """Pause while requests are being answered, up to `max_s`; the seconds paused."""
        if self.now <= 0:
            return 0.0
        started = time.monotonic()
        deadline = started + max_s
        while self.now > 0 and time.monotonic() < deadline:
            time.sleep(GIVE_WAY_STEP_S)
        return time.monotonic() - started
