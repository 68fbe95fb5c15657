"""Incidents of one state listed newest first without a sort

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_incidents_state_detected_at", "incidents", ["state", "detected_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_incidents_state_detected_at", table_name="incidents")
