"""leader_fences: the highest fencing token per watcher leader lock

Per lock, the highest token the ingest has recorded and how many events it dropped for a lower one. A
downgrade drops the table: the ingest then accepts every token again.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
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
        "leader_fences",
        sa.Column("lock", sa.String(32), primary_key=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("fenced", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_fences")
