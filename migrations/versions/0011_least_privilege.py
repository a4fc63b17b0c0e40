"""Dashboard session ids kept as an HMAC under the server key; nodes confirmed by a resync

``dashboard_sessions.id_sha256`` (an unsalted SHA-256 of the session id) becomes ``id_hmac``, the
id's HMAC-SHA-256 under ``api.session_key``. Sessions stored the old way cannot be converted (the id
itself was never kept), so they are deleted: every dashboard user logs in once more after the
upgrade. A downgrade deletes the HMAC rows the same way.

``nodes.confirmed_at`` is when a watcher's resync last listed the node (NULL: never). Only confirmed
nodes seen lately make up the storm breaker's pool; until any is confirmed, every row counts, so the
upgrade changes nothing before the first resync. A downgrade drops the column.

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
