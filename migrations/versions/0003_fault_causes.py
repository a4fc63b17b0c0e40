"""fault class, its evidence and the chosen action on every remediation (cause classification)

Each remediation records the class its cause was read as (gpu-memory, host, fabric...), why (the
XID, the condition, the words in the reason) and the action its class's ladder chose (restart,
move-host, reimage, none, quarantine). Rows from before have NULLs: on-call views show "-", the lemon
score counts them as class ``unknown``.

Why: docs/policy.md#fault-classes-the-cause-picks-the-first-action

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("remediations") as batch:
        batch.add_column(sa.Column("fault_class", sa.String(32), nullable=True))
        batch.add_column(sa.Column("fault_evidence", sa.Text(), nullable=True))
        batch.add_column(sa.Column("action", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("remediations") as batch:
        batch.drop_column("action")
        batch.drop_column("fault_evidence")
        batch.drop_column("fault_class")
