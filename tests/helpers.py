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



@contextmanager
def served_app(app: Any, lifespan: str = "off") -> Iterator[str]:
    """`app` under a real uvicorn server on a free loopback port (the kernel picks it; uvicorn serves on that very
    socket), in a thread; its base URL. `lifespan="on"` runs the app's lifespan (an MCP app's session manager)."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan=lifespan))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def own_ray_cluster(base: Path, head_ip: str, worker_ips: tuple[str, ...], worker_gpus: int = 0) -> Iterator[Any]:
    """A Ray cluster of a test's own on loopback addresses no other test uses (the session's GPUs may be held by other
    tests' jobs, and a test that counts GPUs must know what is free); stopped however the test ends."""
    from stage.localstack.ray_cluster import RayCluster

    cluster = RayCluster(base, head_ip=head_ip, worker_ips=worker_ips, worker_gpus=worker_gpus)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
