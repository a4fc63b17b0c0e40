"""hardware_sightings: which hardware a node name stood on, at each fault and action

One row per read of a node's hardware (machine identity around each machine action and at a quarantine,
and the GPUs a check named). A downgrade drops the table and its history.

Why: docs/running.md#schema-migrations

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "hardware_sightings",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("remediation_id", BigId, sa.ForeignKey("remediations.id"), nullable=True),
        sa.Column("step", sa.String(32), nullable=False),
        sa.Column("action", sa.String(32), nullable=True),
        sa.Column("provider", sa.String(16), nullable=True),
        sa.Column("instance_id", sa.String(253), nullable=True),
        sa.Column("host", sa.String(253), nullable=True),
        sa.Column("bmc_uuid", sa.String(64), nullable=True),
        sa.Column("bmc_serial", sa.String(128), nullable=True),
        sa.Column("sku", sa.String(128), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.create_index("ix_hardware_sightings_node_at", "hardware_sightings", ["node", "at"])
    op.create_index("ix_hardware_sightings_remediation_id", "hardware_sightings", ["remediation_id"])


def downgrade() -> None:
    op.drop_table("hardware_sightings")
