"""The same NodeRegistry checks against the in-memory registry and the database one on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from argus.store.columns import clean_text
from argus.store.nodes import SqlNodeRegistry
from argus.store.store import Store
from control.nodes import MemoryNodeRegistry, NodeRegistry, NodeSpec, NodeState
from core.errors import InputError, NotFound
from tests.store.conftest import Clock, _postgres_url

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx0lKrgl4iJKTxmz8S2S6w8V0Eg8C2Zl1Bn3rUqz0aE"
RAY_ID = "ab" * 28

# Reasons and actors come from API callers and remote logs: none of this may break or escape the store.
HOSTILE_TEXT = [
    "'; DROP TABLE nodes; --",
    "\" OR 1=1 --",
    "$(rm -rf /) `id` | tee /etc/passwd",
    "line one\nline two\r\n\ttabbed",
    "nul \x00 inside",
    "lone surrogate \ud800 here",
    "emoji 🔥 and RTL \u202e gnp.exe",
    "%s %d {0} {reason} \\x00 \\",
    "x" * 100_000,
    "",
]


def make_spec(name: str = "gpu-01", **over: Any) -> NodeSpec:
    data: dict[str, Any] = {
        "name": name,
        "host": "10.0.0.7",
        "ssh_user": "ray",
        "ssh_port": 2222,
        "ssh_key_path": "/etc/argus/id_ed25519",
        "host_key": HOST_KEY,
        "labels": {"argus.io/zone": "z1", "gpu-type": "H100"},
        "pool": "train",
        "gpus": 8,
        "resources": {"fast": 1, "nvlink": 0.5},
        "ray_temp_dir": "/tmp/ray-gpu01",
        "ray_ports": {"node_manager_port": 6380},
    }
    data.update(over)
    return NodeSpec.parse(data)


@dataclass
class Backend:
    registry: NodeRegistry
    clock: Clock
    # What a text reads back as: the database cleans NUL and lone surrogates (argus.store.models).
    stored: Callable[[str], str]
    # Another registry over the same data, as a restarted process would see it; None for memory.
    reopen: Callable[[], NodeRegistry] | None
    _closers: list[Callable[[], None]] = field(default_factory=list)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[Backend]:
    clock = Clock()
    if request.param == "memory":
        yield Backend(MemoryNodeRegistry(clock=clock), clock, lambda text: text, None)
        return
    if request.param == "sqlite":
        urls: Iterator[str] = iter([f"sqlite:///{tmp_path / 'state' / 'argus.db'}"])
    else:
        urls = _postgres_url(request)
    url = next(urls)
    stores: list[Store] = []

    def open_registry() -> NodeRegistry:
        stores.append(Store(url, clock=clock))
        return stores[-1].nodes()

    try:
        yield Backend(open_registry(), clock, clean_text, open_registry)
    finally:
        for s in stores:
            s.close()
        for _ in urls:  # drops the PostgreSQL database
            pass


def race(n: int, call: Callable[[int], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run call(0..n-1) in n threads released together; return what they returned and what they raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait(timeout=60)
        try:
            out = call(i)
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            with lock:
                errors.append(err)
        else:
            with lock:
                results.append(out)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results, errors


def test_it_is_a_node_registry_and_records_every_move_with_actor_reason_and_time(backend: Backend) -> None:
    reg = backend.registry
    assert isinstance(reg, NodeRegistry)
    spec = make_spec()
    added = reg.add(spec, actor="alice", reason="new node")
    assert added.state is NodeState.PENDING and added.spec == spec and added.ray_node_id is None
    assert added.updated_at == backend.clock.now
    backend.clock.tick()
    joined = reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="argus", reason="joined",
                                   ray_node_id=RAY_ID)
    assert joined.state is NodeState.ONLINE and joined.ray_node_id == RAY_ID
    backend.clock.tick()
    drained = reg.record_transition("gpu-01", NodeState.ONLINE, NodeState.DRAINING, actor="bob", reason="xid 79")
    assert drained.state is NodeState.DRAINING and drained.ray_node_id == RAY_ID  # kept when not given
    assert drained.updated_at == backend.clock.now and drained.spec == spec
    assert reg.get("gpu-01") == drained

    log = reg.transitions("gpu-01")
    assert [(t.node, t.from_state, t.to_state, t.actor, t.reason) for t in log] == [
        ("gpu-01", None, NodeState.PENDING, "alice", "new node"),
        ("gpu-01", NodeState.PENDING, NodeState.ONLINE, "argus", "joined"),
        ("gpu-01", NodeState.ONLINE, NodeState.DRAINING, "bob", "xid 79"),
    ]
    assert [t.at for t in log] == sorted(t.at for t in log) and log[-1].at == backend.clock.now
    assert all(t.at.tzinfo is not None for t in log)
    assert [r.name for r in reg.list()] == ["gpu-01"]


def test_duplicates_stale_and_illegal_moves_and_unknown_nodes_are_refused_without_a_trace(
    backend: Backend,
) -> None:
    reg = backend.registry
    reg.add(make_spec(), actor="a", reason="r")
    with pytest.raises(InputError, match="already registered"):
        reg.add(make_spec(host="10.0.0.8"), actor="a", reason="r")
    with pytest.raises(InputError, match="not online"):  # the node is pending: someone else moved it first
        reg.record_transition("gpu-01", NodeState.ONLINE, NodeState.DRAINING, actor="a", reason="r")
    with pytest.raises(InputError, match="cannot go from pending to draining"):
        reg.record_transition("gpu-01", NodeState.PENDING, NodeState.DRAINING, actor="a", reason="r")
    with pytest.raises(InputError, match="must keep the name"):
        reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="a", reason="r",
                              spec=make_spec("gpu-02"))
    with pytest.raises(NotFound, match="gpu-02"):
        reg.get("gpu-02")
    with pytest.raises(NotFound, match="gpu-02"):
        reg.record_transition("gpu-02", NodeState.PENDING, NodeState.ONLINE, actor="a", reason="r")
    assert reg.transitions("gpu-02") == []
    # Nothing refused above left a mark.
    assert reg.get("gpu-01").state is NodeState.PENDING and reg.get("gpu-01").spec.host == "10.0.0.7"
    assert len(reg.transitions("gpu-01")) == 1 and [r.name for r in reg.list()] == ["gpu-01"]


def test_a_move_may_replace_the_spec_and_a_node_goes_round_its_lifecycle(backend: Backend) -> None:
    reg = backend.registry
    reg.add(make_spec(), actor="a", reason="r")
    bigger = make_spec(gpus=16, labels={"gpu-type": "H200"}, resources={"fast": 2})
    rec = reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="a", reason="join",
                                ray_node_id=RAY_ID, spec=bigger)
    assert rec.spec == bigger and reg.get("gpu-01").spec == bigger
    path = [NodeState.OFFLINE, NodeState.PENDING, NodeState.FAILED, NodeState.OFFLINE]
    current = NodeState.ONLINE
    for target in path:
        rec = reg.record_transition("gpu-01", current, target, actor="a", reason=f"to {target.value}")
        current = target
    assert rec.state is NodeState.OFFLINE and rec.ray_node_id == RAY_ID
    assert [t.to_state for t in reg.transitions("gpu-01")] == [NodeState.PENDING, NodeState.ONLINE, *path]


def test_nodes_are_listed_by_name_in_python_order_and_kept_apart(backend: Backend) -> None:
    reg = backend.registry
    names = ["gpu.2", "gpu-10", "a1", "a.1", "a-1", "gpu-9", "b"]
    for name in names:
        reg.add(make_spec(name), actor="a", reason=name)
    assert [r.name for r in reg.list()] == sorted(names)
    reg.record_transition("gpu-9", NodeState.PENDING, NodeState.ONLINE, actor="a", reason="r")
    assert reg.get("gpu-10").state is NodeState.PENDING
    assert [t.reason for t in reg.transitions("gpu.2")] == ["gpu.2"]


@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=range(len(HOSTILE_TEXT)))
def test_hostile_reasons_and_actors_are_stored_as_text(backend: Backend, text: str) -> None:
    reg = backend.registry
    reg.add(make_spec(), actor=text, reason=text)
    reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor=text, reason=text)
    log = reg.transitions("gpu-01")
    assert [(t.actor, t.reason) for t in log] == [(backend.stored(text), backend.stored(text))] * 2
    assert "\x00" not in log[0].reason or backend.reopen is None
    reg.add(make_spec("gpu-02"), actor="a", reason="the tables are still there")
    assert [r.name for r in reg.list()] == ["gpu-01", "gpu-02"]


def test_of_threads_moving_a_node_from_the_same_state_exactly_one_wins(backend: Backend) -> None:
    reg = backend.registry
    reg.add(make_spec(), actor="a", reason="r")
    n = 8
    results, errors = race(n, lambda i: reg.record_transition(
        "gpu-01", NodeState.PENDING, NodeState.ONLINE, actor=f"worker-{i}", reason=f"join {i}",
        ray_node_id=f"{i:056x}"))
    assert len(results) == 1 and len(errors) == n - 1
    assert all(isinstance(e, InputError) and "not pending" in e.message for e in errors), errors
    winner = results[0]
    log = reg.transitions("gpu-01")
    assert len(log) == 2 and log[1].actor == f"worker-{int(winner.ray_node_id, 16)}"
    assert reg.get("gpu-01") == winner

    # Again from the new state, with threads asking for different targets: still one winner.
    targets = [NodeState.DRAINING, NodeState.OFFLINE, NodeState.FAILED] * 2
    results, errors = race(len(targets), lambda i: reg.record_transition(
        "gpu-01", NodeState.ONLINE, targets[i], actor=f"w{i}", reason="r"))
    assert len(results) == 1 and all(isinstance(e, InputError) for e in errors)
    assert reg.get("gpu-01").state is results[0].state and len(reg.transitions("gpu-01")) == 3


def test_of_threads_registering_one_name_exactly_one_wins(backend: Backend) -> None:
    reg = backend.registry
    n = 6
    results, errors = race(n, lambda i: reg.add(make_spec(gpus=i), actor=f"w{i}", reason="r"))
    assert len(results) == 1 and len(errors) == n - 1
    assert all(isinstance(e, InputError) and "already registered" in e.message for e in errors), errors
    assert reg.get("gpu-01").spec.gpus == results[0].spec.gpus
    assert len(reg.transitions("gpu-01")) == 1


# ---- the database registry only --------------------------------------------------------------------------


def test_nodes_and_their_history_survive_a_restart(backend: Backend) -> None:
    if backend.reopen is None:
        pytest.skip("the memory registry forgets everything by design")
    reg = backend.registry
    reg.add(make_spec(), actor="alice", reason="new")
    backend.clock.tick()
    reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="argus", reason="joined",
                          ray_node_id=RAY_ID)
    again = backend.reopen()
    assert isinstance(again, SqlNodeRegistry)
    assert again.get("gpu-01") == reg.get("gpu-01")
    assert again.transitions("gpu-01") == reg.transitions("gpu-01")
    assert again.get("gpu-01").spec == make_spec()


def test_an_overlong_ray_node_id_is_refused_before_it_reaches_the_database(backend: Backend) -> None:
    if backend.reopen is None:
        pytest.skip("memory has no column width")
    reg = backend.registry
    reg.add(make_spec(), actor="a", reason="r")
    with pytest.raises(InputError, match="too long"):
        reg.record_transition("gpu-01", NodeState.PENDING, NodeState.ONLINE, actor="a", reason="r",
                              ray_node_id="f" * 500)
    assert reg.get("gpu-01").state is NodeState.PENDING
