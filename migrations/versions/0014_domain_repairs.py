"""Domain repairs: one ladder for a whole NVLink domain, and its steps

Adds ``domain_repairs`` (one row per repair of a domain: its trays, its ladder, where it is; one
running per domain) and ``domain_repair_steps`` (each step, written before it acts and closed after).

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

RUNNING = sa.text("status = 'running'")


def _when(name: str, nullable: bool = False) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "domain_repairs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(63), nullable=False, server_default="default"),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("trays", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("reporters", sa.JSON(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("fault_class", sa.String(32), nullable=False),
        sa.Column("fault_evidence", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("step", sa.String(32), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("rungs", sa.JSON(), nullable=False),
        sa.Column("ours", sa.JSON(), nullable=False),
        _when("opened_at"), _when("updated_at"), _when("next_run_at"),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        _when("lease_until", True), _when("closed_at", True),
        sa.Column("close_reason", sa.Text(), nullable=True),
        sa.Column("wait_reason", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.create_index("ix_domain_repairs_cluster", "domain_repairs", ["cluster"])
    op.create_index("ix_domain_repairs_status", "domain_repairs", ["status"])
    op.create_index("ix_domain_repairs_opened_at", "domain_repairs", ["opened_at"])
    op.create_index("ix_domain_repairs_status_next", "domain_repairs", ["status", "next_run_at"])
    op.create_index("uq_domain_repairs_one_running", "domain_repairs", ["cluster", "kind", "name"], unique=True,
                    postgresql_where=RUNNING, sqlite_where=RUNNING)
    op.create_table(
        "domain_repair_steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("repair_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("domain_repairs.id"), nullable=False),
        sa.Column("step", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        _when("started_at"), _when("finished_at", True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("provider_op", sa.JSON(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.create_index("ix_domain_repair_steps_repair", "domain_repair_steps", ["repair_id", "step", "attempt"])


def downgrade() -> None:
    op.drop_table("domain_repair_steps")
    op.drop_table("domain_repairs")
