"""The job queue, and the user an API token speaks for

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_queue",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("submission_id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=32), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=True),
        sa.Column("nnodes", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ray_status", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_queue"),
        sa.UniqueConstraint("submission_id", name="uq_job_queue_submission_id"),
    )
    op.create_index("ix_job_queue_owner", "job_queue", ["owner"])
    op.create_index("ix_job_queue_state", "job_queue", ["state"])
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("user", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("user")
    op.drop_table("job_queue")
