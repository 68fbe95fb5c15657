"""Tokens, roles and the audit log, through the real app over a real SQLite store, and the CLI as a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import typer
from click.testing import Result
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from argus.api.app import create_app
from argus.api.auth import require
from argus.cli_tokens import register as register_tokens
from argus.exporter import ArgusMetrics
from argus.store.store import Store
from argus.store.tokens import Role, allows
from core.errors import InputError, NotFound
from tests.support import Clock

ARGUS = [sys.executable, "-m", "argus.cli"]


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc))


@pytest.fixture
def store(tmp_path: Path, clock: Clock):
    s = Store(f"sqlite:///{tmp_path / 'argus.db'}", clock=clock)
    yield s
    s.close()


def app_with_test_routes(store: Store) -> FastAPI:
    """The real app plus mutating routes that exist only here, until the API has its own."""
    app = create_app(store=store, metrics=ArgusMetrics())
    router = APIRouter(prefix="/v1/test")

    @router.post("/things/{thing_id}")
    def touch(thing_id: str, _=Depends(require(Role.OPERATOR))) -> dict:
        return {"touched": thing_id}

    @router.delete("/things/{thing_id}")
    def remove(thing_id: str, _=Depends(require(Role.ADMIN))) -> dict:
        raise NotFound(f"no thing {thing_id!r}", hint="list things first")

    @router.post("/agent-only")
    def agent_only(_=Depends(require(Role.AGENT))) -> dict:
        return {"ok": True}

    @router.put("/broken")
    def broken(_=Depends(require(Role.OPERATOR))) -> dict:
        raise InputError("the thing is malformed", hint="send a better thing")

    app.include_router(router)
    return app


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def client(store: Store) -> TestClient:
    return TestClient(app_with_test_routes(store), raise_server_exceptions=False)


def assert_refused(response, status: int = 401) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == ("Unauthorized" if status == 401 else "Forbidden")
    assert body["message"] and body["hint"]
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")


# ---- the role matrix -------------------------------------------------------------------------------------

def test_reads_need_a_usable_token_and_any_role(store: Store, client: TestClient, clock: Clock) -> None:
    for path in ("/v1/incidents", "/v1/incidents/inc-000000000000"):
        assert_refused(client.get(path))
        assert_refused(client.get(path, headers=bearer("argus_0123abcd_" + "A" * 43)))
    for role in Role:
        _, token = store.create_token(f"reader-{role.value}", role, created_by="tests")
        if role is Role.NODE_AGENT:  # a node agent's token only sends lines (its job's environment carries it)
            assert client.get("/v1/incidents", headers=bearer(token)).status_code == 403
            continue
        assert client.get("/v1/incidents", headers=bearer(token)).status_code == 200
        assert client.get("/v1/incidents/inc-000000000000", headers=bearer(token)).status_code == 404

    _, revoked = store.create_token("revoked", Role.ADMIN, created_by="tests")
    assert client.get("/v1/incidents", headers=bearer(revoked)).status_code == 200
    store.revoke_token("revoked")
    assert_refused(client.get("/v1/incidents", headers=bearer(revoked)))

    _, expiring = store.create_token("expiring", Role.VIEWER, created_by="tests",
                                     expires_at=clock.now + timedelta(hours=1))
    assert client.get("/v1/incidents", headers=bearer(expiring)).status_code == 200
    clock.now += timedelta(hours=1)
    assert_refused(client.get("/v1/incidents", headers=bearer(expiring)))


def test_health_metrics_and_openapi_stay_open(client: TestClient) -> None:
    assert client.get("/v1/health").status_code == 200
    assert client.get("/metrics").status_code == 200
    schema = client.get("/openapi.json").json()
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


@pytest.mark.parametrize(
    ("route", "allowed"),
    [
        (("post", "/v1/test/things/t1"), {Role.OPERATOR, Role.AGENT, Role.ADMIN}),
        (("post", "/v1/test/agent-only"), {Role.AGENT, Role.ADMIN}),
        (("delete", "/v1/test/things/t1"), {Role.ADMIN}),
    ],
)
def test_roles_on_mutating_routes(store: Store, client: TestClient, route, allowed) -> None:
    method, path = route
    for role in Role:
        _, token = store.create_token(f"who-{role.value}", role, created_by="tests")
        response = client.request(method, path, headers=bearer(token))
        if role in allowed:
            assert response.status_code in {200, 404}, (role, response.text)  # the DELETE route says 404
        else:
            assert_refused(response, 403)
            assert role.value in response.json()["message"]
        assert allows(role, Role.VIEWER) is (role is not Role.NODE_AGENT)  # a node agent only sends lines


# ---- hostile headers --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Bearer      ",
        "Basic dXNlcjpwYXNz",
        "Bearer " + "x" * 100_000,
        "Bearer argus_0123abcd_" + "A" * 100_000,
        "Bearer ' OR '1'='1' --",
        "Bearer argus_0123abcd_'; DROP TABLE api_tokens; --",
        "Bearer argus_' OR 1=1 --_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "Bearer \t argus_0123abcd_AAAA",
        "Bearer a b c",
        "Bearer %00",
        "Bearer\x7f" + "A" * 50,
    ],
)
def test_hostile_authorization_headers_are_401(store: Store, client: TestClient, header: str) -> None:
    store.create_token("someone", Role.ADMIN, created_by="tests")
    assert_refused(client.get("/v1/incidents", headers={"Authorization": header}))
    assert len(store.list_tokens()) == 1  # the table is still there


def test_non_ascii_and_odd_spacing_around_a_real_token(store: Store, client: TestClient) -> None:
    _, token = store.create_token("someone", Role.VIEWER, created_by="tests")
    for raw in [
        f"Bearer {token}ü".encode(),
        "Bearer ünïcødé".encode(),
        f"Bearer {token[:-1]}é".encode("latin-1"),
        f"Bearer {token} {token}".encode(),
        f"Bearer {token} extra".encode(),
        f"Token {token}".encode(),
        token.encode(),
        f"Bearer {token[:-1]}".encode(),  # right prefix, wrong secret
    ]:
        assert_refused(client.get("/v1/incidents", headers={"Authorization": raw}))
    # RFC 6750: the scheme is case-insensitive and one or more spaces separate it from the token.
    for ok in (f"bearer {token}", f"Bearer   {token}", f"BEARER {token} "):
        assert client.get("/v1/incidents", headers={"Authorization": ok}).status_code == 200, ok


# ---- tokens at rest -----------------------------------------------------------------------------------------

def test_tokens_are_stored_hashed_only(store: Store, tmp_path: Path) -> None:
    record, token = store.create_token("ops-agent", Role.AGENT, created_by="tests")
    assert token.startswith(record.prefix + "_") and len(token) > 50
    assert store.verify_token(token) == store.verify_token(token) is not None
    secret = token[len(record.prefix) + 1:]
    store.close()  # checkpoint the WAL into the file so the bytes below are everything written
    for path in tmp_path.glob("argus.db*"):
        raw = path.read_bytes()
        assert token.encode() not in raw and secret.encode() not in raw, path
    with sqlite3.connect(tmp_path / "argus.db") as db:
        [(stored_hash, prefix)] = db.execute("SELECT token_hash, prefix FROM api_tokens").fetchall()
    assert stored_hash == hashlib.sha256(token.encode()).hexdigest() and prefix == record.prefix


def test_token_names_are_checked_and_unique(store: Store, clock: Clock) -> None:
    store.create_token("grafana", Role.VIEWER, created_by="tests")
    with pytest.raises(InputError, match="exists already"):
        store.create_token("grafana", Role.ADMIN, created_by="tests")
    for bad in ["", "a b", "../x", "x" * 65, "'; DROP TABLE api_tokens; --", "name\x00"]:
        with pytest.raises(InputError):
            store.create_token(bad, Role.VIEWER, created_by="tests")
    with pytest.raises(InputError, match="role"):
        store.create_token("x", "root", created_by="tests")
    with pytest.raises(InputError, match="past"):
        store.create_token("late", Role.VIEWER, created_by="tests", expires_at=clock.now - timedelta(seconds=1))
    with pytest.raises(NotFound):
        store.revoke_token("nobody")
    first = store.revoke_token("grafana").revoked_at
    clock.now += timedelta(minutes=5)
    assert store.revoke_token("grafana").revoked_at == first  # revoking twice keeps the first time


def test_last_used_is_recorded_without_a_write_per_request(store: Store, clock: Clock) -> None:
    record, token = store.create_token("busy", Role.VIEWER, created_by="tests")
    assert record.last_used_at is None
    assert store.verify_token(token).last_used_at == clock.now
    first = clock.now
    clock.now += timedelta(seconds=10)
    assert store.verify_token(token).last_used_at == first
    clock.now += timedelta(minutes=2)
    assert store.verify_token(token).last_used_at == clock.now


# ---- the audit log ------------------------------------------------------------------------------------------

def test_mutating_calls_are_audited_with_actor_and_outcome(store: Store, client: TestClient, clock: Clock) -> None:
    _, operator = store.create_token("alice", Role.OPERATOR, created_by="tests")
    _, viewer = store.create_token("bob", Role.VIEWER, created_by="tests")
    _, admin = store.create_token("root", Role.ADMIN, created_by="tests")

    assert client.post("/v1/test/things/t-42", headers=bearer(operator)).json() == {"touched": "t-42"}
    assert client.post("/v1/test/things/t-43", headers=bearer(viewer)).status_code == 403
    assert client.post("/v1/test/things/t-44").status_code == 401
    assert client.delete("/v1/test/things/t-45", headers=bearer(admin)).status_code == 404
    assert client.put("/v1/test/broken", headers=bearer(operator)).status_code == 400
    client.get("/v1/incidents", headers=bearer(viewer))  # reads are not audited

    records = list(reversed(store.list_audit(limit=10)))
    assert [(r.actor, r.role, r.method, r.path, r.status, r.outcome) for r in records] == [
        ("alice", "operator", "POST", "/v1/test/things/t-42", 200, "ok"),
        ("bob", "viewer", "POST", "/v1/test/things/t-43", 403, "refused"),
        ("anonymous", None, "POST", "/v1/test/things/t-44", 401, "refused"),
        ("root", "admin", "DELETE", "/v1/test/things/t-45", 404, "rejected"),
        ("alice", "operator", "PUT", "/v1/test/broken", 400, "rejected"),
    ]
    assert json.loads(records[0].target) == {"thing_id": "t-42"}
    assert all(r.at == clock.now for r in records)
    assert store.list_audit(limit=10, since=clock.now + timedelta(seconds=1)) == []


# ---- the CLI ---------------------------------------------------------------------------------------------------

def argus(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    """`argus ...` as a user runs it: a subprocess (the error cases, which main() renders)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env["ARGUS_DATA_DIR"] = str(data_dir)
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=env, timeout=120)


def tokens_in_process(*args: str, data_dir: Path) -> Result:
    """`argus tokens ...` through Typer's runner: the same command code, without a Python start (~1.7 s) per call.
    test_cli.py runs the console script itself; the error cases below still go through it."""
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """A stand-in for the main CLI: a group, so `tokens` stays a subcommand."""

    register_tokens(app)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("ARGUS_")}
    env["ARGUS_DATA_DIR"] = str(data_dir)
    result = CliRunner().invoke(app, ["tokens", *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_tokens_cli_create_list_revoke(tmp_path: Path) -> None:
    created = tokens_in_process("create", "ops-agent", "--role", "agent", "--expires-days", "30", data_dir=tmp_path)
    assert created.exit_code == 0, created.stderr
    token = created.stdout.strip()
    assert "\n" not in token and "shown only this once" in created.stderr

    listed = tokens_in_process("list", "--json", data_dir=tmp_path)
    assert listed.exit_code == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["name"] == "ops-agent" and row["role"] == "agent" and row["expires_at"]
    assert token.startswith(row["prefix"]) and token not in listed.stdout
    table = tokens_in_process("list", data_dir=tmp_path)
    assert "ops-agent" in table.stdout and "active" in table.stdout and token not in table.stdout

    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    try:
        assert store.verify_token(token).name == "ops-agent"
        again = argus("tokens", "create", "ops-agent", "--role", "viewer", data_dir=tmp_path)
        assert again.returncode == 2 and "exists already" in again.stderr and "Traceback" not in again.stderr
        bad_role = tokens_in_process("create", "x", "--role", "root", data_dir=tmp_path)
        assert bad_role.exit_code != 0 and "root" in bad_role.stderr

        revoked = tokens_in_process("revoke", "ops-agent", data_dir=tmp_path)
        assert revoked.exit_code == 0 and "revoked" in revoked.stdout, revoked.stderr
        assert store.verify_token(token) is None
        assert "revoked" in tokens_in_process("list", data_dir=tmp_path).stdout
        missing = argus("tokens", "revoke", "nobody", data_dir=tmp_path)
        assert missing.returncode == 2 and "nobody" in missing.stderr
    finally:
        store.close()


def test_a_token_is_checked_without_the_write_lock_and_its_use_noted_once_a_minute(
        store: Store, clock: Clock, tmp_path: Path) -> None:
    # In an alert storm the filer holds SQLite's write lock much of the time: a request's token check must not wait
    # for it. Only the first use in a minute writes (last_used_at), and that write waits its turn as writes do.
    _, token = store.create_token("reader", Role.VIEWER, created_by="tests")
    first = store.verify_token(token)
    assert first is not None and first.last_used_at == clock.now
    assert store.list_tokens()[0].last_used_at == clock.now

    clock.now += timedelta(seconds=30)
    holder = sqlite3.connect(tmp_path / "argus.db", timeout=0)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock for as long as this test needs
    try:
        done: list = []
        checking = threading.Thread(target=lambda: done.append(store.verify_token(token)))
        checking.start()
        checking.join(timeout=20)  # with the lock to wait for, it would wait SQLite's 30 s busy timeout
        assert not checking.is_alive() and done[0] is not None
        assert done[0].last_used_at == first.last_used_at  # used within the minute: nothing written
    finally:
        holder.rollback()
        holder.close()

    clock.now += timedelta(seconds=31)
    assert store.verify_token(token).last_used_at == clock.now
    assert store.list_tokens()[0].last_used_at == clock.now
    store.revoke_token("reader")
    assert store.verify_token(token) is None
