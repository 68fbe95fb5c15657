"""The waiting-job detector on Ray's answers as collectors.ray_state gives them (tests/support/waits.py): a PENDING
job and a RUNNING job's unplaced placement groups past pending_alert_s are one finding each, naming what they wait
for and what the cluster has free, and close when the wait ends. The real cluster: tests/detectors/test_waiting_real.py.
"""

from __future__ import annotations

import pytest

from argus.store.store import Store
from core.types import Category, Severity, fingerprint_of
from detectors.waiting import WaitingJobDetector
from remediation.policy import DEFAULT_POLICY, load_policy
from tests.support import T0, Clock, make_incident
from tests.support.waits import gpu_cluster, group, job, later, node

ALERT_S = 300


def detector(clock: Clock, **kw) -> WaitingJobDetector:
    return WaitingJobDetector(alert_s=ALERT_S, clock=clock, **kw)


def test_a_pending_job_past_the_alert_is_one_warning_naming_its_demand_and_the_free_gpus() -> None:
    clock = Clock()
    d = detector(clock)
    pending = job("grpo-1", "PENDING", demand={"worker": 0.001, "GPU": 16})
    assert d.detect([*gpu_cluster(), pending]) == []
    clock.at(ALERT_S - 1)
    assert d.detect([*gpu_cluster(), pending]) == []
    clock.at(ALERT_S)
    [finding] = d.detect([*gpu_cluster(), pending])
    assert (finding.category, finding.severity, finding.reason) == (
        Category.UNSCHEDULABLE, Severity.WARNING, "JobPendingTooLong")
    assert finding.subject.id == "grpo-1" and finding.first_seen == T0
    assert "has been PENDING for 5.0 min" in finding.summary
    assert "no node offered resources worker=0.001, GPU=16" in finding.summary
    assert "largest free on one node: 8 GPU; 3 alive nodes with GPU: 8/8/4 free" in finding.summary
    assert "no alive node has worker" in finding.summary
    assert "`ray status`" in (finding.recommended_action or "")
    assert finding.attrs["free_by_node"]["10.0.0.4"] == {"CPU": 28, "GPU": 4}
    assert any("node 10.0.0.4: free GPU=4 of GPU=8" in e.text for e in finding.evidence)
    # reported once per wait, however long it goes on
    clock.at(ALERT_S * 3)
    assert d.detect([*gpu_cluster(), pending]) == []
    assert d.recoveries() == []


def test_a_pool_selector_counts_only_the_pools_nodes_and_the_advice_names_the_pool() -> None:
    clock = Clock(later(ALERT_S))
    pending = job("grpo-2", "PENDING", demand={"GPU": 8}, selector={"argus.io/pool": "h100"})
    [finding] = detector(clock).detect([*gpu_cluster(), pending])
    assert "no node offered labels argus.io/pool=h100 and resources GPU=8" in finding.summary
    assert "1 of 4 alive nodes match labels argus.io/pool=h100; largest free on one node: 4 GPU" in finding.summary
    assert "join a node into pool h100" in (finding.recommended_action or "")


def test_a_wait_that_began_before_argus_started_is_reported_at_once_but_an_old_wait_that_ended_is_not_news() -> None:
    clock = Clock(later(7200))
    d = detector(clock)
    still = job("sft-1", "PENDING", submitted=T0, demand={"GPU": 8}, at=clock.now)
    ran = job("sft-2", "RUNNING", submitted=T0, groups=[], at=clock.now)  # PENDING for an hour once, long ago
    ended = job("sft-3", "FAILED", submitted=T0, at=clock.now)
    [finding] = d.detect([*gpu_cluster(clock.now), still, ran, ended])
    assert finding.subject.id == "sft-1" and "for 120.0 min" in finding.summary


def test_the_finding_closes_when_the_driver_starts_and_an_unreported_wait_closes_nothing() -> None:
    clock = Clock()
    d = detector(clock)
    d.detect([*gpu_cluster(), job("a", "PENDING"), job("b", "PENDING")])
    clock.at(ALERT_S)
    [finding] = d.detect([*gpu_cluster(), job("a", "PENDING"), job("b", "RUNNING", groups=[], submitted=later(200))])
    assert finding.subject.id == "a"
    assert d.recoveries() == []  # b ran before it was reported: nothing to close
    clock.at(ALERT_S + 30)
    d.detect([*gpu_cluster(), job("a", "RUNNING", groups=[]), job("b", "RUNNING", groups=[])])
    [recovery] = d.recoveries()
    assert recovery.fingerprint == finding.fingerprint == fingerprint_of(Category.UNSCHEDULABLE, finding.subject,
                                                                         "driver")
    assert recovery.reason == "job a is RUNNING: its driver started after waiting 5.5 min"
    assert recovery.detector == "waiting"
    d.detect([*gpu_cluster(), job("a", "RUNNING", groups=[])])
    assert d.recoveries() == []  # told once


def test_a_job_stopped_or_forgotten_by_ray_ends_its_wait() -> None:
    clock = Clock(later(ALERT_S))
    d = detector(clock)
    assert len(d.detect([*gpu_cluster(), job("a", "PENDING"), job("b", "PENDING")])) == 2
    clock.tick(5)
    d.detect([*gpu_cluster(), job("a", "STOPPED")])
    reasons = sorted(r.reason for r in d.recoveries())
    assert reasons == ["job a ended (STOPPED) after waiting 5.1 min for its driver to start",
                       "job b is no longer listed by Ray (waited 5.1 min)"]


def test_a_tick_without_ray_state_neither_reports_nor_recovers() -> None:
    clock = Clock(later(ALERT_S))
    d = detector(clock)
    assert len(d.detect([*gpu_cluster(), job("a", "PENDING")])) == 1
    clock.tick(60)
    assert d.detect([]) == [] and d.recoveries() == []  # Ray not polled: the job is not gone


def test_unplaced_placement_groups_of_a_running_job_name_their_bundles_strategy_and_selectors() -> None:
    clock = Clock()
    d = detector(clock)
    groups = [group([{"GPU": 8}, {"GPU": 8}], since=later(10)),
              group([{"CPU": 4}], gid="77aa", name="rollout", strategy=None, scheduling="NO_RESOURCES",
                    selectors=[{"argus.io/pool": "h100"}], since=later(20))]
    running = job("ppo-1", "RUNNING", groups=groups)
    assert d.detect([*gpu_cluster(), running]) == []
    clock.at(ALERT_S + 9)
    assert d.detect([*gpu_cluster(), running]) == []  # counted from the earliest group's creation request
    clock.at(ALERT_S + 10)
    [finding] = d.detect([*gpu_cluster(), running])
    assert finding.reason == "PlacementGroupsUnplaced" and finding.first_seen == later(10)
    assert "job ppo-1 is RUNNING but 2 placement groups have waited 5.0 min for a place" in finding.summary
    assert "group 3f2a1c9e0d4b (PENDING, INFEASIBLE): 2 bundles of {GPU: 8}, strategy STRICT_SPREAD" in finding.summary
    assert ("group rollout (PENDING, NO_RESOURCES): 1 bundle of {CPU: 4}, label selectors argus.io/pool=h100"
            in finding.summary)
    assert "largest free on one node: 8 GPU; 3 alive nodes with GPU: 8/8/4 free" in finding.summary
    assert "largest free on one node: 32 CPU" in finding.summary
    assert finding.fingerprint == fingerprint_of(Category.UNSCHEDULABLE, finding.subject, "placement_groups")
    # a poll that could not read the groups neither ends nor restarts the wait
    clock.tick(5)
    assert d.detect([*gpu_cluster(), job("ppo-1", "RUNNING", groups=None)]) == [] and d.recoveries() == []
    # one group placed, the other still waits: the same wait goes on
    assert d.detect([*gpu_cluster(), job("ppo-1", "RUNNING", groups=groups[1:])]) == [] and d.recoveries() == []
    clock.tick(5)
    d.detect([*gpu_cluster(), job("ppo-1", "RUNNING", groups=[], placed=["3f2a1c9e0d4b", "77aa", "other"])])
    [recovery] = d.recoveries()
    assert recovery.fingerprint == finding.fingerprint
    assert recovery.reason == "every placement group of job ppo-1 is placed (the first waited 5.2 min)"


def test_groups_removed_unplaced_end_the_wait_and_the_reason_says_so() -> None:
    """A stopped job's groups are removed a moment before Ray marks it STOPPED; a job may also give up waiting."""
    clock = Clock(later(ALERT_S))
    d = detector(clock)
    two = [group([{"GPU": 8}], gid="g1"), group([{"GPU": 8}], gid="g2")]
    [finding] = d.detect([*gpu_cluster(), job("ppo-1", "RUNNING", groups=two)])
    d.detect([*gpu_cluster(), job("ppo-1", "RUNNING", groups=[], placed=[])])
    [recovery] = d.recoveries()
    assert recovery.reason == ("job ppo-1 removed the placement groups it waited on, unplaced (the first waited "
                               "5.0 min; a job being stopped removes its groups first)")
    assert len(d.detect([*gpu_cluster(), job("ppo-2", "RUNNING", groups=two)])) == 1
    d.detect([*gpu_cluster(), job("ppo-2", "RUNNING", groups=[], placed=["g2"])])
    [mixed] = d.recoveries()
    assert mixed.reason == ("no placement group of job ppo-2 waits any more: 1 placed, 1 removed unplaced (the first "
                            "waited 5.0 min)")


def test_the_driver_wait_and_the_groups_wait_of_one_job_are_two_findings() -> None:
    clock = Clock(later(ALERT_S))
    d = detector(clock)
    [driver] = d.detect([*gpu_cluster(), job("a", "PENDING")])
    clock.tick(ALERT_S)
    [groups] = d.detect([*gpu_cluster(), job("a", "RUNNING", groups=[group([{"GPU": 16}], since=T0)])])
    assert driver.fingerprint != groups.fingerprint
    assert [r.fingerprint for r in d.recoveries()] == [driver.fingerprint]


def test_a_driver_whose_demand_ray_did_not_list_is_still_a_finding_that_says_so() -> None:
    clock = Clock(later(ALERT_S))
    pending = job("a", "PENDING")
    pending = pending.model_copy(update={"attrs": {**pending.attrs, "entrypoint_resources": None}})
    [finding] = detector(clock).detect([*gpu_cluster(), pending])
    assert "no node offered what it asks for (unknown: Ray did not list it)" in finding.summary
    assert "3 alive nodes with GPU: 8/8/4 free" in finding.summary


def test_free_resources_unknown_when_the_autoscaler_report_was_not_read() -> None:
    clock = Clock(later(ALERT_S))
    nodes = [node("10.0.0.2", {"GPU": 8}, None), node("10.0.0.3", {"GPU": 8}, None)]
    [finding] = detector(clock).detect([*nodes, job("a", "PENDING", demand={"GPU": 16})])
    assert "free resources unknown" in finding.summary and finding.attrs["free_by_node"] == {}


def test_a_reported_wait_survives_a_restart_and_closes_after_it(store: Store) -> None:
    clock = Clock(later(ALERT_S))
    memory = store.detector_state
    [finding] = detector(clock, memory=memory).detect([*gpu_cluster(), job("a", "PENDING"), job("b", "PENDING",
                                                                                                submitted=later(200))])
    # Argus restarts; meanwhile the job got its node
    clock.tick(60)
    again = detector(clock, memory=memory)
    forgetful = detector(clock)
    signals = [*gpu_cluster(), job("a", "RUNNING", groups=[]), job("b", "PENDING", submitted=later(200))]
    assert again.detect(signals) == [] and forgetful.detect(signals) == []
    [recovery] = again.recoveries()
    assert recovery.fingerprint == finding.fingerprint and "RUNNING" in recovery.reason
    assert forgetful.recoveries() == []  # without the memory the incident would stay open
    assert list(memory.load_all("waiting")) == []  # the ended wait is forgotten; b was never reported
    # b is still judged from Ray's submission time, memory or not
    clock.at(200 + ALERT_S)
    [late] = again.detect(signals)
    assert late.subject.id == "b"


def test_an_unreadable_remembered_wait_is_forgotten(store: Store) -> None:
    store.detector_state.save("waiting", {"a|driver": {"v": 1, "job": "a", "kind": "nap", "since": "x"}})
    d = detector(Clock(), memory=store.detector_state)
    d.detect(gpu_cluster())
    assert store.detector_state.load_all("waiting") == {}


@pytest.mark.parametrize("policy", [DEFAULT_POLICY, DEFAULT_POLICY.parent / "demo.yaml"], ids=["default", "demo"])
def test_the_built_in_policies_plan_nothing_for_a_waiting_job(policy) -> None:
    """Told, never acted on: stopping or resubmitting a job because it waits is for its owner to decide."""
    assert load_policy(policy).rule_for(make_incident(category=Category.UNSCHEDULABLE)) is None
