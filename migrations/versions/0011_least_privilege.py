"""Dashboard session ids kept as an HMAC under the server key

``dashboard_sessions.id_sha256`` (an unsalted SHA-256 of the session id) becomes ``id_hmac``, the
id's HMAC-SHA-256 under ``api.session_key``. Sessions stored the old way cannot be converted (the id
itself was never kept), so they are deleted: every dashboard user logs in once more after the
upgrade. A downgrade deletes the HMAC rows the same way.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM dashboard_sessions")
    with op.batch_alter_table("dashboard_sessions") as batch:  # SQLite, the first-run default, too
        batch.alter_column("id_sha256", new_column_name="id_hmac")


def downgrade() -> None:
    op.execute("DELETE FROM dashboard_sessions")
    with op.batch_alter_table("dashboard_sessions") as batch:
        batch.alter_column("id_hmac", new_column_name="id_sha256")
