"""Policies load or fail with the field named; guards refuse what they should; Alertmanager's webhook files
alerts through the same dedup and refuses malformed and hostile bodies. No cluster needed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.store.store import Store
from core.errors import ConfigError
from core.types import (
    Action,
    ActionState,
    Category,
    Incident,
    IncidentState,
    Severity,
    Subject,
    SubjectKind,
)
from remediation.guards import Target, check, check_agent
from remediation.policy import DEFAULT_POLICY, Guards, Mode, load_policy
from tests.support import make_incident

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def incident(category: Category = Category.NODE_LOST, **attrs: Any) -> Incident:
    return make_incident(id="inc-1", category=category, subject=Subject(kind=SubjectKind.NODE, id="n1",
                                                                         name="10.0.0.7"),
                         summary="s", reason="RayNodeDead", first_seen=NOW, attrs={"node_ip": "10.0.0.7", **attrs})


def action(kind: str, *, ago_s: float = 0, state: ActionState = ActionState.SUCCEEDED, target: str = "n1",
           dry_run: bool = False, **result) -> Action:
    at = NOW - timedelta(seconds=ago_s)
    return Action(id=f"act-{kind}-{ago_s}-{target}", incident_id="inc-0", kind=kind,
                  target=Subject(kind=SubjectKind.NODE, id=target), state=state, idempotency_key=f"k-{kind}-{ago_s}",
                  requested_by="policy", dry_run=dry_run, result=result, created_at=at, updated_at=at)


def verdict(guards: Guards, todo: Action, history: list[Action], counts=(0, 10), **attrs):
    return check(guards, todo, incident(**attrs), history, now=NOW, shared_root=Path("/nonexistent"),
                 node_counts=lambda: counts)


def test_the_built_in_policy_loads_and_plans_by_category() -> None:
    policy = load_policy()
    assert policy.mode is Mode.DRY_RUN and policy.source == str(DEFAULT_POLICY)
    assert [s.action for s in policy.rule_for(incident()).steps] == ["keep_scene", "drain_node", "resubmit_job"]
    assert [s.action for s in policy.rule_for(incident(Category.GPU_OOM)).steps] == ["keep_scene"]
    assert load_policy(mode="auto").mode is Mode.AUTO


@pytest.mark.parametrize(
    ("text", "match"),
    [("mode: yolo\n", "mode"), ("rules: [{name: x, match: {categories: [gpu_oom]}, steps: [{action: reboot}]}]\n",
                                "action"),
     ("rules: [{name: x, match: {categories: []}, steps: [{action: keep_scene}]}]\n", "categories"),
     ("guards: {max_drained_share: 2}\n", "max_drained_share"), ("[1, 2]\n", "mapping"), ("mode: [\n", "YAML"),
     ("rules: []\nsurprise: 1\n", "surprise")],
)
def test_a_bad_policy_names_the_field(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_policy(path)


def test_a_missing_policy_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read remediation policy"):
        load_policy(tmp_path / "absent.yaml")


def test_rate_limits_per_action_and_per_node() -> None:
    guards = Guards(max_per_hour={"drain_node": 2}, max_per_node_per_hour=5, min_drain_interval_s=0)
    history = [action("drain_node", ago_s=60, target="a"), action("drain_node", ago_s=120, target="b")]
    refused = verdict(guards, action("drain_node", state=ActionState.APPROVED), history)
    assert not refused.allowed and "2 drain_node in the last hour" in refused.reason
    old = [action("drain_node", ago_s=4000, target="a"), action("drain_node", ago_s=5000, target="b")]
    assert verdict(guards, action("drain_node", state=ActionState.APPROVED), old).allowed
    per_node = Guards(max_per_node_per_hour=1, min_drain_interval_s=0)
    on_node = verdict(per_node, action("drain_node", state=ActionState.APPROVED),
                      [action("keep_scene", ago_s=30, target="n1")])
    assert not on_node.allowed and "on node 10.0.0.7" in on_node.reason


def test_drain_interval_share_and_protected_nodes() -> None:
    todo = action("drain_node", state=ActionState.APPROVED)
    interval = verdict(Guards(min_drain_interval_s=600), todo, [action("drain_node", ago_s=100, target="x")])
    assert not interval.allowed and "between drains" in interval.reason
    share = verdict(Guards(min_drain_interval_s=0, max_drained_share=0.25), todo, [], counts=(2, 10))
    assert not share.allowed and "3 of 10 nodes" in share.reason
    protected = verdict(Guards(protected_nodes=["10.0.0.7"]), todo, [])
    assert not protected.allowed and "protected" in protected.reason
    dry = action("drain_node", state=ActionState.PLANNED, dry_run=True)
    assert verdict(Guards(protected_nodes=["10.0.0.7"]), dry, []).allowed  # a dry run touches nothing


def test_resubmit_budget_and_protected_jobs() -> None:
    todo = action("resubmit_job", state=ActionState.APPROVED)
    chain = [action("resubmit_job", ago_s=3600 * i + 10, target=f"j{i}", roots=["grpo-1"]) for i in range(3)]
    budget = verdict(Guards(max_resubmits_per_job_per_day=3), todo, chain, submission_id="grpo-1")
    assert not budget.allowed and "resubmitted 3 times in a day" in budget.reason
    assert verdict(Guards(max_resubmits_per_job_per_day=4), todo, chain, submission_id="grpo-1").allowed
    protected = verdict(Guards(protected_jobs=["prod-*"]), todo, [], submission_id="prod-7")
    assert not protected.allowed and "prod-7 is protected" in protected.reason


def test_the_agents_direct_steps_meet_the_same_rules_and_count_for_remediation() -> None:
    guards = Guards(max_per_hour={"drain_node": 1}, min_drain_interval_s=0, agent_may_approve=["drain_node"])
    target = Target(nodes=("gpu-7", "10.0.0.7"))
    world: dict[str, Any] = {"now": NOW, "shared_root": Path("/nonexistent"), "node_counts": lambda: (0, 10)}
    assert check_agent(guards, "drain_node", target, [], **world).allowed
    kept = check_agent(guards.model_copy(update={"agent_may_approve": ["keep_scene"]}), "drain_node", target, [],
                       **world)
    assert not kept.allowed and kept.guard == "agent_may_approve" and "keep_scene" in kept.reason
    protected = check_agent(guards.model_copy(update={"protected_nodes": ["10.0.0.7"]}), "drain_node", target, [],
                            **world)
    assert not protected.allowed and protected.guard == "protected_nodes" and "node gpu-7" in protected.reason
    # the agent's earlier drain (no incident; its node named by registry name and address) counts for remediation
    at = NOW - timedelta(seconds=60)
    direct = Action(id="act-direct", incident_id=None, kind="drain_node", state=ActionState.SUCCEEDED,
                    target=Subject(kind=SubjectKind.NODE, id="gpu-7", name="10.0.0.7"), idempotency_key="direct:1",
                    requested_by="ops-agent", dry_run=False, created_at=at, updated_at=at)
    planned = action("drain_node", state=ActionState.APPROVED)
    budget = verdict(guards, planned, [direct])
    assert not budget.allowed and budget.guard == "max_per_hour"
    per_node = verdict(Guards(max_per_node_per_hour=1, min_drain_interval_s=0), planned, [direct])
    assert not per_node.allowed and per_node.guard == "max_per_node_per_hour" and "10.0.0.7" in per_node.reason


# ---- Alertmanager --------------------------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    _, token = store.create_token("alertmanager", "operator", created_by="tests")
    yield store, TestClient(create_app(store=store), headers={"Authorization": f"Bearer {token}"})
    store.close()


def alert(status: str = "firing", **labels) -> dict:
    return {"status": status, "startsAt": "2026-05-01T12:00:00Z", "fingerprint": "abc",
            "labels": {"alertname": "GpuXidCritical", "category": "gpu_hardware", "severity": "critical",
                       "Hostname": "gpu-node-1", **labels},
            "annotations": {"summary": "Xid 79 on gpu-node-1 GPU 3", "action": "drain the node"}}


def body(*alerts, status: str = "firing") -> dict:
    return {"version": "4", "status": status, "receiver": "argus", "groupKey": "{}:{}", "alerts": list(alerts)}


def test_alerts_become_one_incident_and_resolve_it(api) -> None:
    store, client = api
    first = client.post("/v1/alerts/alertmanager", json=body(alert()))
    assert first.status_code == 200 and len(first.json()["opened"]) == 1
    again = client.post("/v1/alerts/alertmanager", json=body(alert()))
    assert again.json() == {"opened": [], "reopened": [], "folded": 1, "resolved": [], "queued": 0}
    [incident] = store.list_incidents()
    assert incident.category is Category.GPU_HARDWARE and incident.subject.id == "gpu-node-1"
    done = client.post("/v1/alerts/alertmanager", json=body(alert("resolved"), status="resolved"))
    assert done.json()["resolved"] == [incident.id]
    assert store.get_incident(incident.id).state is IncidentState.RESOLVED


@pytest.mark.parametrize(
    "payload",
    [{}, {"version": "3", "status": "firing", "alerts": [alert()]}, body(), body({"status": "exploding"}),
     body({**alert(), "startsAt": "yesterday"}), body({**alert(), "labels": {"x": "y" * 5000}}),
     body(*[alert()] * 1001), [alert()]],
)
def test_malformed_and_hostile_webhooks_are_422_and_file_nothing(api, payload) -> None:
    store, client = api
    assert client.post("/v1/alerts/alertmanager", json=payload).status_code in (413, 422)
    assert store.list_incidents() == []


def test_unknown_categories_and_hostile_labels_are_kept_as_data(api) -> None:
    store, client = api
    hostile = alert(category="rm -rf /", severity="apocalyptic", alertname="<script>x</script>")
    assert client.post("/v1/alerts/alertmanager", json=body(hostile)).status_code == 200
    [incident] = store.list_incidents()
    assert incident.category is Category.UNKNOWN and incident.severity is Severity.WARNING
    assert incident.reason == "<script>x</script>"
    assert client.post("/v1/alerts/alertmanager", json=body(alert()),
                       headers={"Authorization": "Bearer nope"}).status_code == 401
