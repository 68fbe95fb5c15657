"""Fixtures for the notification tests: a hand-moved clock anchored at now (platforms check signed timestamps
against their own clock), a sleep that advances it, the real Store on SQLite, and the five platforms played by real
local HTTP receivers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from argus.notify.delivery import deliver
from argus.notify.dispatcher import Dispatcher
from argus.notify.registry import build_channels
from argus.store.store import Store
from core.channels import ChannelConfig
from core.types import Action, ActionState, Category, Finding, Incident, Severity, Subject, SubjectKind
from tests.notify.platforms import Platform
from tests.store.conftest import db_url, pg_admin  # noqa: F401 - the store tests' SQLite/PostgreSQL fixtures
from tests.support import Clock

KINDS = ("feishu", "dingtalk", "wecom", "slack", "webhook")
SECRETS = {"feishu": "feishu-secret", "dingtalk": "SECdingtalk-secret", "webhook": "argus-secret"}
PUBLIC_URL = "https://argus.example:8600"


class Sleeps(list):
    """Records each wait and moves the clock by it, so backoff is real time for the code under test."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        self.clock.tick(seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime.now(timezone.utc))


@pytest.fixture
def sleeps(clock: Clock) -> Sleeps:
    return Sleeps(clock)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    yield s
    s.close()


@pytest.fixture
def platforms() -> Iterator[dict[str, Platform]]:
    started = {kind: Platform(kind, secret=SECRETS.get(kind)).start() for kind in KINDS}
    try:
        yield started
    finally:
        for p in started.values():
            p.receiver.stop()


def configs(platforms: dict[str, Platform], **overrides) -> list[ChannelConfig]:
    return [ChannelConfig(**{"kind": kind, "url": p.url, "name": kind, **({"secret": p.secret} if p.secret else {}),
                             **overrides.get(kind, {})})
            for kind, p in platforms.items()]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as c:
        yield c


@pytest.fixture
def make_dispatcher(store: Store, clock: Clock, sleeps: Sleeps, client: httpx.Client):
    def make(channel_configs: list[ChannelConfig], log=None, **kw) -> Dispatcher:
        kw.setdefault("group_window_s", 30.0)
        kw.setdefault("rate_per_minute", 60.0)
        kw.setdefault("public_url", PUBLIC_URL)
        return Dispatcher(build_channels(channel_configs), log or store, clock=clock, sleep=sleeps, client=client,
                          **kw)

    return make


# A real CUDA OOM line, from kerrj/lerf#73.
OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacty of "
       "23.65 GiB of which 1.66 GiB is free. Including non-PyTorch memory, this process has 20.81 GiB memory in use. "
       "Of the allocated memory 12.09 GiB is allocated by PyTorch, and 4.84 GiB is reserved by PyTorch but "
       "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
       "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def open_incident(
    store: Store, n: int = 0, *, summary: str = OOM,
    severity: Severity = Severity.CRITICAL, category: Category = Category.GPU_OOM, attrs: dict | None = None,
) -> Incident:
    finding = Finding(
        category=category, reason="CudaOutOfMemory", subject=Subject(kind=SubjectKind.JOB, id=f"raysubmit_{n:04d}"),
        summary=summary, severity=severity,
        attrs=attrs if attrs is not None else {"submission_id": f"raysubmit_{n:04d}", "owner": "alice",
                                               "node_ip": "10.0.0.3"},
    )
    incident, created = store.record_finding(finding)
    assert created
    return incident


def send(platform: Platform, item, clock: Clock, sleeps: Sleeps, client: httpx.Client) -> dict:
    """Deliver `item` through a channel of `platform`'s kind to its real local receiver; the body it received."""
    config = ChannelConfig(kind=platform.kind, url=platform.url, **({"secret": platform.secret} if platform.secret
                                                                    else {}))
    outcome = deliver(build_channels([config])[0], item, client=client, clock=clock, sleep=sleeps)
    assert outcome.ok, (outcome, platform.problems)
    return platform.receiver.received[-1]["body"]


# What remediation says about a job it cannot bring back (remediation/actions.py `_source_of`), word for word.
CANNOT_RESUBMIT = ("job raysubmit_AbCdEf123456 cannot be resubmitted safely: its runtime_env package "
                   "gcs://_ray_pkg_0123456789abcdef.zip is gone from the GCS (Ray drops a package once no job uses "
                   "it); submit it again with `ray job submit --working-dir`")
FROM_CHECKPOINT = ("would resubmit grpo-7 as grpo-7-r1 from checkpoint global_step_40 (step 40), given as verl "
                   "overrides trainer.resume_mode=resume_path trainer.resume_from_path=/ckpt/global_step_40")


def step(kind: str, *, state: ActionState = ActionState.PLANNED, message: str | None = None,
         preview: str | None = None, dry_run: bool = True, n: int = 0) -> Action:
    """A remediation step as the PLANNED event carries it: its preview, or its outcome's message once final."""
    result: dict = {"step": n}
    if preview is not None:
        result["preview"] = preview
    if message is not None:
        result["message"] = message
    return Action(id=f"act-{n:012d}", incident_id="inc-000000000001", kind=kind,
                  target=Subject(kind=SubjectKind.JOB, id="grpo-7"), state=state,
                  idempotency_key=f"inc-000000000001:policy:{n}:{kind}", requested_by="policy", dry_run=dry_run,
                  result=result)
