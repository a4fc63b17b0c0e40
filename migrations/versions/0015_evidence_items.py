"""Collected evidence: one row per command's output kept from a node before the hammer

Adds ``evidence_items``: the output itself when small, else where it is kept (a file of the evidence
directory or an object of its bucket), with its size and digest.

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "evidence_items",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(63), nullable=False, server_default="default"),
        sa.Column("remediation_id", BIG_ID, sa.ForeignKey("remediations.id"), nullable=False),
        sa.Column("step_id", BIG_ID, sa.ForeignKey("remediation_steps.id"), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("location", sa.String(1024), nullable=True),
        sa.Column("collected_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("step_id", "name", name="uq_evidence_items_step_name"),
    )
    op.create_index("ix_evidence_items_cluster", "evidence_items", ["cluster"])
    op.create_index("ix_evidence_items_remediation", "evidence_items", ["remediation_id", "step_id"])


def downgrade() -> None:
    op.drop_table("evidence_items")
