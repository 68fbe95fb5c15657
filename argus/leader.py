"""Which of several Argus replicas runs the loop: a lease in the shared store (argus/store/leases.py).

Every replica serves the API and the web page from the store. The one holding the lease `argus-leader` also runs
the detection loop, its chores (remediation, job timeouts, the node agents' fleet) and the recovery of remediation
steps a crash left running; the others try to take the lease every `renew_s` and take over once the leader's
lease lapses (at most `ttl_s` after its last renewal, so a SIGKILLed leader is replaced within ttl_s + renew_s).

A leader that cannot renew (the database unreachable, the process stalled past its lease) stops leading before
another replica may take over: `on_deposed` is called once its lease may have lapsed, and `argus serve` exits
there (the service manager starts it again as a follower, as Kubernetes' controllers do on a lost lease) so no
step of the old tenure can run beside the new leader's. Steps themselves are claimed under a row lock
(argus/store/actions.py), so even then none runs twice.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from argus.store.leases import Lease, LeaseRepository
from core.errors import ArgusError

LEADER_LEASE = "argus-leader"


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"[:128]


@dataclass(frozen=True)
class LeaderView:
    """What a replica knows of the lease, for /v1/health and metrics."""

    replica: str
    leader: bool
    holder: str | None
    term: int | None
    last_error: str | None


class LeaderElector:
    """Takes and renews the lease in a thread; calls `on_elected(term)` when this replica becomes the leader and
    `on_deposed(why)` when it stops being it (see the module docstring)."""

    def __init__(
        self,
        leases: LeaseRepository,
        *,
        replica: str,
        on_elected: Callable[[int], None],
        on_deposed: Callable[[str], None],
        ttl_s: float = 10.0,
        renew_s: float = 2.0,
        name: str = LEADER_LEASE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < renew_s < ttl_s / 2:
            raise ValueError(f"lease_renew_s={renew_s} must be under half of lease_ttl_s={ttl_s}")
        self.leases = leases
        self.replica = replica
        self.name = name
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._clock = clock
        self._leader = False
        self._renewed_at = float("-inf")  # when the lease was last known ours (this process's clock)
        self._seen: Lease | None = None
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leader(self) -> bool:
        return self._leader

    def view(self) -> LeaderView:
        seen = self._seen
        return LeaderView(self.replica, self._leader, seen.holder if seen else None, seen.term if seen else None,
                          self._last_error)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="argus-leader-election", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop trying (no election after this returns); the lease stays until `resign()` or it lapses."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)

    def resign(self) -> None:
        """A leader gives the lease up, so a follower takes over at once (call once nothing of its tenure runs)."""
        if not self._leader:
            return
        self._leader = False
        try:
            self.leases.release(self.name, self.replica)
            logger.info("replica {} gave up the leader lease", self.replica)
        except ArgusError as exc:
            logger.warning("replica {} could not give up the leader lease ({}): it lapses in {} s",
                           self.replica, exc.message, self.ttl_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the election must outlive one bad try; the next one retries
                logger.opt(exception=exc).error("replica {}: the leader election failed this time", self.replica)
            self._stop.wait(self.renew_s)

    def step(self) -> None:
        """One try at taking or renewing the lease (the thread calls it every renew_s; tests call it directly)."""
        began = self._clock()
        try:
            lease = self.leases.acquire(self.name, self.replica, self.ttl_s)
        except ArgusError as exc:
            self._last_error = exc.message
            # Not renewed: once the lease may have lapsed (leaving one renew interval of margin), another replica
            # may hold it, so this one must stop leading.
            if self._leader and began - self._renewed_at >= self.ttl_s - self.renew_s:
                self._depose(f"the lease could not be renewed for {began - self._renewed_at:.1f} s: {exc.message}")
            else:
                logger.warning("replica {} could not reach the leader lease: {}", self.replica, exc.message)
            return
        self._last_error = None
        self._seen = lease
        if lease.held:
            self._renewed_at = began
            if not self._leader:
                self._leader = True
                logger.info("replica {} leads (term {})", self.replica, lease.term)
                try:
                    self._on_elected(lease.term)
                except Exception:
                    # It could not start leading (the store failed mid-recovery, say): give the lease back rather
                    # than hold it while running nothing; this replica or another takes it on a later try.
                    self.resign()
                    raise
        elif self._leader:
            self._depose(f"replica {lease.holder} holds the lease (term {lease.term})")

    def _depose(self, why: str) -> None:
        self._leader = False
        logger.error("replica {} no longer leads: {}", self.replica, why)
        self._on_deposed(why)
