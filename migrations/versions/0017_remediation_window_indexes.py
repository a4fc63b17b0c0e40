"""Indexes for the storm breaker's window: remediations by when they opened

Admission reads, on every claim, how many nodes failed in the breaker's window and when the last
remediation opened; the correlated-fault rule reads the window's remediations on every event. Without
these indexes each read scanned every remediation ever opened, a cost that grew with the history.
``(incident_id, opened_at)`` serves the window's reads (``incident_id IS NULL`` and ``opened_at >``);
``opened_at`` serves the newest opening.

Why: docs/architecture.md#admission

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_remediations_incident_opened", "remediations", ["incident_id", "opened_at"])
    op.create_index("ix_remediations_opened", "remediations", ["opened_at"])


def downgrade() -> None:
    op.drop_index("ix_remediations_opened", table_name="remediations")
    op.drop_index("ix_remediations_incident_opened", table_name="remediations")
