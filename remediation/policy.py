"""Remediation policy as data: which incidents get which plan, in which mode, within which guards.

A policy file (YAML, see policies/default.yaml) has a mode, rules (the first that matches an incident gives
its steps) and guards. Loading validates everything at start: a bad policy stops Argus with the file, the
field and the fix, never at the moment a node should be drained.
"""

from __future__ import annotations

import fnmatch
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ConfigError
from core.types import Category, Incident, Severity

DEFAULT_POLICY = Path(__file__).parent / "policies" / "default.yaml"
ActionKind = Literal["keep_scene", "drain_node", "resubmit_job", "stop_job"]
ACTION_KINDS: tuple[ActionKind, ...] = ("keep_scene", "drain_node", "resubmit_job", "stop_job")
_SEVERITY_ORDER = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class Mode(str, Enum):
    OFF = "off"
    DRY_RUN = "dry-run"
    APPROVAL = "approval"
    AUTO = "auto"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_Strict):
    action: ActionKind
    params: dict[str, Any] = Field(default_factory=dict)


class Match(_Strict):
    categories: list[Category] = Field(min_length=1)
    min_severity: Severity = Severity.INFO


class Rule(_Strict):
    name: str = Field(min_length=1, max_length=80)
    match: Match
    steps: list[Step] = Field(min_length=1, max_length=10)
    mode: Mode | None = None  # overrides the policy's mode for this rule

    def matches(self, incident: Incident) -> bool:
        return (incident.category in self.match.categories
                and _SEVERITY_ORDER[incident.severity] >= _SEVERITY_ORDER[self.match.min_severity])


class Guards(_Strict):
    max_per_hour: dict[ActionKind, int] = Field(default_factory=lambda: {k: 10 for k in ACTION_KINDS})
    max_per_node_per_hour: int = Field(default=2, ge=0)
    min_drain_interval_s: float = Field(default=600, ge=0)
    max_drained_share: float = Field(default=0.25, ge=0, le=1)
    max_resubmits_per_job_per_day: int = Field(default=3, ge=0)
    resubmit_backoff_s: float = Field(default=30, ge=0)
    protected_nodes: list[str] = Field(default_factory=list)
    protected_jobs: list[str] = Field(default_factory=list)
    agent_may_approve: list[ActionKind] = Field(default=["keep_scene"])  # pydantic copies it per instance

    def node_protected(self, *names: str | None) -> bool:
        return any(n and n in self.protected_nodes for n in names)

    def job_protected(self, submission_id: str) -> bool:
        return any(fnmatch.fnmatchcase(submission_id, pattern) for pattern in self.protected_jobs)


class Policy(_Strict):
    mode: Mode = Mode.DRY_RUN
    rules: list[Rule] = Field(default_factory=list)
    guards: Guards = Field(default_factory=Guards)
    source: str = "built-in"

    def rule_for(self, incident: Incident) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(incident)), None)

    def mode_for(self, rule: Rule | None) -> Mode:
        return rule.mode if rule is not None and rule.mode is not None else self.mode


def load_policy(path: Path | str | None = None, *, mode: Mode | str | None = None) -> Policy:
    """The policy in `path` (default: the built-in one); `mode` overrides the file's mode."""
    path = Path(path) if path else DEFAULT_POLICY
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read remediation policy {path}: {exc.strerror or exc}",
                          hint="fix remediation_policy, or leave it unset for the built-in policy") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"remediation policy {path} is not valid YAML{where}", hint="fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"remediation policy {path} must be a mapping with mode, rules and guards",
                          hint=f"start from {DEFAULT_POLICY}")
    if mode is not None:
        data["mode"] = Mode(mode).value
    try:
        return Policy.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:10])
        raise ConfigError(f"invalid remediation policy {path}: {problems}",
                          hint=f"see {DEFAULT_POLICY} for every field, with comments") from None
