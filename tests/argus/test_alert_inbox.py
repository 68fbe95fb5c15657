"""Alertmanager's alerts go through the store's inbox: accepted with one INSERT, filed by the alert filer, removed only
once filed. Real SQLite store, the real API and desk."""

from __future__ import annotations

from typing import Any

import pytest

from argus.api.app import create_app
from argus.incidents.alert_filer import LOCAL_HOLDER, AlertFiler
from argus.incidents.alertmanager import AlertFiled
from argus.incidents.correlate import Correlator
from argus.incidents.desk import IncidentDesk
from argus.store.store import Store
from core.errors import InputError, SourceUnavailable, StoreError
from tests.argus.test_incidents import alert, operator, webhook_body
from tests.helpers import wait_until
from tests.support import Clock


def queued(name: str, status: str = "firing", **labels: str) -> dict[str, Any]:
    """An alert as the webhook stores it (validated, in Alertmanager's JSON)."""
    return {**alert(status, alertname=name, **labels), "endsAt": None, "generatorURL": "", "fingerprint": ""}


def desk_of(store: Store) -> IncidentDesk:
    return IncidentDesk(store, correlator=Correlator(store))


def test_the_inbox_keeps_alerts_in_order_until_filed_and_says_what_waited(store: Store) -> None:
    ids, waiting = store.alert_inbox.put([queued("A"), queued("B")], group_key="g", holder="r1")
    assert len(ids) == 2 and waiting == 0
    more, waiting = store.alert_inbox.put([queued("C")], group_key="g", holder="r1")
    assert waiting == 2 and more[0] > ids[-1]
    assert [q.alert["labels"]["alertname"] for q in store.alert_inbox.claim("r1", limit=2)] == ["A", "B"]
    store.alert_inbox.done(ids)
    assert [q.alert["labels"]["alertname"] for q in store.alert_inbox.claim("r1")] == ["C"]
    assert store.alert_inbox.depth() == 1 and store.alert_inbox.depth("r2") == 0
    assert store.alert_inbox.put([], group_key="g", holder="r1") == ([], 0)


def test_a_stopped_replicas_alerts_are_taken_over_once_its_claims_go_stale(tmp_path) -> None:
    clock = Clock()
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    try:
        store.alert_inbox.put([queued("A")], group_key="g", holder="gone")
        assert store.alert_inbox.claim("alive", stale_after_s=60) == []  # "gone" may still be working on it
        clock.tick(61)
        [taken] = store.alert_inbox.claim("alive", stale_after_s=60)
        assert taken.alert["labels"]["alertname"] == "A" and store.alert_inbox.depth("alive") == 1
        # a live replica renews its own claims: a long queue is not taken from it while it works through it
        store.alert_inbox.put([queued("B")], group_key="g", holder="busy")
        for _ in range(4):
            clock.tick(25)
            store.alert_inbox.claim("busy", stale_after_s=60)
            mine = store.alert_inbox.claim("alive", stale_after_s=60)
        assert [q.alert["labels"]["alertname"] for q in mine] == ["A"] and store.alert_inbox.depth("busy") == 1
    finally:
        store.close()


@pytest.mark.parametrize("holder", ["", "x" * 129])
def test_a_holder_must_name_a_replica(store: Store, holder: str) -> None:
    with pytest.raises(InputError, match="holder"):
        store.alert_inbox.put([queued("A")], group_key="g", holder=holder)


def test_alerts_accepted_by_an_argus_that_was_killed_are_filed_by_the_next(store: Store) -> None:
    store.alert_inbox.put([queued("Before"), queued("Before"), queued("Other")], group_key="g", holder=LOCAL_HOLDER)
    filer = AlertFiler(store, desk_of(store), holder=LOCAL_HOLDER)
    assert filer.file_pending() == 3
    assert store.alert_inbox.depth() == 0 and filer.backlog == 0
    assert sorted(i.reason for i in store.list_incidents()) == ["Before", "Other"]
    [before] = [i for i in store.list_incidents() if i.reason == "Before"]
    assert before.occurrences == 2


def test_the_webhook_answers_202_with_what_it_queued_behind_a_backlog_and_files_it_all(store: Store) -> None:
    desk = desk_of(store)
    filer = AlertFiler(store, desk, holder=LOCAL_HOLDER, poll_s=0.1)
    store.alert_inbox.put([queued("Waiting")], group_key="g", holder=LOCAL_HOLDER)  # accepted before, not filed yet
    client = operator(store, create_app(store=store, incidents=desk, alert_filer=filer))
    try:
        answer = client.post("/v1/alerts/alertmanager", json=webhook_body("firing", alert("firing"), alert(
            "firing", alertname="Second")))
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"opened": [], "reopened": [], "folded": 0, "resolved": [], "queued": 2}
        wait_until("the queue filed", lambda: store.alert_inbox.depth() == 0, timeout=30, interval=0.1)
        assert sorted(i.reason for i in store.list_incidents()) == ["GpuMemoryNearlyFull", "Second", "Waiting"]
        assert client.get("/v1/health").json()["alert_inbox"] == {"queued": 0, "error": None}
        audit = [r for r in store.list_audit() if r.path == "/v1/alerts/alertmanager"]
        assert audit[-1].detail["queued"] == 2
    finally:
        filer.close()


class FailingDesk:
    """A desk whose filing fails as told: a StoreError (the database) or any other error (this alert)."""

    def __init__(self, desk: IncidentDesk, failures: list[Exception]) -> None:
        self.desk, self.failures, self.store = desk, failures, desk.store

    def file(self, finding: Any) -> Any:
        if self.failures:
            raise self.failures.pop(0)
        return self.desk.file(finding)


STORE_FAILURES = [StoreError("database is locked", hint="wait"),
                  SourceUnavailable("database", "postgresql://127.0.0.1:5432/argus", "connection refused")]


@pytest.mark.parametrize("failure", STORE_FAILURES, ids=["store error", "database unreachable"])
def test_a_store_failure_leaves_the_alert_queued_and_a_broken_alert_does_not_block_the_rest(
        store: Store, failure: Exception) -> None:
    store.alert_inbox.put([queued("First"), queued("Second")], group_key="g", holder=LOCAL_HOLDER)
    desk = FailingDesk(desk_of(store), [failure])
    filer = AlertFiler(store, desk, holder=LOCAL_HOLDER)  # type: ignore[arg-type]
    with pytest.raises(type(failure)):
        filer.file_pending()
    assert store.alert_inbox.depth() == 2  # nothing lost: both are filed by the next pass
    desk.failures.append(ValueError("a bug this alert triggers"))
    assert filer.file_pending() == 2  # the first dropped (logged), the second filed
    assert [i.reason for i in store.list_incidents()] == ["Second"] and store.alert_inbox.depth() == 0


def test_a_waiting_webhook_gets_the_outcomes_of_its_own_alerts(store: Store) -> None:
    filer = AlertFiler(store, desk_of(store), holder=LOCAL_HOLDER).start()
    try:
        ids, _ = store.alert_inbox.put([queued("Mine")], group_key="g", holder=LOCAL_HOLDER)
        filer.wake()
        filed = filer.wait_for(ids, timeout_s=30)
        assert filed is not None and filed[ids[0]].outcome == "opened"
        assert filer.wait_for([10**9], timeout_s=0.2) is None  # never queued: the wait ends at its timeout
    finally:
        filer.close()
    assert isinstance(filed[ids[0]], AlertFiled)


@pytest.mark.parametrize("failure", STORE_FAILURES, ids=["store error", "database unreachable"])
def test_the_inbox_state_says_why_it_cannot_count_while_the_database_is_down(store: Store,
                                                                             failure: Exception) -> None:
    class Down:
        def depth(self, holder: str | None = None) -> int:
            raise failure

    filer = AlertFiler(store, desk_of(store), holder=LOCAL_HOLDER)
    filer.store = type("DownStore", (), {"alert_inbox": Down()})()
    state = filer.state()
    assert state["queued"] == 0 and str(failure)[:40] in state["error"]
