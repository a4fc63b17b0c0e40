"""Domain sizes: the smallest block Slurm plans jobs with, beside each node's block

Adds ``node_domains.size``: for a topology/block block, the smallest block size (``BlockSizes``), so
that the service can say when a block's healthy nodes are fewer than the smallest job it can place
there. NULL for every other domain, and for every row written before.

Why: docs/policy.md#a-partial-domain

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("node_domains", sa.Column("size", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("node_domains", "size")
