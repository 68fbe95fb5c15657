"""NodeSpec validation, the node state machine and the in-memory registry."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control.nodes import MemoryNodeRegistry, NodeRegistry, NodeSpec, NodeState, allowed_targets, transition
from core.errors import InputError, NotFound

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx0lKrgl4iJKTxmz8S2S6w8V0Eg8C2Zl1Bn3rUqz0aE"

HOSTILE = [
    "; rm -rf /",
    "$(touch /tmp/pwned)",
    "`id`",
    "a\nb",
    "a b",
    "a|b",
    "a&&b",
    "a'b",
    'a"b',
    "a\x00b",
    "ｎｏｄｅ",  # fullwidth look-alike
    "nоde",  # Cyrillic 'о'
    "x" * 300,
    "",
    "-rf",
]


def spec_data(**over: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "gpu-01",
        "host": "10.0.0.7",
        "ssh_user": "ray",
        "ssh_port": 2222,
        "ssh_key_path": "/etc/argus/id_ed25519",
        "host_key": HOST_KEY,
        "labels": {"argus.io/zone": "z1", "gpu-type": "H100"},
        "pool": "train",
        "gpus": 8,
        "ray_temp_dir": "/tmp/ray-gpu01",
    }
    data.update(over)
    return data


def test_a_good_spec_is_accepted_and_defaults_node_ip_to_host() -> None:
    spec = NodeSpec.parse(spec_data())
    assert spec.name == "gpu-01"
    assert spec.ray_node_ip == "10.0.0.7"
    assert spec.host_key == HOST_KEY


def test_host_may_be_a_dns_name_or_ipv6_and_a_comment_on_the_key_is_dropped() -> None:
    assert NodeSpec.parse(spec_data(host="gpu-01.cluster.example")).host == "gpu-01.cluster.example"
    assert NodeSpec.parse(spec_data(host="::1")).host == "::1"
    assert NodeSpec.parse(spec_data(host_key=HOST_KEY + " root@node")).host_key == HOST_KEY


def test_a_dns_host_without_node_ip_cannot_give_rays_address() -> None:
    spec = NodeSpec.parse(spec_data(host="gpu-01.example"))
    with pytest.raises(InputError, match="node_ip"):
        _ = spec.ray_node_ip


@pytest.mark.parametrize("field", ["name", "host", "ssh_user", "ssh_key_path", "node_ip", "pool", "ray_bin",
                                   "ray_temp_dir", "host_key"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_strings_are_refused_in_every_field(field: str, value: str) -> None:
    with pytest.raises(InputError, match=field):
        NodeSpec.parse(spec_data(**{field: value}))


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_keys_and_values_are_refused(value: str) -> None:
    with pytest.raises(InputError, match="labels"):
        NodeSpec.parse(spec_data(labels={value: "ok"}))
    if value:  # an empty label value is legal in Ray
        with pytest.raises(InputError, match="labels"):
            NodeSpec.parse(spec_data(labels={"ok": value}))


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_resource_names_are_refused(value: str) -> None:
    with pytest.raises(InputError, match="resources"):
        NodeSpec.parse(spec_data(resources={value: 1}))


@pytest.mark.parametrize("over", [
    {"gpus": 17}, {"gpus": -1}, {"gpus": "8"}, {"ssh_port": 0}, {"ssh_port": 70000},
    {"labels": {"ray.io/node-id": "x"}}, {"labels": {"a,b": "c"}}, {"labels": {"k": "v,x=y"}},
    {"resources": {"GPU": 1}}, {"resources": {"fast": -1}}, {"resources": {"fast": True}},
    {"ray_temp_dir": "/tmp/../etc"}, {"ray_temp_dir": "relative/dir"}, {"ray_temp_dir": "/tmp/" + "x" * 60},
    {"ssh_key_path": "~/.ssh/id"}, {"host": "999.1.1.1"}, {"host_key": "AAAAC3Nza"},
    {"unknown_field": 1},
])
def test_out_of_range_and_malformed_values_are_refused(over: dict[str, object]) -> None:
    with pytest.raises(InputError):
        NodeSpec.parse(spec_data(**over))


def test_the_lifecycle_moves_forward_and_failed_is_reachable_from_any_state() -> None:
    s = NodeState
    assert transition(s.PENDING, s.ONLINE) is s.ONLINE
    assert transition(s.ONLINE, s.DRAINING) is s.DRAINING
    assert transition(s.DRAINING, s.OFFLINE) is s.OFFLINE
    for state in (s.PENDING, s.ONLINE, s.DRAINING, s.OFFLINE):
        assert transition(state, s.FAILED) is s.FAILED


@pytest.mark.parametrize(("current", "target"), [
    (NodeState.PENDING, NodeState.DRAINING),
    (NodeState.OFFLINE, NodeState.ONLINE),
    (NodeState.OFFLINE, NodeState.DRAINING),
    (NodeState.ONLINE, NodeState.PENDING),
    (NodeState.ONLINE, NodeState.ONLINE),
    (NodeState.FAILED, NodeState.ONLINE),
])
def test_out_of_order_moves_are_refused_with_the_legal_ones_named(current: NodeState, target: NodeState) -> None:
    with pytest.raises(InputError) as err:
        transition(current, target)
    assert current.value in err.value.message and target.value in err.value.message
    for legal in allowed_targets(current):
        assert legal.value in (err.value.hint or "")


def test_memory_registry_records_every_transition_with_actor_reason_and_time() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ticks = iter(t0 + timedelta(seconds=i) for i in range(100))
    reg = MemoryNodeRegistry(clock=lambda: next(ticks))
    assert isinstance(reg, NodeRegistry)
    spec = NodeSpec.parse(spec_data())
    assert reg.add(spec, actor="alice", reason="new node").state is NodeState.PENDING
    reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="argus", reason="joined",
                          ray_node_id="ab" * 28)
    rec = reg.record_transition("gpu-01", NodeState.ONLINE, NodeState.DRAINING, actor="bob", reason="xid 79")
    assert rec.state is NodeState.DRAINING and rec.ray_node_id == "ab" * 28
    log = reg.transitions("gpu-01")
    assert [(t.from_state, t.to_state, t.actor, t.reason) for t in log] == [
        (None, NodeState.PENDING, "alice", "new node"),
        (NodeState.PENDING, NodeState.ONLINE, "argus", "joined"),
        (NodeState.ONLINE, NodeState.DRAINING, "bob", "xid 79"),
    ]
    assert [t.at for t in log] == sorted(t.at for t in log)
    assert [r.name for r in reg.list()] == ["gpu-01"]


def test_memory_registry_refuses_duplicates_stale_moves_and_unknown_nodes() -> None:
    reg = MemoryNodeRegistry()
    spec = NodeSpec.parse(spec_data())
    reg.add(spec, actor="a", reason="r")
    with pytest.raises(InputError, match="already registered"):
        reg.add(spec, actor="a", reason="r")
    with pytest.raises(InputError, match="not online"):  # the node is pending: someone else moved it first
        reg.record_transition("gpu-01", NodeState.ONLINE, NodeState.DRAINING, actor="a", reason="r")
    with pytest.raises(InputError, match="cannot go from pending to draining"):
        reg.record_transition("gpu-01", NodeState.PENDING, NodeState.DRAINING, actor="a", reason="r")
    with pytest.raises(NotFound, match="gpu-02"):
        reg.get("gpu-02")
    assert reg.get("gpu-01").state is NodeState.PENDING
