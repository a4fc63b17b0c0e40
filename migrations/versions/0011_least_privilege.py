"""Dashboard session ids kept as an HMAC under the server key; nodes confirmed by a resync

``dashboard_sessions.id_sha256`` becomes ``id_hmac`` (old sessions are deleted); ``nodes.confirmed_at`` is
added. A downgrade deletes the HMAC rows and drops the column.

Why: docs/running.md#schema-migrations

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM dashboard_sessions")
    with op.batch_alter_table("dashboard_sessions") as batch:  # SQLite, the first-run default, too
        batch.alter_column("id_sha256", new_column_name="id_hmac")
    op.add_column("nodes", sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_nodes_confirmed_at", "nodes", ["confirmed_at"])


def downgrade() -> None:
    op.drop_index("ix_nodes_confirmed_at", table_name="nodes")
    op.drop_column("nodes", "confirmed_at")
    op.execute("DELETE FROM dashboard_sessions")
    with op.batch_alter_table("dashboard_sessions") as batch:
        batch.alter_column("id_hmac", new_column_name="id_sha256")
