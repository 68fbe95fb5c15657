"""API tokens in the database: created (the token shown once, only its sha256 kept), verified on every
request, revoked, listed. The token format and roles are tokens.py's, which loads without SQLAlchemy.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from loguru import logger
from sqlalchemy import Engine, exc, or_, select, update

from argus.store.columns import as_utc
from argus.store.models import ApiTokenRow
from argus.store.repository import new_id, parse_enum, saved, transaction
from argus.store.tokens import (
    NAME_MAX,
    Role,
    TokenRecord,
    hash_token,
    new_token,
    prefix_of,
    valid_name,
    valid_user,
)
from core.errors import InputError, NotFound, StoreError
from core.types import utcnow

# last_used_at is written at most this often per token, so reads do not each cost a write.
_LAST_USED_EVERY = timedelta(seconds=60)
# Compared against when no row has the token's prefix, so a miss costs the same compare as a hit.
_NO_HASH = "0" * 64


class TokenRepository:
    """API tokens. Thread-safe; the Store holds one as `store.tokens`."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def create(
        self, name: str, role: Role | str, created_by: str, expires_at: datetime | None = None,
        user: str | None = None,
    ) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself, which is not stored and cannot be shown again. `user`: the
        person it speaks for; a user token without one speaks for its name."""
        if not valid_name(name):
            raise InputError(
                f"token name {name[:80]!r} is not allowed",
                hint=f"use letters, digits and . _ @ -, starting with a letter or digit, at most {NAME_MAX}",
            )
        role = parse_enum(Role, role, "role")
        if role is Role.USER and user is None:
            user = name
        if user is not None and not valid_user(user):
            raise InputError(f"user {user[:80]!r} of token {name!r} is not a user name",
                             hint="1-32 of a-z 0-9 _ . -, starting with a letter or '_' (it names users/<user>/)")
        now = self._clock()
        if expires_at is not None and as_utc(expires_at) <= now:
            raise InputError(f"token {name!r} would expire at {expires_at.isoformat()}, already past",
                             hint="give an expiry in the future, or none")
        token, prefix = new_token()
        row = ApiTokenRow(
            id=new_id("tok"), name=name, role=role.value, prefix=prefix, token_hash=hash_token(token),
            created_at=now, created_by=created_by, expires_at=expires_at, user=user,
        )
        try:
            with transaction(self._engine, "creating a token") as s:
                if s.scalars(select(ApiTokenRow.id).where(ApiTokenRow.name == name)).first() is not None:
                    raise _name_taken(name)
                s.add(row)
                record = saved(s, row).to_domain()
        except StoreError as err:
            if isinstance(err.__cause__, exc.IntegrityError):  # another process took the name meanwhile
                raise _name_taken(name) from None
            raise
        logger.info("API token {} ({}) created for role {} by {}", name, prefix, role.value, created_by)
        return record, token

    def verify(self, token: str) -> TokenRecord | None:
        """The record of a token that exists, is not revoked and has not expired; None for anything else."""
        prefix = prefix_of(token)
        if prefix is None:
            return None
        now = self._clock()
        # Read without the write lock: on SQLite every API request waited here behind the alert filer's writes in a
        # storm, though only one request a minute per token writes anything.
        with transaction(self._engine, "checking a token", read_only=True) as s:
            row = s.scalars(select(ApiTokenRow).where(ApiTokenRow.prefix == prefix)).first()
            matches = hmac.compare_digest(hash_token(token), row.token_hash if row else _NO_HASH)
            if row is None or not matches:
                return None
            record = row.to_domain()
        if not record.usable_at(now):
            return None
        if record.last_used_at is None or now - record.last_used_at >= _LAST_USED_EVERY:
            with transaction(self._engine, "noting a token's use") as s:
                # only where no request of the same minute noted it first
                s.execute(update(ApiTokenRow).where(ApiTokenRow.id == record.id)
                          .where(or_(ApiTokenRow.last_used_at.is_(None),
                                     ApiTokenRow.last_used_at <= now - _LAST_USED_EVERY))
                          .values(last_used_at=now))
            record = replace(record, last_used_at=now)
        return record

    def revoke(self, name_or_id: str) -> TokenRecord:
        """Revoke a token by name or id; revoking twice keeps the first time. NotFound if there is none."""
        with transaction(self._engine, "revoking a token") as s:
            row = s.scalars(
                select(ApiTokenRow).where((ApiTokenRow.name == name_or_id) | (ApiTokenRow.id == name_or_id))
            ).first()
            if row is None:
                raise NotFound(f"no API token named {name_or_id[:80]!r}", hint="list them with `argus tokens list`")
            if row.revoked_at is None:
                row.revoked_at = self._clock()
                logger.info("API token {} ({}) revoked", row.name, row.prefix)
            return saved(s, row).to_domain()

    def list(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones too, oldest first."""
        with transaction(self._engine, "listing tokens", read_only=True) as s:
            rows = s.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id))
            return [row.to_domain() for row in rows]


def _name_taken(name: str) -> InputError:
    return InputError(
        f"an API token named {name!r} exists already",
        hint="choose another name; revoked tokens keep theirs so the audit log names one token each",
    )
