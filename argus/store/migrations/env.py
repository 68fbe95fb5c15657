"""Alembic environment for the incident store.

Run only through argus.store.migrate, which hands over an open connection in
`config.attributes["connection"]`: there is no alembic.ini and no logging setup here (the entry point
configures logging). To write a new revision: `argus.store.migrate.new_revision(url, message)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.types import TypeDecorator

from argus.store.models import Base

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext

# Any constant: it names the lock that keeps two processes from migrating one PostgreSQL at once.
_PG_MIGRATION_LOCK = 0x61726775


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    # Revisions are written with plain SQLAlchemy types, so an old revision never depends on how
    # models.py cleans values today.
    if type_ == "type" and isinstance(obj, TypeDecorator):
        return f"sa.{obj.impl!r}"
    return False


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        compare_type=True,
        render_item=_render_item,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        context.run_migrations()


def _run() -> None:
    connection = context.config.attributes.get("connection")
    if context.is_offline_mode() or connection is None:
        raise SystemExit(
            "run migrations through argus.store.migrate (upgrade, downgrade, new_revision), "
            "which passes the database connection; offline --sql mode is not supported"
        )
    _migrate(connection)


_run()
