"""Argus's own CLI as a process of its own, for benchmarks and tests that drive a real `argus serve`: the command,
an environment holding only the settings given (none inherited from the caller's ARGUS_*), a token made the way
an admin makes one, and the wait for the API to answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping

import httpx

ARGUS = [sys.executable, "-m", "argus.cli"]


def argus_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without its ARGUS_* settings, with `settings` (ARGUS_<NAME>: value) instead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env.update(settings)
    return env


def create_token(env: Mapping[str, str], name: str, role: str) -> str:
    """`argus tokens create NAME --role ROLE` against the database `env` names; the token it prints once."""
    made = subprocess.run([*ARGUS, "tokens", "create", name, "--role", role], env=dict(env), capture_output=True,
                          text=True, timeout=120)
    if made.returncode != 0:
        raise RuntimeError(f"argus tokens create {name} failed: {made.stderr.strip()[-500:]}")
    return made.stdout.strip()


def wait_healthy(url: str, timeout_s: float = 60.0) -> bool:
    """Whether `GET <url>/v1/health` answered 200 within `timeout_s` (argus serve starting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False
