"""JobSpec: what a user asks the control plane to run, loaded from YAML, JSON or a dict and validated.

Names, ids, labels, paths and env keys become directory names, Ray metadata, label selectors and
PYTHONPATH entries, so they are validated against narrow patterns. The entrypoint is a shell command the
user owns: its metacharacters are data, passed to Ray as is (Ray runs it with a shell, as `ray job
submit` does); only its size and NUL bytes are checked.

Files are refused by size before they are read, YAML anchors/aliases and duplicate keys are refused
(no "billion laughs", no silently overridden field), and error messages never repr a whole input.

One module past 400 lines on purpose: each field's check and its JSON Schema spelling (for the API's contract)
sit side by side, so they cannot drift apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import JsonDict, JsonValue

from control.nodes import NAME_PATTERN as POOL_NAME_PATTERN
from control.nodes import NAME_RE as POOL_NAME_RE
from control.nodes import RESOURCE_NAME_PATTERN, check_resource_name
from core.errors import InputError
from core.jobfolder import SUBMISSION_ID_RE
from core.ray_labels import POOL_LABEL
from core.types import WholeNumber

MAX_SPEC_BYTES = 256 * 1024
MAX_ENTRYPOINT_CHARS = 16 * 1024
MAX_ENV_VARS = 128
MAX_ENV_VALUE_CHARS = 32 * 1024
MAX_ENV_TOTAL_CHARS = 128 * 1024
MAX_LABELS = 32
MAX_RESOURCES = 32
MAX_RESOURCE_AMOUNT = 1_000_000
MAX_PATH_CHARS = 1024

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}\Z")
# POSIX-ish user names; the first character is never a dot, so ".." cannot be an owner (users/<owner>/).
OWNER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\Z")
RESUME_FLAG_RE = re.compile(r"^--?[A-Za-z][A-Za-z0-9_.-]{0,63}\Z")
ENV_KEY_RE = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")
# Label keys and values as Kubernetes and Ray node labels spell them: an optional DNS prefix, then a name.
_LABEL_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
LABEL_KEY_RE = re.compile(rf"^(?:[a-z0-9](?:[a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}\Z")
LABEL_VALUE_RE = re.compile(rf"^{_LABEL_NAME}\Z")
# Path characters: no ':' (the PYTHONPATH separator), no '$' (Ray expands $VAR in env values), no
# whitespace or control characters.
PATH_RE = re.compile(r"^/[A-Za-z0-9_.,+@/-]*\Z")
# Keys the controller sets itself or that would break the job's runtime: refused in `env`.
RESERVED_ENV_PREFIXES = ("RAY_", "ARGUS_")
RESERVED_ENV_KEYS = frozenset({"PYTHONPATH"})
# How specs written before the pool had one label key spelt it: `labels: {pool: <pool>}` meant the pool (the
# docs said so), so it still does; it is sent to Ray as POOL_LABEL, the key nodes joined into a pool carry.
OLD_POOL_KEY = "pool"

Workload = Literal["ppo", "grpo", "sft", "custom"]


def _check_path(value: str, field: str) -> str:
    if len(value) > MAX_PATH_CHARS:
        raise ValueError(f"is longer than {MAX_PATH_CHARS} characters")
    if not PATH_RE.match(value):
        raise ValueError(
            f"{field} must be an absolute path of letters, digits and _.,+@/- only (no ':', '$', spaces)"
        )
    if ".." in PurePosixPath(value).parts:
        raise ValueError(f"{field} must not contain '..' components")
    return value


def _check_label(key: str, value: str) -> None:
    if not LABEL_KEY_RE.match(key):
        raise ValueError(f"label key {_short(key)} must look like 'name' or 'prefix.example/name'")
    if key.startswith("ray.io/"):
        raise ValueError(f"label key {_short(key)} uses Ray's reserved prefix ray.io/")
    if not LABEL_VALUE_RE.match(value):
        raise ValueError(
            f"label value {_short(value)} for {key!r} must be 1-63 letters, digits, '_', '.', '-', "
            "starting and ending with a letter or digit"
        )


# The checks below spelt as JSON Schema, for the API's OpenAPI document (see control/nodes.py). Not spelt: the
# env's total size and that a pool said twice (pool and a pool label) names the same pool.
_PATH_SCHEMA: JsonDict = {"pattern": r"^(?!.*/\.\.(/|$))/[A-Za-z0-9_.,+@/-]*$", "maxLength": MAX_PATH_CHARS}
_NO_NUL = r"^[^\x00]*$"
_LABELS_SCHEMA: JsonDict = {
    "maxProperties": MAX_LABELS,
    "propertyNames": {"pattern": rf"^(?!ray\.io/)(?:[a-z0-9](?:[a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$"},
    "additionalProperties": {"type": "string", "pattern": f"^{_LABEL_NAME}$"},
    "properties": {key: {"type": "string", "pattern": POOL_NAME_PATTERN} for key in (POOL_LABEL, OLD_POOL_KEY)},
}
_POOL_IN_LABELS: JsonDict = {"anyOf": [{"required": [POOL_LABEL]}, {"required": [OLD_POOL_KEY]}]}
# The W&B environment Argus sets for a job with `wandb:` (control/jobs.py): the spec's env may not set these too.
WANDB_ENV_KEYS = frozenset({"WANDB_PROJECT", "WANDB_NAME", "WANDB_ENTITY", "WANDB_MODE", "WANDB_DIR", "WANDB_RUN_ID",
                            "WANDB_RUN_GROUP", "WANDB_BASE_URL"})

_WANDB_KEYS_SET: list[JsonValue] = [*sorted(WANDB_ENV_KEYS)]
_ONE_POOL_SCHEMA: JsonDict = {  # the pool is named in one place: `pool`, or one of the two label spellings
    "allOf": [
        {"properties": {"labels": {"not": {"required": [POOL_LABEL, OLD_POOL_KEY]}}}},
        {"if": {"required": ["pool"], "properties": {"pool": {"type": "string"}}},
         "then": {"properties": {"labels": {"not": _POOL_IN_LABELS}}}},
        # and W&B is said in one place: with `wandb:`, the env may not set what Argus sets from it
        {"if": {"required": ["wandb"], "properties": {"wandb": {"type": "object"}}},
         "then": {"properties": {"env": {"propertyNames": {"not": {"enum": _WANDB_KEYS_SET}}}}}},
    ],
}
_RESOURCES_SCHEMA: JsonDict = {"maxProperties": MAX_RESOURCES, "propertyNames": {"pattern": RESOURCE_NAME_PATTERN},
                     "additionalProperties": {"type": "number", "exclusiveMinimum": 0,
                                              "maximum": MAX_RESOURCE_AMOUNT}}
_ENV_SCHEMA: JsonDict = {
    "maxProperties": MAX_ENV_VARS,
    "propertyNames": {"pattern": r"^(?!RAY_|ARGUS_|PYTHONPATH$)[A-Z_][A-Z0-9_]{0,127}$"},
    "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_CHARS, "pattern": _NO_NUL},
}


_WANDB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# ASCII classes only: JSON Schema's \w is ASCII and the validator's Unicode, and the two must refuse alike
_WANDB_BASE_URL = r"^https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?(/[A-Za-z0-9_./-]{0,200})?$"

class WandbSpec(BaseModel):
    """Weights & Biases for a job: Argus sets its environment; the run's id is the submission id, its group the
    chain of resubmissions, and its files land in the job's folder (`wandb/`), offline runs included."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    project: str = Field(pattern=_WANDB_NAME)
    run_name: str | None = Field(default=None, pattern=_WANDB_NAME, description="default: the job's name")
    entity: str | None = Field(default=None, pattern=_WANDB_NAME, description="the team or user; names the run's URL")
    mode: Literal["offline", "online"] = Field(default="offline", description="offline: the run is kept in the "
                                               "job's folder, to `wandb sync` from a machine that reaches W&B")
    base_url: str | None = Field(default=None, pattern=_WANDB_BASE_URL,
                                 description="a self-hosted W&B server; default https://wandb.ai")

    def url(self, run_id: str) -> str | None:
        """Where the run is seen: online with an entity only (offline runs are synced later, by hand)."""
        if self.mode != "online" or self.entity is None:
            return None
        return f"{(self.base_url or 'https://wandb.ai').rstrip('/')}/{self.entity}/{self.project}/runs/{run_id}"


class JobSpec(BaseModel):
    """One job to submit. See the module docstring for what is validated and why."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, json_schema_extra=_ONE_POOL_SCHEMA)

    name: str = Field(description="short job name; the generated submission id starts with it",
                      json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$"})
    workload: Workload = "custom"
    entrypoint: str = Field(description="shell command Ray runs as the job driver, passed as is",
                            json_schema_extra={"pattern": r"^[^\x00]*[^\s\x00][^\x00]*$",
                                               "maxLength": MAX_ENTRYPOINT_CHARS})
    nnodes: Annotated[int, WholeNumber] = Field(default=1, ge=1, le=1024)
    gpus_per_node: Annotated[int, WholeNumber] = Field(default=0, ge=0, le=16)
    pool: str | None = Field(default=None, description=f"node pool: the driver lands on a node joined into it "
                             f"(Ray label {POOL_LABEL}); labels {{'pool': <pool>}} says the same",
                             json_schema_extra={"pattern": POOL_NAME_PATTERN})
    labels: dict[str, str] = Field(default_factory=dict, description="node labels the driver must land on",
                                   json_schema_extra=_LABELS_SCHEMA)
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources the driver asks "
                                        "for besides the controller's (a sliver of 'worker'): it lands on a node "
                                        "that has them, e.g. {'gpu-07': 0.001} for a node joined with that one",
                                        json_schema_extra=_RESOURCES_SCHEMA)
    code_path: str | None = Field(default=None, description="put first on PYTHONPATH", json_schema_extra=_PATH_SCHEMA)
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=_ENV_SCHEMA)
    working_dir: str | None = Field(default=None, description="the driver runs in this directory",
                                    json_schema_extra=_PATH_SCHEMA)
    timeout_s: float | None = Field(default=None, gt=0, description="stopped when it has run (or waited in Ray) "
                                    "this long since it started")
    queue_timeout_s: float | None = Field(default=None, gt=0, description="expires in the queue when its gang has "
                                          "not fitted within this long; default: the Argus setting")
    resume: bool = False
    checkpoint_dir: str | None = Field(default=None, description="where the trainer writes checkpoints, when "
                                       "not $ARGUS_JOB_DIR/checkpoints nor in its arguments: a resubmission "
                                       "resumes from the newest one there", json_schema_extra=_PATH_SCHEMA)
    resume_flag: str | None = Field(default=None, description="the trainer's argument that takes a checkpoint "
                                    "to resume from, e.g. --resume: a resubmission passes the newest one",
                                    json_schema_extra={"pattern": r"^--?[A-Za-z][A-Za-z0-9_.-]{0,63}$"})
    owner: str = Field(json_schema_extra={"pattern": r"^[a-z_][a-z0-9_.-]{0,31}$"})
    wandb: WandbSpec | None = Field(default=None, description="log the run to Weights & Biases (offline by default)")
    submission_id: str | None = Field(default=None,
                                      json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be 1-40 letters, digits, '_', '.', '-', starting with a letter or digit")
        return v

    @field_validator("owner")
    @classmethod
    def _owner(cls, v: str) -> str:
        if not OWNER_RE.match(v):
            raise ValueError("must be a user name: 1-32 of a-z 0-9 _ . -, starting with a letter or '_'")
        return v

    @field_validator("submission_id")
    @classmethod
    def _submission_id(cls, v: str | None) -> str | None:
        if v is not None and not SUBMISSION_ID_RE.match(v):
            raise ValueError("must be 1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit")
        return v

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a command, not empty")
        if len(v) > MAX_ENTRYPOINT_CHARS:
            raise ValueError(f"is longer than {MAX_ENTRYPOINT_CHARS} characters")
        if "\x00" in v:
            raise ValueError("must not contain NUL bytes")
        return v

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str | None) -> str | None:
        # Named as a node's pool is (control/nodes.py): a name no node can be joined into would wait forever.
        if v is not None and not POOL_NAME_RE.fullmatch(v):
            raise ValueError(
                "must be a pool name as nodes are joined into: 1-63 lowercase letters, digits, '.', '-', "
                "starting and ending with a letter or digit"
            )
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_LABELS:
            raise ValueError(f"has more than {MAX_LABELS} labels")
        for key, value in v.items():
            _check_label(key, value)
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        if len(v) > MAX_RESOURCES:
            raise ValueError(f"has more than {MAX_RESOURCES} resources")
        for name, amount in v.items():
            check_resource_name(name)  # as a node's are (control/nodes.py): Ray's CPU, GPU, memory are not custom
            if not 0 < amount <= MAX_RESOURCE_AMOUNT:  # also refuses NaN
                raise ValueError(f"resource {_short(name)} must be more than 0 and at most {MAX_RESOURCE_AMOUNT}")
        return v

    @field_validator("resume_flag")
    @classmethod
    def _resume_flag(cls, v: str | None) -> str | None:
        if v is not None and not RESUME_FLAG_RE.match(v):
            raise ValueError("must be a command-line flag such as --resume or --resume_from_checkpoint")
        return v

    @field_validator("code_path", "working_dir", "checkpoint_dir")
    @classmethod
    def _paths(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else _check_path(v, info.field_name)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"has more than {MAX_ENV_VARS} variables")
        total = 0
        for key, value in v.items():
            if not ENV_KEY_RE.match(key) or len(key) > 128:
                raise ValueError(f"key {_short(key)} must match [A-Z_][A-Z0-9_]* (at most 128 characters)")
            if key in RESERVED_ENV_KEYS:
                raise ValueError(f"key {key} is set by the controller: use code_path to extend PYTHONPATH")
            if key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"key {key} uses a reserved prefix ({', '.join(RESERVED_ENV_PREFIXES)})")
            if len(value) > MAX_ENV_VALUE_CHARS:
                raise ValueError(f"value of {key} is longer than {MAX_ENV_VALUE_CHARS} characters")
            if "\x00" in value:
                raise ValueError(f"value of {key} must not contain NUL bytes")
            total += len(key) + len(value)
        if total > MAX_ENV_TOTAL_CHARS:
            raise ValueError(f"is larger than {MAX_ENV_TOTAL_CHARS} characters in all")
        return v

    @model_validator(mode="after")
    def _wandb_vs_env(self) -> JobSpec:
        if self.wandb is not None:
            both = sorted(WANDB_ENV_KEYS & set(self.env))
            if both:
                raise ValueError(f"sets {', '.join(both)} in env and W&B with `wandb:`: say it once, in `wandb:` "
                                 "(Argus sets those variables from it)")
        return self

    @model_validator(mode="after")
    def _pool_vs_labels(self) -> JobSpec:
        named = {f"labels.{key}": self.labels[key] for key in (POOL_LABEL, OLD_POOL_KEY) if key in self.labels}
        if self.pool is not None:
            named = {"pool": self.pool, **named}
        if len(named) > 1:
            # said twice is refused even when the same: one place to read it, as the schema says (one of the three)
            said = ", ".join(f"{where}={value!r}" for where, value in named.items())
            what = "two pools" if len(set(named.values())) > 1 else "the pool twice"
            raise ValueError(f"names {what} ({said}): give the pool once, as pool: <name>")
        for where, value in named.items():
            if not POOL_NAME_RE.fullmatch(value):  # `pool` itself was checked by _pool; a label spelling was not
                raise ValueError(f"{where}={value!r} is not a pool name: pools are named as nodes are, "
                                 "1-63 lowercase letters, digits, '.', '-'")
        return self

    # -- derived -----------------------------------------------------------------------------------

    @property
    def pool_name(self) -> str | None:
        """The pool the job names: `pool`, or the same said as a label (`argus.io/pool`, or the older `pool`)."""
        return self.pool or self.labels.get(POOL_LABEL) or self.labels.get(OLD_POOL_KEY)

    @property
    def label_selector(self) -> dict[str, str]:
        """The node labels the driver must land on (Ray's entrypoint_label_selector): `labels`, with the pool
        under POOL_LABEL, the key join gives a node of that pool (control/node_manager.py)."""
        selector = {k: v for k, v in self.labels.items() if k not in (POOL_LABEL, OLD_POOL_KEY)}
        pool = self.pool_name
        if pool is not None:
            selector[POOL_LABEL] = pool
        return selector

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)

    # -- loading -----------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the job spec") -> JobSpec:
        """Validate `data`; InputError naming each bad field and `source`."""
        if not isinstance(data, dict):
            raise InputError(
                f"{source} must be a mapping of field: value, not {type(data).__name__}",
                hint="write e.g. 'name: demo', 'entrypoint: python train.py', 'owner: alice'",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(f"invalid job spec in {source}: {_describe(exc)}", hint=_hint(exc)) from None

    @classmethod
    def from_text(
        cls, text: str, fmt: Literal["yaml", "json"] = "yaml", *, source: str = "the job spec"
    ) -> JobSpec:
        """Parse YAML or JSON text, then validate it."""
        if len(text) > MAX_SPEC_BYTES:
            raise InputError(
                f"{source} is {len(text)} characters, over the {MAX_SPEC_BYTES} limit for a job spec",
                hint="a job spec is a few fields; put large data in files under code_path",
            )
        if fmt == "json":
            data = _parse_json(text, source)
        elif fmt == "yaml":
            data = _parse_yaml(text, source)
        else:
            raise InputError(f"unknown job spec format {fmt!r} for {source}", hint="use 'yaml' or 'json'")
        return cls.from_dict(data, source=source)

    @classmethod
    def load(cls, path: Path | str) -> JobSpec:
        """Load a .yaml/.yml/.json file, refusing it by size before reading it."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in {".yaml", ".yml", ".json"}:
            raise InputError(f"job spec file {path} must end in .yaml, .yml or .json", hint="rename it")
        try:
            size = path.stat().st_size
            if size > MAX_SPEC_BYTES:
                raise InputError(
                    f"job spec file {path} is {size} bytes, over the {MAX_SPEC_BYTES}-byte limit",
                    hint="a job spec is a few fields; put large data in files under code_path",
                )
            with path.open("rb") as fh:  # read one byte past the limit: the file may grow after stat
                raw = fh.read(MAX_SPEC_BYTES + 1)
        except FileNotFoundError:
            raise InputError(f"job spec file {path} does not exist", hint="check the path") from None
        except IsADirectoryError:
            raise InputError(
                f"job spec file {path} is a directory", hint="pass the spec file itself"
            ) from None
        except OSError as exc:
            raise InputError(
                f"cannot read job spec file {path}: {exc.strerror}", hint="check its permissions"
            ) from None
        if len(raw) > MAX_SPEC_BYTES:
            raise InputError(
                f"job spec file {path} is over the {MAX_SPEC_BYTES}-byte limit", hint="shorten it"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"job spec file {path} is not UTF-8 (byte {exc.start})", hint="save it as UTF-8"
            ) from None
        return cls.from_text(text, "json" if suffix == ".json" else "yaml", source=str(path))


# -- parsing ---------------------------------------------------------------------------------------


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader without anchors/aliases (exponential expansion) and with duplicate keys refused."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.MarkedYAMLError(
                problem="aliases (*name) are not allowed in a job spec", problem_mark=mark
            )
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise yaml.MarkedYAMLError(
                problem="anchors (&name) are not allowed in a job spec", problem_mark=event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.MarkedYAMLError(
                    problem="mapping keys must be plain values", problem_mark=key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.MarkedYAMLError(
                    problem=f"duplicate key {_short(key)}", problem_mark=key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InputError(
            f"{source} is not valid YAML{where}: {problem}", hint="fix the YAML syntax"
        ) from None
    except RecursionError:
        raise InputError(f"{source} is nested too deeply", hint="a job spec is a flat mapping") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {_short(key)}")
        out[key] = value
    return out


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source} is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            hint="fix the JSON syntax",
        ) from None
    except ValueError as exc:
        raise InputError(f"{source} is not a valid job spec: {exc}", hint="give each field once") from None
    except RecursionError:
        raise InputError(f"{source} is nested too deeply", hint="a job spec is a flat mapping") from None


# -- messages --------------------------------------------------------------------------------------


def _short(value: Any, limit: int = 60) -> str:
    """A bounded repr of a scalar; containers are named by type (their repr can be huge)."""
    if isinstance(value, (dict, list, tuple, set)):
        return f"a {type(value).__name__}"
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=True):
        field = ".".join(str(p) for p in err["loc"]) or "(spec)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{field}'")
        elif err["type"] == "missing":
            parts.append(f"field '{field}' is required")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"field '{field}' = {_short(err.get('input'))}: {msg}")
    return "; ".join(parts)


def _hint(exc: ValidationError) -> str:
    if any(e["type"] == "extra_forbidden" for e in exc.errors()):
        return f"known fields are: {', '.join(JobSpec.model_fields)}"
    return "correct the field(s) named above"
