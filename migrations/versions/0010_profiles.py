"""Profiles: what a node is selected by, and the policy each remediation opened with

Adds ``nodes.partitions``, ``features``, ``labels`` and ``profile``, and ``remediations.profile`` and
``policy``. A downgrade drops the columns.

Why: docs/running.md#schema-migrations

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("partitions", "features", "labels"):
        op.add_column("nodes", sa.Column(column, sa.JSON(), nullable=True))
    op.add_column("nodes", sa.Column("profile", sa.String(63), nullable=True))
    op.create_index("ix_nodes_profile", "nodes", ["profile"])
    op.add_column("remediations", sa.Column("profile", sa.String(63), nullable=True))
    op.add_column("remediations", sa.Column("policy", sa.JSON(), nullable=True))
    op.create_index("ix_remediations_profile", "remediations", ["profile"])


def downgrade() -> None:
    op.drop_index("ix_remediations_profile", table_name="remediations")
    op.drop_column("remediations", "policy")
    op.drop_column("remediations", "profile")
    op.drop_index("ix_nodes_profile", table_name="nodes")
    for column in ("profile", "labels", "features", "partitions"):
        op.drop_column("nodes", column)
