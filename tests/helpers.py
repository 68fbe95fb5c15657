"""Helpers the real-stack tests share: polling until something holds, and Ray jobs that hold GPUs.

The machine is shared and noisy, so waits poll with generous timeouts and never assert on timing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ray.job_submission import JobStatus, JobSubmissionClient

T = TypeVar("T")

_ENDED = {JobStatus.STOPPED, JobStatus.FAILED, JobStatus.SUCCEEDED}


def wait_until(what: str, check: Callable[[], T], timeout: float = 90.0, interval: float = 0.5) -> T:
    """The first truthy value of `check()`, polled every `interval` s; AssertionError naming `what` after
    `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_holding(client: JobSubmissionClient, sid: str, timeout: float = 120.0) -> None:
    """Until the job prints HOLDING; a job that ends first fails the test with its status and log.

    The Jobs API can answer with an error while the job's supervisor starts on a loaded machine: retried.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            logs, status = client.get_job_logs(sid), client.get_job_status(sid)
        except RuntimeError as exc:
            last = f"Jobs API error: {exc}"
        else:
            if "HOLDING" in logs:
                return
            if status.is_terminal():
                raise AssertionError(f"job {sid} ended {status} before holding its GPUs:\n{logs}")
            last = f"status {status}, log:\n{logs}"
        time.sleep(0.5)
    raise AssertionError(f"job {sid} did not hold its GPUs within {timeout:.0f} s; last: {last}")


@contextmanager
def holding_job(dashboard_url: str, script: Path, source: str, owner: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """A real Ray job running `source` (written to `script`), with metadata owner=`owner`, that has printed
    HOLDING: yields (submission id, stop). `stop()` stops the job and waits until it ended; it runs on exit
    unless the test called it already."""
    script.write_text(source)
    client = JobSubmissionClient(dashboard_url)
    sid = client.submit_job(entrypoint=f"{sys.executable} {script}", metadata={"owner": owner})
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            client.stop_job(sid)
            wait_until("the job to stop", lambda: client.get_job_status(sid) in _ENDED, timeout=60)
            stopped = True

    try:
        wait_for_holding(client, sid)
        yield sid, stop
    finally:
        stop()

