"""One typed Settings object, validated at start.

Sources, highest first: keyword arguments, `ARGUS_*` environment variables, a YAML file (the path in
`ARGUS_CONFIG` or passed to `load_settings`), then defaults. A bad value is a ConfigError that names the
field, the value's source and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from core.channels import ChannelConfig
from core.errors import ConfigError

ENV_PREFIX = "ARGUS_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # where Argus keeps its own state
    data_dir: Path = Field(default=Path.home() / ".argus", description="SQLite file, logs, offsets")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/argus.db"
    )
    shared_root: Path = Field(default=Path("/mnt/shared"), description="NFS root with jobs/<submission_id>/")

    # what Argus watches
    ray_dashboard_url: str = Field(default="http://127.0.0.1:8265", description="Ray dashboard / Jobs API")
    prometheus_url: str | None = Field(default=None, description="Prometheus base URL; None: not used")
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    collect_timeout_s: float = Field(
        default=60.0, ge=1, le=3600, description="how long a tick waits for one collector before calling it stuck "
        "(a hung NFS read) and going on without it")

    # the loop
    poll_interval_s: float = Field(default=5.0, gt=0, le=3600)
    history_window_s: float = Field(
        default=900.0, gt=0, description="a line found in a log Argus reads for the first time, written longer "
        "ago than this, is history and opens no incident (lost nodes and failed jobs have their own lookback)"
    )
    lost_node_lookback_s: float = Field(
        default=3600.0, ge=0, description="a node that died longer ago than this at start is history"
    )
    stall_min_s: float = Field(default=60.0, gt=0, description="never call a job stalled before this")
    stall_factor: float = Field(default=3.0, ge=1, description="stalled after this many of its own step times")
    stall_suspect_s: float = Field(
        default=20.0, gt=0,
        description="a job silent this long (and factor x its step time) is suspected: its ranks' stacks, sampled "
        "twice, confirm a hang at once or show silent work that holds the call back")
    training_rules: Path | None = Field(
        default=None, description="the training-health rules and series allow-list (YAML, the shape of "
        "detectors/training.yaml); None: the built-in ones")
    train_metric_series_per_job: int = Field(
        default=24, ge=1, le=200, description="at most this many training-metric series per job are kept and exported")
    hang_stacks: bool = Field(
        default=True,
        description="sample the stacks of suspected jobs through Ray's dashboard (needs "
        "RAY_DASHBOARD_ENABLE_PROFILING=1 on the head and py-spy on the nodes); off: hangs are called by silence "
        "alone, after stall_min_s")
    idle_gpu_threshold_pct: float = Field(default=5.0, ge=0, le=100, description="GPU busy below this is idle")
    idle_gpu_window_s: float = Field(default=600.0, gt=0, description="idle this long while held: a finding")
    pending_alert_s: float = Field(
        default=300.0, gt=0, description="a job PENDING this long (its driver not started), or a RUNNING job whose "
        "placement groups stay unplaced this long, is a finding (unschedulable) that names what it waits for and "
        "what the cluster has free; counted from Ray's submission time (a group's creation request)"
    )
    dcgm_targets: list[str] = Field(
        default_factory=list, description="dcgm-exporter URLs scraped directly when no Prometheus is configured"
    )
    nvml: bool = Field(default=False, description="read this host's GPUs through NVML when no exporter is set")
    nvml_hostname: str | None = Field(default=None, description="Hostname label for NVML series (the Ray node)")
    kernel_log: str = Field(
        default="off",
        description="this host's kernel log (Xid, NVRM, AER, InfiniBand, OOM killer): 'off', 'auto' (/dev/kmsg, "
        "journalctl -k, kern.log) or a file's path",
    )
    node_agents: bool = Field(
        default=False,
        description="run an Argus agent on every Ray node (a Ray job of detached actors; argus/agents): nodes' logs "
        "and kernel logs are read where they are written and only what matters is sent here",
    )
    node_agent_url: str | None = Field(
        default=None, description="this Argus's URL as the nodes reach it; default: http://<primary IP>:<api_port>"
    )
    node_agent_interval_s: float = Field(default=1.0, gt=0, le=60, description="how often each agent reads and sends")
    node_agent_kernel_log: str = Field(
        default="auto",
        description="what each agent reads as its node's kernel log: 'auto', 'off' or a path ({node_ip} and {node_id} "
        "in it are the agent's node's)",
    )
    node_agent_nvml: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="each agent reads its node's GPUs through NVML and sends dcgm-exporter's series: 'auto' does "
        "where no exporter is configured (no prometheus_url or dcgm_targets), 'on' always, 'off' never",
    )
    kernel_log_node_ip: str | None = Field(
        default=None, description="the Ray node IP this host's kernel log is about; default: its own primary IP"
    )
    rules_dirs: list[Path] = Field(default_factory=list, description="extra log-rule folders beside the built-in")
    metric_rules_dirs: list[Path] = Field(
        default_factory=list, description="extra metric-rule folders beside the built-in"
    )

    # the control plane
    ray_gcs_address: str | None = Field(
        default=None, description="host:port of the head's GCS that nodes join; None: node steps are off"
    )
    job_timeout_check_s: float = Field(default=30.0, gt=0, le=3600, description="how often job timeouts are enforced")
    job_queue_interval_s: float = Field(default=5.0, gt=0, le=600,
                                        description="how often the job queue looks for room to start queued jobs")
    job_queue_timeout_s: float | None = Field(
        default=None, gt=0, description="how long a job may wait in the queue before it expires; None: no limit"
    )
    user_gpu_limit: int | None = Field(
        default=None, ge=0, description="the most GPUs one user's running jobs may hold at once; None: no limit"
    )
    user_gpu_limits: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="per-user overrides of user_gpu_limit, e.g. {\"alice\": 16}"
    )
    job_code_roots: list[Path] = Field(
        default_factory=list, description="where a job's code_path and working_dir may be; default: shared_root"
    )
    node_ssh_key_dirs: list[Path] = Field(
        default_factory=list, description="where a node's ssh_key_path may be; default: <data_dir>/ssh"
    )

    # root-cause reports
    llm_base_url: str | None = Field(
        default=None, description="OpenAI-compatible server (vLLM, Ollama, llama-server, a gateway); None: no LLM"
    )
    llm_model: str = Field(default="qwen2.5-coder-1.5b", description="the model name the server knows")
    llm_api_key: SecretStr | None = Field(default=None, description="bearer key for the LLM server, if it needs one")
    llm_timeout_s: float = Field(default=120.0, gt=0, le=1800)
    llm_max_retries: int = Field(default=1, ge=0, le=5)
    llm_method: Literal["json_schema", "json_mode", "function_calling"] = Field(
        default="json_schema", description="how the server is asked for structured output"
    )
    rca_token_budget: int = Field(default=6000, ge=500, le=200_000, description="size of an evidence bundle")
    redact_patterns: list[str] = Field(default_factory=list, description="extra regexes whose matches are masked")
    redact_ips: bool = Field(default=False, description="replace IP addresses by stable pseudonyms in reports")
    redact_users: list[str] = Field(default_factory=list, description="user names replaced by pseudonyms")

    # remediation
    remediation_policy: Path | None = Field(default=None, description="policy YAML; default: the built-in one")
    remediation_mode: Literal["off", "dry-run", "approval", "auto"] | None = Field(
        default=None, description="overrides the policy file's mode"
    )
    remediation_interval_s: float = Field(default=2.0, gt=0, le=600, description="how often approved steps run")

    # who is told
    notify_channels: list[ChannelConfig] = Field(
        default_factory=list,
        description="IM groups and webhooks: kind feishu|dingtalk|wecom|slack|webhook, url, secret, name, "
        "min_severity, categories",
    )
    approval_link_ttl_s: float = Field(default=3600.0, gt=0, le=7 * 86400, description="how long approve links work")
    webhook_urls: list[str] = Field(default_factory=list, description="generic JSON webhooks for incidents")
    reopen_window_s: float = Field(
        default=1800.0, ge=0, description="a fault back this soon after its incident was resolved reopens that "
        "incident (counted) instead of opening a new one; 0: never reopen"
    )
    renotify_interval_s: float = Field(
        default=900.0, ge=0, description="IM messages about a reopened (flapping) incident: at most one per this "
        "long, later changes folded into the next; 0: no limit"
    )
    im_first_message_wait_s: float = Field(
        default=15.0, ge=0, le=60, description="a new incident's first IM message waits for its report and its "
        "plan (the steps waiting for approval) and tells all three in one; it leaves as soon as both are in, at the "
        "latest after this long; 0: each is told at once"
    )

    # the API
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8600, ge=1, le=65535)
    leader_election: bool = Field(
        default=False,
        description="run as one of several replicas sharing database_url (PostgreSQL): the replica holding a lease "
        "in the store runs the loop, chores and remediation, the others serve the API and take over when it lapses",
    )
    lease_ttl_s: float = Field(default=10.0, ge=3, le=300, description="how long the leader's lease lasts unrenewed")
    lease_renew_s: float = Field(default=2.0, gt=0, le=60, description="how often replicas take or renew the lease")
    replica_id: str | None = Field(default=None, max_length=128,
                                   description="this replica's name in the lease; default: <hostname>-<pid>")

    log_level: str = "INFO"

    def user_gpu_limit_of(self, user: str) -> int | None:
        """The most GPUs `user`'s running jobs may hold at once (user_gpu_limits, else user_gpu_limit)."""
        return self.user_gpu_limits.get(user, self.user_gpu_limit)

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in {"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v

    @field_validator("ray_dashboard_url", "prometheus_url", "llm_base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://head:8265")
        return v

    @field_validator("webhook_urls", "dcgm_targets")
    @classmethod
    def _webhooks(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} must start with http:// or https://")
        return v

    @field_validator("ray_gcs_address")
    @classmethod
    def _gcs(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("must be host:port of the Ray head's GCS, e.g. 10.0.0.1:6380")
        return v.strip()

    @property
    def agents_read_gpus(self) -> bool:
        """Whether node agents read their GPUs through NVML (see node_agent_nvml)."""
        if self.node_agent_nvml == "auto":
            return not (self.prometheus_url or self.dcgm_targets)
        return self.node_agent_nvml == "on"

    @property
    def effective_code_roots(self) -> list[Path]:
        return self.job_code_roots or [self.shared_root]

    @property
    def effective_ssh_key_dirs(self) -> list[Path]:
        return self.node_ssh_key_dirs or [self.data_dir / "ssh"]

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'argus.db'}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"settings file {path} does not exist", hint="fix the path in ARGUS_CONFIG or --config"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc}", hint="it must be UTF-8 YAML") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(
            f"settings file {path} is not valid YAML{where}: {problem}",
            hint="fix the YAML syntax; keys are Settings fields such as ray_dashboard_url",
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"settings file {path} must be a mapping of field: value, not {type(data).__name__}",
            hint="write e.g. 'ray_dashboard_url: http://head:8265'",
        )
    return data


def _env_overrides() -> set[str]:
    return {k[len(ENV_PREFIX):].lower() for k in os.environ if k.startswith(ENV_PREFIX)}


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build and validate the Settings; raise ConfigError naming the field, its source and the fix."""
    path = config_file or os.environ.get(f"{ENV_PREFIX}CONFIG")
    file_values = _read_yaml(Path(path)) if path else {}
    # The environment beats the file: only pass file values the environment does not set.
    env_keys = _env_overrides()
    init = {k: v for k, v in file_values.items() if k not in env_keys}
    init.update(overrides)
    try:
        return Settings(**init)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, set(file_values)), hint=_fix_hint(exc)) from None


# Settings whose values are credentials (a bot URL is one): an error names the field, never the value.
_SECRET_FIELDS = frozenset({"notify_channels", "llm_api_key"})


def _describe(exc: ValidationError, path: Any, file_keys: set[str]) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "?"
        top = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            origin = f"in {path}" if path and top in file_keys else "in the settings"
            parts.append(f"unknown setting '{field}' {origin}")
            continue
        if top in _env_overrides():
            origin = f"from {ENV_PREFIX}{top.upper()}"
        elif top in file_keys and path:
            origin = f"in {path}"
        else:
            origin = ""
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "a mapping"
        if top in _SECRET_FIELDS:
            shown = "(not shown: it may hold a credential)"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        parts.append(f"setting '{field}'{' ' + origin if origin else ''} = {shown}: {err['msg']}")
    return "invalid settings: " + "; ".join(parts)


def _fix_hint(exc: ValidationError) -> str:
    if any(e["type"] == "extra_forbidden" for e in exc.errors()):
        known = ", ".join(sorted(Settings.model_fields))
        return f"known settings are: {known}"
    return "correct the value(s) named above; `argus config show` prints the effective settings"
