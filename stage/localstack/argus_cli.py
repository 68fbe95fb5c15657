"""Argus's own CLI as a process of its own, for benchmarks and tests that drive a real `argus serve`: the command,
an environment holding only the settings given (none inherited from the caller's ARGUS_*), a token made the way
an admin makes one, and the wait for the API to answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def serving(env: Mapping[str, str], log: Path, *, timeout_s: float = 90.0) -> Iterator[str]:
    """`argus serve` with `env` on a free loopback port, its output in `log`, answering `/v1/health`: its URL. Ended
    (terminated, killed if it will not go) on the way out."""
    from stage.localstack.ports import free_port

    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=dict(env), stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, timeout_s=timeout_s):
            raise RuntimeError(f"argus serve did not answer within {timeout_s:.0f} s: {log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def wait_healthy(url: str, timeout_s: float = 60.0) -> bool:
    """Whether `GET <url>/v1/health` answered 200 within `timeout_s` (argus serve starting)."""
    return wait_answers(url, "/v1/health", timeout_s=timeout_s)


def wait_answers(url: str, path: str, *, timeout_s: float) -> bool:
    """Whether `GET <url><path>` answered 200 within `timeout_s` (e.g. /v1/leader: this replica leads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False
