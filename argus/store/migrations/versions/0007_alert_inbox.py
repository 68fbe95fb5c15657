"""The alert inbox: Alertmanager alerts accepted and not yet filed

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_inbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("alert", sa.JSON(), nullable=False),
        sa.Column("claimed_by", sa.String(length=128), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_inbox"),
    )
    op.create_index("ix_alert_inbox_claimed_by", "alert_inbox", ["claimed_by"])


def downgrade() -> None:
    op.drop_table("alert_inbox")
