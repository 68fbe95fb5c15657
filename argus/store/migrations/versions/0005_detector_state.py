"""Detector state: what the stall and idle-GPU detectors remember per job, so a restart does not reset them

Revision ID: 0005
Revises: 0004
Create Date: 2026-05-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detector_state",
        sa.Column("detector", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("detector", "key", name="pk_detector_state"),
    )
    # the cap keeps a detector's most recently saved keys: its oldest are found through this index
    op.create_index("ix_detector_state_detector_updated_at", "detector_state", ["detector", "updated_at"])


def downgrade() -> None:
    op.drop_table("detector_state")
