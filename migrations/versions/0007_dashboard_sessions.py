"""dashboard_sessions: server-side dashboard logins

One row per session: the id's digest, the digest of the token that logged in, and its expiry. A downgrade
drops the table, which logs everyone out.

Why: docs/running.md#schema-migrations

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_dashboard_sessions_token_sha256", "dashboard_sessions", ["token_sha256"])
    op.create_index("ix_dashboard_sessions_expires_at", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("dashboard_sessions")
