"""Changing an incident's severity (IncidentRepository.set_severity), against SQLite and PostgreSQL (conftest)."""

from __future__ import annotations

import pytest

from argus.store.store import Store
from core.errors import InputError, NotFound
from core.types import Severity
from tests.store.test_store import make_finding


def test_a_severity_change_is_kept_with_its_reason_and_time(store: Store, clock) -> None:
    incident, _ = store.record_finding(make_finding(severity=Severity.CRITICAL))
    assert incident.severity is Severity.CRITICAL
    clock.tick(5)
    lowered = store.set_severity(incident.id, Severity.WARNING, reason="job raysubmit_abc SUCCEEDED")
    assert lowered.severity is Severity.WARNING and store.get_incident(incident.id).severity is Severity.WARNING
    assert lowered.attrs["severity_changes"] == [
        {"from": "critical", "to": "warning", "reason": "job raysubmit_abc SUCCEEDED", "at": clock.now.isoformat()}
    ]
    again = store.set_severity(incident.id, "warning", reason="the same again")
    assert len(again.attrs["severity_changes"]) == 1  # no change, nothing recorded
    # a repeat of the finding raises it again while the incident is open, as any repeat does
    raised, created = store.record_finding(make_finding(severity=Severity.CRITICAL))
    assert not created and raised.severity is Severity.CRITICAL


def test_only_the_newest_changes_are_kept(store: Store) -> None:
    incident, _ = store.record_finding(make_finding(severity=Severity.CRITICAL))
    for n in range(15):
        store.set_severity(incident.id, Severity.WARNING if n % 2 == 0 else Severity.CRITICAL, reason=f"change {n}")
    changes = store.get_incident(incident.id).attrs["severity_changes"]
    assert len(changes) == 10 and changes[-1]["reason"] == "change 14"


def test_bad_input_is_refused_and_changes_nothing(store: Store) -> None:
    incident, _ = store.record_finding(make_finding(severity=Severity.CRITICAL))
    with pytest.raises(InputError, match="severity 'fatal' is not one of info, warning, critical"):
        store.set_severity(incident.id, "fatal", reason="x")
    with pytest.raises(NotFound, match="inc-nope"):
        store.set_severity("inc-nope", Severity.INFO, reason="x")
    assert store.get_incident(incident.id).severity is Severity.CRITICAL
    assert "severity_changes" not in store.get_incident(incident.id).attrs
