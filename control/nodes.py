"""GPU nodes managed over SSH: what a node is (NodeSpec), its lifecycle (NodeState) and where both are kept.

Every string in a NodeSpec ends up in a command line on a remote host, so the spec is strict: each field
accepts only a narrow alphabet (no shell metacharacters, whitespace, control or non-ASCII characters)
and a bounded length. Commands are built from validated specs only (control/commands.py).

One module past 400 lines on purpose: the spec's validation, the state machine and the registries that keep
both must agree on every field and transition; split, each would re-spell the others' rules.
"""

from __future__ import annotations

import builtins
import ipaddress
import re
import threading
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import JsonDict, JsonValue

from core.errors import Conflict, InputError, NotFound
from core.ray_labels import POOL_LABEL
from core.types import WholeNumber, utcnow

NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?")
_HOSTNAME_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Absolute paths of plain segments: enough for /tmp/ag-x/w5 and /opt/venv/bin/ray, nothing a shell expands.
_PATH_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127}")
_MAX_PATH = 200
# Ray's own label syntax (ray/_private/label_utils.py): Kubernetes-style name, optional DNS prefix.
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_RESOURCE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")
_RESERVED_LABEL_PREFIXES = ("ray.io/",)
MAX_GPUS = 16
MAX_LABELS = 32


def _ascii_only(value: str, what: str) -> None:
    # Unicode look-alikes (fullwidth semicolon, Cyrillic 'а') would pass a naive check and confuse a reader.
    if not value.isascii():
        raise ValueError(f"{what} must be plain ASCII, got {value!r}")


def check_name(value: str) -> str:
    _ascii_only(value, "a node name")
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            f"node name {value!r} is invalid: use 1-63 lowercase letters, digits, '.' or '-', "
            "starting and ending with a letter or digit"
        )
    return value


def check_user(value: str) -> str:
    _ascii_only(value, "an SSH user")
    if not USER_RE.fullmatch(value):
        raise ValueError(f"SSH user {value!r} is invalid: a POSIX user name such as 'root' or 'ray'")
    return value


def check_host(value: str) -> str:
    """An IPv4/IPv6 address or a DNS host name; nothing else reaches ssh or Ray."""
    _ascii_only(value, "a host")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value.rstrip(".").split(".") if value else []
    if not labels or len(value) > 253 or not all(_HOSTNAME_LABEL_RE.fullmatch(part) for part in labels):
        raise ValueError(f"host {value!r} is neither an IP address nor a valid host name")
    if all(part.isdigit() for part in labels):
        raise ValueError(f"host {value!r} looks like an IP address but is not a valid one")
    return value.rstrip(".")


def check_ip(value: str) -> str:
    _ascii_only(value, "an IP address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 or IPv6 address") from None


def check_abs_path(value: str) -> str:
    _ascii_only(value, "a path")
    segments = value.split("/")
    if (
        len(value) > _MAX_PATH
        or not value.startswith("/")
        or value == "/"
        or not all(_PATH_SEGMENT_RE.fullmatch(s) for s in segments[1:])
        or any(s in {".", ".."} for s in segments)
    ):
        raise ValueError(
            f"path {value!r} is invalid: use an absolute path of letters, digits, '_', '.' and '-' "
            f"segments (no '..', at most {_MAX_PATH} characters)"
        )
    return value


def check_program(value: str) -> str:
    """A program name looked up on the remote PATH ('ray') or an absolute path to it."""
    if value.startswith("/"):
        return check_abs_path(value)
    _ascii_only(value, "a program name")
    if not _PATH_SEGMENT_RE.fullmatch(value):
        raise ValueError(f"program {value!r} is invalid: a plain name such as 'ray' or an absolute path")
    return value


def check_label_key(key: str) -> str:
    _ascii_only(key, "a label key")
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(_HOSTNAME_LABEL_RE.fullmatch(p) for p in prefix.split("."))):
        raise ValueError(f"label key {key!r} has an invalid prefix: it must be a DNS name like 'example.com'")
    if not _LABEL_NAME_RE.fullmatch(name):
        raise ValueError(
            f"label key {key!r} is invalid: 1-63 letters, digits, '_', '.' or '-', starting and ending "
            "with a letter or digit, optionally after a DNS prefix and '/'"
        )
    if key.startswith(_RESERVED_LABEL_PREFIXES):
        raise ValueError(f"label key {key!r} uses the prefix 'ray.io/', which Ray reserves for itself")
    return key


def check_label_value(value: str) -> str:
    _ascii_only(value, "a label value")
    if value and not _LABEL_NAME_RE.fullmatch(value):
        raise ValueError(
            f"label value {value!r} is invalid: up to 63 letters, digits, '_', '.' or '-', "
            "starting and ending with a letter or digit"
        )
    return value


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, got {len(labels)}")
    return {check_label_key(k): check_label_value(v) for k, v in labels.items()}


def check_resource_name(name: str) -> str:
    _ascii_only(name, "a resource name")
    if not _RESOURCE_RE.fullmatch(name) or name in {"CPU", "GPU", "memory", "object_store_memory"}:
        raise ValueError(
            f"resource name {name!r} is invalid: 1-63 letters, digits, '_', '.' or '-' starting with a "
            "letter, and not one of Ray's built-in CPU, GPU, memory, object_store_memory"
        )
    return name


def check_resources(resources: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not 0 <= amount <= 1_000_000:
            raise ValueError(f"resource {name!r} must be a number between 0 and 1000000, got {amount!r}")
        out[check_resource_name(name)] = amount
    return out


_PUBKEY_RE = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|"
    r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]{16,8192}={0,3}"
)


_HOST_KEY_PATTERN = (r"^\s*(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|"
                     r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com)\s+[A-Za-z0-9+/]{16,8192}={0,3}"
                     r"(\s[\s\S]*)?$")


def check_host_key(value: str) -> str:
    """The pinned public key line "<type> <base64>" (an optional trailing comment is dropped)."""
    parts = value.strip().split()
    key = " ".join(parts[:2])
    if len(parts) < 2 or not _PUBKEY_RE.fullmatch(key):
        raise ValueError(
            "host_key must be the host's public key line, e.g. 'ssh-ed25519 AAAAC3Nza...' "
            "(from /etc/ssh/ssh_host_ed25519_key.pub on the node or `ssh-keyscan`)"
        )
    return key


# The same rules as the checks above, spelt as JSON Schema for the API's OpenAPI document: a client generated from
# it sends only what the checks accept (the API's contract test generates bodies from these and sends them).
NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$"
_DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ABS_PATH = r"(?!.*/\.\.?(/|$))(/[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127})+"
_IP_SCHEMA: list[JsonValue] = [{"format": "ipv4"}, {"format": "ipv6"}]
HOST_SCHEMA: JsonDict = {"anyOf": [*_IP_SCHEMA, {"pattern": rf"^(?![0-9.]*$){_DNS_LABEL}(\.{_DNS_LABEL})*\.?$",
                                      "maxLength": 253}]}
ABS_PATH_SCHEMA: JsonDict = {"pattern": f"^{_ABS_PATH}$", "maxLength": _MAX_PATH}
RESOURCE_NAME_PATTERN = r"^(?!(CPU|GPU|memory|object_store_memory)$)[A-Za-z][A-Za-z0-9_.-]{0,62}$"
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"


def _schema(extra: JsonDict) -> Any:
    return Field(json_schema_extra=extra)


Name = Annotated[str, AfterValidator(check_name), _schema({"pattern": NAME_PATTERN})]
Host = Annotated[str, AfterValidator(check_host), _schema(HOST_SCHEMA)]
IpAddress = Annotated[str, AfterValidator(check_ip), _schema({"anyOf": _IP_SCHEMA})]
AbsPath = Annotated[str, AfterValidator(check_abs_path), _schema(ABS_PATH_SCHEMA)]
_LABELS_SCHEMA: JsonDict = {
    "maxProperties": MAX_LABELS,
    "propertyNames": {"pattern": rf"^(?!ray\.io/)({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{LABEL_VALUE_PATTERN[1:-1]}$"},
    "additionalProperties": {"type": "string", "pattern": f"^({LABEL_VALUE_PATTERN[1:-1]})?$"},
}
_RESOURCES_SCHEMA: JsonDict = {"propertyNames": {"pattern": RESOURCE_NAME_PATTERN},
                     "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1_000_000}}
Port = Annotated[int, Field(ge=1, le=65535, strict=True), WholeNumber]


class RayPorts(BaseModel):
    """Ports a Ray node binds on every interface; set them when several Ray nodes share one host."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    metrics_export_port: Port | None = None
    dashboard_agent_listen_port: Port | None = None
    dashboard_agent_grpc_port: Port | None = None
    runtime_env_agent_port: Port | None = None
    node_manager_port: Port | None = None
    object_manager_port: Port | None = None


class NodeSpec(BaseModel):
    """A GPU node Argus reaches over SSH and joins to the Ray cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: Name
    host: Host = Field(description="where sshd listens: IP address or DNS name")
    ssh_user: Annotated[str, AfterValidator(check_user), _schema({"pattern": r"^[a-z_][a-z0-9_-]{0,31}$"})] = "root"
    ssh_port: Port = 22
    ssh_key_path: AbsPath = Field(description="private key Argus logs in with")
    host_key: Annotated[str, AfterValidator(check_host_key), _schema({"pattern": _HOST_KEY_PATTERN})] = Field(
        description="the node's pinned SSH host public key; any other key is refused"
    )
    node_ip: IpAddress | None = Field(
        default=None, description="Ray's --node-ip-address; default: host, when host is an IP address"
    )
    labels: Annotated[dict[str, str], AfterValidator(check_labels), _schema(_LABELS_SCHEMA)] = Field(
        default_factory=dict)
    pool: Name | None = Field(
        default=None, description=f"join labels the node {POOL_LABEL}=<pool>; a JobSpec naming the pool lands there"
    )
    gpus: Annotated[int, Field(ge=0, le=MAX_GPUS), WholeNumber] = 0
    cpus: Annotated[int, Field(ge=0, le=1024), WholeNumber] | None = None
    resources: Annotated[dict[str, float], AfterValidator(check_resources), _schema(_RESOURCES_SCHEMA)] = Field(
        default_factory=dict, description="extra custom Ray resources besides 'worker' (the pool is a label)"
    )
    ray_bin: Annotated[str, AfterValidator(check_program), _schema(
        {"pattern": rf"^({_ABS_PATH}|[A-Za-z0-9_.][A-Za-z0-9_.-]{{0,127}})$", "maxLength": _MAX_PATH})] = "ray"
    ray_temp_dir: AbsPath | None = Field(
        default=None, json_schema_extra={"maxLength": 48},
        description="Ray's --temp-dir; set it on hosts running more than one Ray node, so offline stops "
        "only this node's processes instead of `ray stop` (every Ray process on the host)",
    )
    ray_ports: RayPorts = Field(default_factory=RayPorts)

    @field_validator("ray_temp_dir")
    @classmethod
    def _short_temp_dir(cls, v: str | None) -> str | None:
        # Ray puts unix sockets under <temp>/session_<timestamp>/sockets/; the path limit is 107 bytes.
        if v is not None and len(v) > 48:
            raise ValueError(f"ray_temp_dir {v!r} is too long for Ray's socket paths: keep it under 48 characters")
        return v

    @property
    def ray_node_ip(self) -> str:
        if self.node_ip is not None:
            return self.node_ip
        try:
            return str(ipaddress.ip_address(self.host))
        except ValueError:
            raise InputError(
                f"node {self.name} has host {self.host!r} and no node_ip",
                hint="set node_ip to the address Ray should advertise for this node",
            ) from None

    @classmethod
    def parse(cls, data: object) -> NodeSpec:
        """Validate untrusted input (an API body, a YAML file); raise InputError naming every bad field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in exc.errors()
            )
            raise InputError(f"invalid node spec: {problems}", hint="fix the fields named above") from None


class NodeState(str, Enum):
    PENDING = "pending"
    ONLINE = "online"
    DRAINING = "draining"
    OFFLINE = "offline"
    FAILED = "failed"


# draining -> online is "undrain"; offline/failed -> pending is "register again before a new join".
_ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    NodeState.PENDING: frozenset({NodeState.ONLINE, NodeState.OFFLINE, NodeState.FAILED}),
    NodeState.ONLINE: frozenset({NodeState.DRAINING, NodeState.OFFLINE, NodeState.FAILED}),
    NodeState.DRAINING: frozenset({NodeState.ONLINE, NodeState.OFFLINE, NodeState.FAILED}),
    NodeState.OFFLINE: frozenset({NodeState.PENDING, NodeState.FAILED}),
    NodeState.FAILED: frozenset({NodeState.PENDING, NodeState.OFFLINE}),
}


def allowed_targets(current: NodeState) -> frozenset[NodeState]:
    return _ALLOWED[current]


def transition(current: NodeState, target: NodeState) -> NodeState:
    """Return `target` when the move is legal; raise InputError naming the moves that are."""
    if target not in _ALLOWED[current]:
        legal = ", ".join(sorted(s.value for s in _ALLOWED[current]))
        raise Conflict(
            f"a node cannot go from {current.value} to {target.value}",
            hint=f"from {current.value} it can go to: {legal}",
        )
    return target


class Transition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    from_state: NodeState | None  # None: the node was registered
    to_state: NodeState
    actor: str
    reason: str
    at: datetime


class NodeRecord(BaseModel):
    """A registered node: its spec, its state and what Ray calls it once joined."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: NodeSpec
    state: NodeState
    ray_node_id: str | None = None
    updated_at: datetime

    @property
    def name(self) -> str:
        return self.spec.name


@runtime_checkable
class NodeRegistry(Protocol):
    """Where nodes and their transitions are kept. The application implements it over its database."""

    def get(self, name: str) -> NodeRecord:
        """The node's record; NotFound when no node has that name."""
        ...

    def list(self) -> list[NodeRecord]: ...

    def add(self, spec: NodeSpec, *, actor: str, reason: str) -> NodeRecord:
        """Register a new node in state pending; InputError when the name is taken."""
        ...

    def record_transition(
        self,
        name: str,
        from_state: NodeState,
        to_state: NodeState,
        *,
        actor: str,
        reason: str,
        ray_node_id: str | None = None,
        spec: NodeSpec | None = None,
    ) -> NodeRecord:
        """Move the node if it is still in `from_state` (InputError otherwise, or for an illegal move) and
        record who did it and why; `ray_node_id` and `spec` replace the stored ones when given."""
        ...

    def transitions(self, name: str) -> builtins.list[Transition]: ...


def name_taken(name: str, state: str | None) -> Conflict:
    """The error every NodeRegistry raises when a name is registered twice."""
    where = f" (state {state})" if state is not None else ""
    return Conflict(
        f"a node named {name!r} is already registered{where}",
        hint="pick another name, or take the node offline and register it again",
    )


def check_move(name: str, current: str | None, from_state: NodeState, spec: NodeSpec | None) -> None:
    """The compare-and-set rules every NodeRegistry applies before a move: the node exists, it is still
    in `from_state` (`current` is its stored state's value), and a new spec keeps its name."""
    if current is None:
        raise NotFound(f"no node named {name!r} is registered", hint="register it first")
    if current != from_state.value:
        raise Conflict(
            f"node {name} is {current}, not {from_state.value}: another change came first",
            hint="read the node again and retry",
        )
    if spec is not None and spec.name != name:
        raise InputError(f"node {name}: a new spec must keep the name, got {spec.name!r}")


class MemoryNodeRegistry:
    """A NodeRegistry in memory, for the library's own use and tests. It forgets everything on exit."""

    def __init__(self, clock: Callable[[], datetime] = utcnow) -> None:
        self._clock = clock
        self._nodes: dict[str, NodeRecord] = {}
        self._log: list[Transition] = []
        self._lock = threading.Lock()

    def get(self, name: str) -> NodeRecord:
        with self._lock:
            if name not in self._nodes:
                raise NotFound(f"no node named {name!r} is registered", hint="register it first, or list nodes")
            return self._nodes[name]

    def list(self) -> list[NodeRecord]:
        with self._lock:
            return [self._nodes[n] for n in sorted(self._nodes)]

    def add(self, spec: NodeSpec, *, actor: str, reason: str) -> NodeRecord:
        with self._lock:
            if spec.name in self._nodes:
                raise name_taken(spec.name, self._nodes[spec.name].state.value)
            now = self._clock()
            record = NodeRecord(spec=spec, state=NodeState.PENDING, updated_at=now)
            self._nodes[spec.name] = record
            self._log.append(Transition(node=spec.name, from_state=None, to_state=NodeState.PENDING,
                                        actor=actor, reason=reason, at=now))
            return record

    def record_transition(
        self,
        name: str,
        from_state: NodeState,
        to_state: NodeState,
        *,
        actor: str,
        reason: str,
        ray_node_id: str | None = None,
        spec: NodeSpec | None = None,
    ) -> NodeRecord:
        transition(from_state, to_state)
        with self._lock:
            current = self._nodes.get(name)
            check_move(name, None if current is None else current.state.value, from_state, spec)
            assert current is not None
            now = self._clock()
            record = current.model_copy(update={
                "state": to_state,
                "updated_at": now,
                "ray_node_id": ray_node_id if ray_node_id is not None else current.ray_node_id,
                "spec": spec if spec is not None else current.spec,
            })
            self._nodes[name] = record
            self._log.append(Transition(node=name, from_state=from_state, to_state=to_state,
                                        actor=actor, reason=reason, at=now))
            return record

    def transitions(self, name: str) -> builtins.list[Transition]:
        with self._lock:
            return [t for t in self._log if t.node == name]
