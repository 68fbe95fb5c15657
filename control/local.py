"""A CommandRunner for this host (the Ray head Argus runs on): argv lists, never a shell, with a timeout.

Used where a step is a GCS request that needs no SSH, such as `ray drain-node` for a node Argus did not join.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

from control.ssh import CommandOutcome, _argv

MAX_OUTPUT = 64 * 1024


class LocalRunner:
    def __init__(self, *, command_timeout_s: float = 120.0) -> None:
        self.command_timeout_s = command_timeout_s

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None) -> CommandOutcome:
        args = _argv(argv)
        started = time.monotonic()
        try:
            done = subprocess.run(args, capture_output=True, text=True, errors="replace", check=False,
                                  timeout=timeout_s or self.command_timeout_s)
        except subprocess.TimeoutExpired as exc:
            return CommandOutcome(args, None, _text(exc.stdout), _text(exc.stderr), time.monotonic() - started,
                                  timed_out=True)
        except OSError as exc:  # the program is missing or not executable
            return CommandOutcome(args, 127, "", f"{args[0]}: {exc.strerror or exc}", time.monotonic() - started)
        return CommandOutcome(args, done.returncode, done.stdout[-MAX_OUTPUT:], done.stderr[-MAX_OUTPUT:],
                              time.monotonic() - started)

    def run_all(self, commands: Sequence[Sequence[str]]) -> list[CommandOutcome]:
        return [self.run(argv) for argv in commands]


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return (value.decode("utf-8", "replace") if isinstance(value, bytes) else value)[-MAX_OUTPUT:]
