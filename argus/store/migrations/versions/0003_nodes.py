"""GPU nodes and the log of their state transitions

Revision ID: 0003
Revises: 0002
Create Date: 2026-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("ray_node_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
    )
    op.create_index("ix_nodes_state", "nodes", ["state"])
    op.create_table(
        "node_transitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ray_node_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name="fk_node_transitions_node_nodes", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_node_transitions"),
    )
    op.create_index("ix_node_transitions_node", "node_transitions", ["node"])


def downgrade() -> None:
    op.drop_table("node_transitions")
    op.drop_table("nodes")
