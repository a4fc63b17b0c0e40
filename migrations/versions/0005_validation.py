"""validations: the GPU validation's checks

One row per check the gate ran (the ``validate`` step, ``remediation validate``, ``release
--validate``): command, cause class, outcome, exit code, duration and the last 4 KB of output. Nothing
existing changes; a downgrade drops the table.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "validations",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("remediation_id", BigId, sa.ForeignKey("remediations.id"), nullable=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cause_class", sa.String(32), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("output_tail", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_validations_node_started", "validations", ["node", "started_at"])
    op.create_index("ix_validations_remediation_id", "validations", ["remediation_id"])
    op.create_index("ix_validations_outcome", "validations", ["outcome"])
    op.create_index("ix_validations_started_at", "validations", ["started_at"])


def downgrade() -> None:
    op.drop_table("validations")
