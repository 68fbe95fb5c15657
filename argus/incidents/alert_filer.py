"""The alert filer: files the alerts the webhook queued (argus/store/alert_inbox.py), oldest first, in one thread.

Why a queue and one thread: in an alert storm (Alertmanager re-sending thousands of alerts a minute) filing each alert
in the request that brought it ran four filings at once; they contended for the database's write lock and for the
interpreter, so requests took seconds, the API's readers waited behind them, and fewer alerts were accepted than
sent. Now a request only queues its alerts (one INSERT) and the filer works through the queue at the pace the desk
allows. Where the queue was empty, the webhook waits (briefly) for its own alerts to be filed and answers with their
incidents, as before.

An alert leaves the inbox only after it was filed; a failure of the store stops the pass and the alerts wait for the
next one (after a back-off), so nothing accepted is lost.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from loguru import logger
from pydantic import ValidationError

from argus.incidents.alertmanager import Alert, AlertFiled, file_alert
from argus.incidents.desk import IncidentDesk
from core.errors import SourceUnavailable, StoreError
from core.readers import Readers

DONE_EVERY = 25  # filed alerts removed from the inbox in one statement: at most this many are filed twice after a kill
IDLE_MAX_S = 10.0
LOCAL_HOLDER = "argus"  # the claims of a single replica (no leader election): the same name across restarts
OUTCOMES_KEPT = 20_000  # outcomes kept for webhooks waiting on them; older ones are dropped
# The store failing: its own errors, or the database unreachable (the store says so as a source that is down).
STORE_DOWN = (StoreError, SourceUnavailable)


class AlertFiler:
    """Files `holder`'s queued alerts through `desk`, `batch` at a time. `poll_s`: how often it looks for alerts
    without being woken (another replica's stale ones). `readers`: the API's requests being answered; the filer gives
    way to them between alerts (core/readers.py), so a storm's filing does not slow the readers."""

    def __init__(self, store: Any, desk: IncidentDesk, *, holder: str, batch: int = 100,
                 stale_after_s: float = 60.0, poll_s: float = 1.0, readers: Readers | None = None) -> None:
        self.store = store
        self.desk = desk
        self.holder = holder
        self.batch = batch
        self.stale_after_s = stale_after_s
        self.poll_s = poll_s
        self.readers = readers
        self._outcomes: OrderedDict[int, AlertFiled] = OrderedDict()
        self._filed = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.backlog = 0  # of the last pass's alerts, those it did not file: state()'s answer when the store is down
        self.last_error: str | None = None

    # -- running ------------------------------------------------------------------------------------------------

    def start(self) -> AlertFiler:
        """Start the thread (once; later calls do nothing)."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="alert-filer", daemon=True)
                self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the alert being filed; what is still queued stays in the inbox for the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        self._wake.set()

    def state(self) -> dict[str, Any]:
        """How many of this replica's alerts wait to be filed (counted in the store now: a pass under way still holds
        its alerts there), and the last error; with the store unreachable, the count of the last pass and why."""
        try:
            queued, error = self.store.alert_inbox.depth(self.holder), self.last_error
        except STORE_DOWN as err:
            queued, error = self.backlog, str(err)[:300]
        return {"queued": queued, "error": error}

    def _run(self) -> None:
        failures = 0
        idle_s = self.poll_s
        while not self._stop.is_set():
            try:
                filed = self.file_pending()
                failures = 0
                self.last_error = None
            except Exception as exc:  # the store down or full: the alerts wait in the inbox, nothing is lost
                failures += 1
                self.last_error = str(exc)[:300]
                logger.warning("could not file queued alerts (attempt {}): {}", failures, exc)
                self._stop.wait(min(30.0, self.poll_s * 2 ** min(failures, 5)))
                continue
            if filed:
                idle_s = self.poll_s
                continue
            # Nothing queued: look again less and less often (up to IDLE_MAX_S; a webhook wakes the filer at once), as
            # only another replica's stale alerts can appear unannounced.
            woken = self._wake.wait(idle_s)
            self._wake.clear()
            idle_s = self.poll_s if woken else min(IDLE_MAX_S, idle_s * 2)

    # -- filing -------------------------------------------------------------------------------------------------

    def file_pending(self) -> int:
        """One pass: claim up to `batch` of this replica's alerts and file them, oldest first. Returns how many were
        filed. A store error stops the pass (raised); the unfiled alerts stay queued."""
        inbox = self.store.alert_inbox
        queued = inbox.claim(self.holder, limit=self.batch, stale_after_s=self.stale_after_s)
        filed: list[int] = []
        try:
            for item in queued:
                if self._stop.is_set():
                    break
                if self.readers is not None:
                    self.readers.give_way()
                try:
                    alert = Alert.model_validate(item.alert)
                except ValidationError as err:  # queued by another version of Argus: say so, do not retry forever
                    logger.error("queued alert {} of group {!r} is not an Alertmanager alert this Argus reads, "
                                 "dropped: {}", item.id, item.group_key[:200], err)
                    self._record(item.id, AlertFiled("unreadable", None))
                else:
                    try:
                        self._record(item.id, file_alert(self.desk, alert))
                    except STORE_DOWN:
                        raise  # the store, not the alert: it stays queued for the next pass
                    except Exception:  # this alert breaks filing: it must not hold up every alert behind it
                        logger.exception("filing queued alert {} of group {!r} failed; dropped", item.id,
                                         item.group_key[:200])
                        self._record(item.id, AlertFiled("failed", None))
                filed.append(item.id)
                if len(filed) % DONE_EVERY == 0:
                    inbox.done(filed[-DONE_EVERY:])
        finally:
            if rest := filed[len(filed) - len(filed) % DONE_EVERY:]:
                inbox.done(rest)
        self.backlog = len(queued) - len(filed)  # state() counts in the store; no second query on every pass
        return len(filed)

    def _record(self, alert_id: int, filed: AlertFiled) -> None:
        with self._filed:
            self._outcomes[alert_id] = filed
            while len(self._outcomes) > OUTCOMES_KEPT:
                self._outcomes.popitem(last=False)
            self._filed.notify_all()

    def wait_for(self, ids: Sequence[int], timeout_s: float) -> dict[int, AlertFiled] | None:
        """The outcomes of alerts `ids` once all are filed, or None if that took longer than `timeout_s` (they are
        filed later all the same)."""
        deadline = time.monotonic() + timeout_s
        with self._filed:
            while True:
                if all(i in self._outcomes for i in ids):
                    return {i: self._outcomes.pop(i) for i in ids}
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return None
                self._filed.wait(left)
