"""Schema migrations (Alembic, configured here: no alembic.ini) and how the store connects.

Connecting lives here, not in store.py, because migrations connect before any Store exists; both use
`open_engine` so they see the same SQLite settings and the same error wrapping.

Supported URLs: `sqlite:///<path>` (the parent folder is created) and `postgresql[+psycopg2]://...`.
Other backends lack the partial unique index that keeps incident dedup race-safe.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import event, exc, make_url
from sqlalchemy.engine import URL, Connection, Engine, create_engine

from core.errors import ArgusError, ConfigError, SourceUnavailable, StoreError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0
PG_CONNECT_TIMEOUT_S = 10
_SUPPORTED = ("sqlite", "postgresql")
_URL_HINT = (
    "set ARGUS_DATABASE_URL to e.g. sqlite:////var/lib/argus/argus.db or "
    "postgresql+psycopg2://user:password@host:5432/argus"
)
# alembic.context is one module-level proxy: two threads running migrations at once overwrite each
# other's (KeyError 'config'). Taken before the database connection, so it never waits while holding
# SQLite's write lock.
_ALEMBIC_LOCK = threading.Lock()
READ_ONLY = "argus_read_only"  # a connection's execution option: its transaction only reads
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)")


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by ***, also when the URL does not parse."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL we cannot parse is masked by pattern instead
        return _PASSWORD_IN_URL.sub(r"\1***\3", url)


def scrub(text: str, url: URL | None) -> str:
    """`text` without the URL's password, for messages that quote a driver's error."""
    if url is not None and url.password:
        text = text.replace(str(url.password), "***")
    return text


def parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as err:
        raise ConfigError(
            f"ARGUS_DATABASE_URL {mask_url(url)!r} is not a database URL: {scrub(str(err), None)}",
            hint=_URL_HINT,
        ) from None
    if parsed.get_backend_name() not in _SUPPORTED:
        raise ConfigError(
            f"ARGUS_DATABASE_URL {mask_url(parsed)!r} uses {parsed.get_backend_name()!r}; "
            "the store supports sqlite and postgresql",
            hint=_URL_HINT,
        )
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Every pooled connection to an in-memory SQLite is a separate, empty database.
        raise ConfigError(
            f"ARGUS_DATABASE_URL {mask_url(parsed)!r} is an in-memory SQLite database, which the API "
            "and the daemon threads cannot share",
            hint="use a file, e.g. sqlite:////tmp/argus.db",
        )
    return parsed


def open_engine(url: str) -> Engine:
    """An Engine for `url`, configured for two threads sharing it. Raises ConfigError on a bad URL."""
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed)
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    except (exc.ArgumentError, ImportError) as err:
        raise ConfigError(
            f"ARGUS_DATABASE_URL {mask_url(parsed)!r} cannot be used: {scrub(str(err), parsed)}",
            hint=_URL_HINT + "; the postgresql driver comes with `pip install argus-gpu[postgres]`",
        ) from None


def _sqlite_engine(url: URL) -> Engine:
    path = Path(url.database or "").expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SourceUnavailable(
            "database",
            mask_url(url),
            f"cannot create folder {path.parent}: {err.strerror}",
            hint="choose a writable path in ARGUS_DATABASE_URL or ARGUS_DATA_DIR",
        ) from None
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Turn off the driver's own transaction handling so "begin" below is the only BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front, waiting up to the busy timeout. A deferred
        # transaction that reads and then writes fails at once with "database is locked" when
        # another thread wrote in between, and no retry can fix that. One that only reads never upgrades.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine


def wrap_db_error(err: Exception, url: URL, doing: str) -> ArgusError:
    """One of our errors for a SQLAlchemy or driver error raised while `doing` something."""
    cause = scrub(_first_line(err), url)
    if isinstance(err, exc.DBAPIError) and err.connection_invalidated:
        return SourceUnavailable("database", mask_url(url), cause, hint=_reach_hint(url))
    if isinstance(err, exc.OperationalError) and url.get_backend_name() == "sqlite":
        return StoreError(
            f"SQLite database {mask_url(url)} failed while {doing}: {cause}",
            hint="check the file's folder is writable and its disk has space; one file per Argus",
        )
    return StoreError(
        f"database {mask_url(url)} failed while {doing}: {cause}",
        hint="if the schema is older than this Argus run `argus db upgrade`; else see the database log",
    )


def _first_line(err: Exception) -> str:
    orig = getattr(err, "orig", None)
    text = str(orig if orig is not None else err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _reach_hint(url: URL) -> str:
    if url.get_backend_name() == "sqlite":
        return "check the path in ARGUS_DATABASE_URL exists and is writable"
    return "check that PostgreSQL is running and accepts connections there, and the user and password"


@contextmanager
def connected(engine: Engine, doing: str, *, read_only: bool = False) -> Iterator[Connection]:
    """A connection in a transaction, committed at the end; every failure becomes one of our errors. `read_only`:
    the transaction only reads, so on SQLite it does not take the write lock (WAL lets readers run beside the
    writer: API reads do not queue behind a storm of alerts being filed)."""
    try:
        conn = engine.connect()
        if read_only:
            conn = conn.execution_options(**{READ_ONLY: True})
    except exc.SQLAlchemyError as err:
        raise SourceUnavailable(
            "database", mask_url(engine.url), scrub(_first_line(err), engine.url), hint=_reach_hint(engine.url)
        ) from None
    try:
        with conn.begin():
            yield conn
    except exc.SQLAlchemyError as err:
        raise wrap_db_error(err, engine.url, doing) from err
    finally:
        conn.close()


def _config(conn: Connection) -> Config:
    config = Config()
    # ConfigParser interpolates %, which a path may contain.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = conn
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise StoreError(f"no migration found in {MIGRATIONS_DIR / 'versions'}", hint="reinstall Argus")
    return head


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    with (
        _ALEMBIC_LOCK,
        connected(engine, f"upgrading the schema to {revision}") as conn,
        _alembic_errors(revision),
    ):
        command.upgrade(_config(conn), revision)


def downgrade_engine(engine: Engine, revision: str) -> None:
    with (
        _ALEMBIC_LOCK,
        connected(engine, f"downgrading the schema to {revision}") as conn,
        _alembic_errors(revision),
    ):
        command.downgrade(_config(conn), revision)


@contextmanager
def _alembic_errors(revision: str) -> Iterator[None]:
    try:
        yield
    except CommandError as err:
        raise StoreError(
            f"cannot migrate the database to {revision!r}: {err}",
            hint=f"known revisions are in {MIGRATIONS_DIR / 'versions'}; 'head' is the newest, 'base' empty",
        ) from None


def revision_of(engine: Engine) -> str | None:
    with connected(engine, "reading the schema revision") as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (default: the newest)."""
    engine = open_engine(url)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    """Take the database at `url` back to `revision`; "base" removes every table of ours."""
    engine = open_engine(url)
    try:
        downgrade_engine(engine, revision)
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at; None for a database never migrated."""
    engine = open_engine(url)
    try:
        return revision_of(engine)
    finally:
        engine.dispose()


def new_revision(url: str, message: str, revision_id: str | None = None) -> Path:
    """Development helper: write a revision holding what models.py has and the database at `url`
    (migrated to head first) lacks. Review the file before committing it. Returns its path."""
    engine = open_engine(url)
    try:
        upgrade_engine(engine)
        with _ALEMBIC_LOCK, connected(engine, "comparing the schema") as conn, _alembic_errors("a new revision"):
            script = command.revision(_config(conn), message=message, autogenerate=True, rev_id=revision_id)
    finally:
        engine.dispose()
    written = (script if isinstance(script, list) else [script])[0]
    if written is None:
        raise StoreError("alembic wrote no revision file", hint="check the migrations folder and alembic's output")
    return Path(written.path)
