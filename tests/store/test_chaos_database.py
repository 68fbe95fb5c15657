"""Chaos: the database under a real `argus serve` stops and comes back. A PostgreSQL of the test's own (initdb in a
temporary folder, a free port; never the machine's shared server), stopped with `pg_ctl stop -m fast` and started
again. While it is down the API answers 503 naming the database (so Alertmanager keeps its alerts and sends them
again: nothing is accepted and then lost), the process stays up and its loop keeps ticking; once it is back, what was
stored before is there and new alerts are filed. And the data dir on a full disk (a 1 MiB tmpfs): the data dir's
SQLite refuses writes with a clear 5xx, the process stays up, and it recovers when space comes back."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stage.localstack.argus_cli import ARGUS, argus_env, create_token, wait_healthy
from stage.localstack.ports import free_port

pytestmark = pytest.mark.postgres


class OwnPostgres:
    """initdb, pg_ctl start and stop, as the postgres user when this runs as root (PostgreSQL refuses root)."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            pytest.skip("no PostgreSQL server binaries (initdb) here")
        self.bin = Path(bins[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="argus-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self.as_user, str(self.bin / tool), *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{tool}: {done.stdout[-1000:]} {done.stderr[-1000:]}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    pg = OwnPostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


def alert(name: str) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "argus", "groupKey": name, "alerts": [
        {"status": "firing", "startsAt": "2026-11-27T07:00:00Z", "fingerprint": name,
         "labels": {"alertname": name, "category": "disk_full", "severity": "critical", "node_ip": "10.0.0.7"},
         "annotations": {"summary": f"{name} on 10.0.0.7"}}]}


def serve(tmp_path: Path, db: str) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    env = argus_env({"ARGUS_DATA_DIR": str(tmp_path / "data"), "ARGUS_DATABASE_URL": db,
                     "ARGUS_RAY_DASHBOARD_URL": "http://127.0.0.1:9", "ARGUS_POLL_INTERVAL_S": "0.5",
                     "ARGUS_REQUEST_TIMEOUT_S": "1", "PYTHONUNBUFFERED": "1"})
    token = create_token(env, "chaos", "operator")
    port = free_port()
    proc = subprocess.Popen([*ARGUS, "serve", "--port", str(port)], env=env, stdout=(tmp_path / "serve.log").open("w"),
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    return proc, url, {"authorization": f"Bearer {token}"}


def ticks(url: str) -> int:
    return int(httpx.get(f"{url}/v1/health", timeout=10).json()["ticks"])


def test_the_database_stopping_and_coming_back_loses_nothing_accepted(tmp_path: Path,
                                                                       own_postgres: OwnPostgres) -> None:
    proc, url, auth = serve(tmp_path, own_postgres.url)
    try:
        first = httpx.post(f"{url}/v1/alerts/alertmanager", json=alert("DiskFullBefore"), headers=auth, timeout=30)
        assert first.status_code == 200 and len(first.json()["opened"]) == 1

        own_postgres.stop()
        down = httpx.get(f"{url}/v1/incidents", headers=auth, timeout=30)
        assert down.status_code == 503, down.text
        assert "database" in down.json()["message"] and down.json()["hint"]
        refused = httpx.post(f"{url}/v1/alerts/alertmanager", json=alert("DiskFullWhileDown"), headers=auth,
                             timeout=30)
        assert refused.status_code == 503  # not accepted: Alertmanager keeps it and sends it again
        before = ticks(url)
        time.sleep(2)
        assert ticks(url) > before and proc.poll() is None  # the loop goes on, the process stays up

        own_postgres.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            again = httpx.post(f"{url}/v1/alerts/alertmanager", json=alert("DiskFullWhileDown"), headers=auth,
                               timeout=30)
            if again.status_code == 200:
                break
            time.sleep(0.5)
        assert again.status_code == 200 and len(again.json()["opened"]) == 1  # the resend is filed
        listed = httpx.get(f"{url}/v1/incidents", headers=auth, timeout=30).json()["items"]
        assert sorted(i["reason"] for i in listed) == ["DiskFullBefore", "DiskFullWhileDown"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    log = (tmp_path / "serve.log").read_text()
    assert proc.returncode == 0, log[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_data_dir_refuses_writes_plainly_and_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        proc, url, auth = serve(tmp_path, f"sqlite:///{data / 'argus.db'}")
        try:
            assert httpx.post(f"{url}/v1/alerts/alertmanager", json=alert("Before"), headers=auth,
                              timeout=30).status_code == 200
            filler = data / "filler"
            # someone else fills the disk; unbuffered, so closing the file has nothing left to write: a buffered one
            # raised ENOSPC again at close when the last write had left bytes in its buffer
            with filler.open("wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass
            statuses = [httpx.post(f"{url}/v1/alerts/alertmanager", json=alert(f"Full{i}"), headers=auth,
                                   timeout=30).status_code for i in range(20)]
            assert 200 not in statuses[5:] and all(s >= 500 for s in statuses[5:]), statuses
            assert proc.poll() is None and httpx.get(f"{url}/v1/health", timeout=10).status_code == 200
            filler.unlink()  # space again
            again = httpx.post(f"{url}/v1/alerts/alertmanager", json=alert("After"), headers=auth, timeout=30)
            assert again.status_code == 200, again.text
            reasons = {i["reason"] for i in httpx.get(f"{url}/v1/incidents", headers=auth, timeout=30)
                       .json()["items"]}
            assert {"Before", "After"} <= reasons
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    finally:
        subprocess.run(["umount", "-l", str(data)], capture_output=True)
