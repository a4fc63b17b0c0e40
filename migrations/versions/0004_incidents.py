"""topology-correlated incidents: node failure domains, incidents, remediations.incident_id

``node_domains`` holds each node's failure domains per source (Slurm topology switches, Node label
values); ``incidents`` one row per domain that failed as one; a remediation folded into an incident
points at it (no VM action, never a repeat-offender count). Existing remediations belong to none.

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "node_domains",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("source", sa.String(16), primary_key=True),
        sa.Column("kind", sa.String(253), primary_key=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_node_domains_domain", "node_domains", ["kind", "name"])
    op.create_table(
        "incidents",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("domain_size", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_by", sa.String(128), nullable=True),
        sa.Column("close_reason", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_incidents_status", "incidents", ["status"])
    op.create_index("ix_incidents_opened_at", "incidents", ["opened_at"])
    op.create_index("ix_incidents_status_domain", "incidents", ["status", "kind", "name"])
    with op.batch_alter_table("remediations") as batch:
        batch.add_column(sa.Column("incident_id", BigId, nullable=True))
        batch.create_foreign_key("fk_remediations_incident", "incidents", ["incident_id"], ["id"])
        batch.create_index("ix_remediations_incident_id", ["incident_id"])


def downgrade() -> None:
    with op.batch_alter_table("remediations") as batch:
        batch.drop_index("ix_remediations_incident_id")
        batch.drop_constraint("fk_remediations_incident", type_="foreignkey")
        batch.drop_column("incident_id")
    op.drop_table("incidents")
    op.drop_table("node_domains")
