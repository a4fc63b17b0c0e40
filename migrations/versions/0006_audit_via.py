"""audit_log.via: which door a lever came through

``api`` for a lever pulled through the API or the dashboard (its actor is the token's name), ``db``
for one pulled by the CLI in direct database mode (an admin on the database host; the actor is what
``--actor`` or ``$USER`` says), ``service`` for what the service did by itself. Rows written before this
revision keep NULL: nobody recorded the door then. A downgrade drops the column.

Why: docs/running.md#the-cli

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("via", sa.String(8), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_log", "via")
