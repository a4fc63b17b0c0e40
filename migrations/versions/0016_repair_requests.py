"""Repair requests: quarantined hardware handed to the site's repair system

Adds ``repair_requests``: what was sent, whether it arrived (attempts, the next one, the last error),
how it ended, and the re-check a finished repair opened. One request is open per node.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OPEN = sa.text("status IN ('open', 'rechecking')")


def upgrade() -> None:
    op.create_table(
        "repair_requests",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(63), nullable=False, server_default="default"),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("remediation_id", BIG_ID, sa.ForeignKey("remediations.id"), nullable=False),
        sa.Column("follows_id", BIG_ID, sa.ForeignKey("repair_requests.id"), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("ticket", sa.String(128), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("delivery", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_by", sa.String(128), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("recheck_id", BIG_ID, sa.ForeignKey("remediations.id"), nullable=True),
        sa.Column("new_hardware", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_repair_requests_cluster", "repair_requests", ["cluster"])
    op.create_index("ix_repair_requests_delivery", "repair_requests", ["delivery", "next_attempt_at"])
    op.create_index("ix_repair_requests_node", "repair_requests", ["cluster", "node", "opened_at"])
    op.create_index("uq_repair_requests_one_open_per_node", "repair_requests", ["cluster", "node"], unique=True,
                    postgresql_where=OPEN, sqlite_where=OPEN)


def downgrade() -> None:
    op.drop_table("repair_requests")
