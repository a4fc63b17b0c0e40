"""dry-run marks on remediations, their steps and the audit log

Rows written while the service runs in dry-run carry ``dry_run = true``: the repeat-offender rule and
the storm breaker never count them, and on-call views can show or hide them. Existing rows predate the
mark and are taken as real (false), which is what they were unless the site ran in dry-run; such a site
can mark them by hand.

Why: docs/policy.md#honest-dry-run

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("remediations", "remediation_steps", "audit_log")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("dry_run")
