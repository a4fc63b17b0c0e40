"""initial schema

Why: docs/running.md#schema-migrations

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "audit_log",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=253), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_target"), ["target"], unique=False)

    op.create_table(
        "control",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("dedupe_key", sa.String(length=512), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("reason_user", sa.String(length=128), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decision", sa.String(length=32), nullable=False),
        sa.Column("decision_reason", sa.Text(), nullable=False),
        sa.Column("remediation_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("dedupe_key"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_node_observed", ["node", "observed_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_events_observed_at"), ["observed_at"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_event_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("quarantine_reason", sa.Text(), nullable=True),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_status"), ["status"], unique=False)

    op.create_table(
        "rejected_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rejected_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rejected_events_received_at"), ["received_at"], unique=False)

    op.create_table(
        "remediations",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("ladder", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("wait_reason", sa.Text(), nullable=True),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"],
            ["nodes.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.create_index("ix_remediations_node_opened", ["node", "opened_at"], unique=False)
        batch_op.create_index("ix_remediations_status_next", ["status", "next_run_at"], unique=False)
        batch_op.create_index(
            "uq_remediations_one_open_per_node",
            ["node"],
            unique=True,
            postgresql_where=sa.text("status IN ('running', 'waiting')"),
            sqlite_where=sa.text("status IN ('running', 'waiting')"),
        )

    op.create_table(
        "remediation_steps",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("remediation_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("checks", sa.Integer(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_kind", sa.String(length=64), nullable=True),
        sa.Column("provider_op", sa.JSON(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["remediation_id"],
            ["remediations.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    with op.batch_alter_table("remediation_steps", schema=None) as batch_op:
        batch_op.create_index("ix_steps_remediation", ["remediation_id", "step", "attempt"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("remediation_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_steps_remediation")

    op.drop_table("remediation_steps")
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_remediations_one_open_per_node",
            postgresql_where=sa.text("status IN ('running', 'waiting')"),
            sqlite_where=sa.text("status IN ('running', 'waiting')"),
        )
        batch_op.drop_index("ix_remediations_status_next")
        batch_op.drop_index("ix_remediations_node_opened")

    op.drop_table("remediations")
    with op.batch_alter_table("rejected_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rejected_events_received_at"))

    op.drop_table("rejected_events")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_status"))

    op.drop_table("nodes")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_observed_at"))
        batch_op.drop_index("ix_events_node_observed")

    op.drop_table("events")
    op.drop_table("control")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_target"))
        batch_op.drop_index(batch_op.f("ix_audit_log_at"))

    op.drop_table("audit_log")
