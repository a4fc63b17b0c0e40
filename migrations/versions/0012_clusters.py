"""Clusters: every row names the cluster it belongs to, and a node is (cluster, name)

Adds ``cluster`` (``default`` for every row already there, so a one-cluster site changes nothing) to
nodes, events, rejected_events, remediations, audit_log, control, node_domains, incidents, validations,
hardware_sightings and leader_fences. The keys that named a node, a control row, a domain report or a
leader lock now name its cluster first, and one open remediation is allowed per (cluster, node). A
downgrade refuses while any row names another cluster, then restores the one-cluster keys.

Why: docs/architecture.md#one-service-many-clusters

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Tables whose rows gain a cluster beside their own key (indexed), and those whose key it joins.
INDEXED = ("events", "rejected_events", "remediations", "audit_log", "incidents", "validations",
           "hardware_sightings")
KEYED = {"nodes": ("name",), "control": ("key",), "node_domains": ("node", "source", "kind"),
         "leader_fences": ("lock",)}
# SQLite's constraints have no names; batch mode reflects them under these (Postgres names its own).
CONVENTION = {"pk": "%(table_name)s_pkey", "uq": "%(table_name)s_%(column_0_name)s_key",
              "fk": "%(table_name)s_%(column_0_name)s_fkey"}
OPEN = sa.text("status IN ('running', 'waiting')")


def _column() -> sa.Column:  # type: ignore[type-arg]
    return sa.Column("cluster", sa.String(63), nullable=False, server_default="default")


def upgrade() -> None:
    with op.batch_alter_table("remediations", naming_convention=CONVENTION) as batch:
        batch.drop_constraint("remediations_node_fkey", type_="foreignkey")
    for table, key in KEYED.items():
        with op.batch_alter_table(table, naming_convention=CONVENTION, recreate="auto") as batch:
            batch.add_column(_column())
            batch.drop_constraint(f"{table}_pkey", type_="primary")
            batch.create_primary_key(f"{table}_pkey", ["cluster", *key])
    for table in INDEXED:
        op.add_column(table, _column())
        op.create_index(f"ix_{table}_cluster", table, ["cluster"])
    _rekey(("cluster",))
    with op.batch_alter_table("remediations", naming_convention=CONVENTION) as batch:
        batch.create_foreign_key("fk_remediations_node", "nodes", ["cluster", "node"], ["cluster", "name"])


def _rekey(cluster: tuple[str, ...]) -> None:
    """The node-keyed indexes and constraints, with ``cluster`` first (or without it)."""
    op.drop_index("ix_node_domains_domain", table_name="node_domains")
    op.create_index("ix_node_domains_domain", "node_domains", [*cluster, "kind", "name"])
    op.drop_index("ix_events_node_observed", table_name="events")
    op.create_index("ix_events_node_observed", "events", [*cluster, "node", "observed_at"])
    op.drop_index("uq_remediations_one_open_per_node", table_name="remediations")
    op.create_index("uq_remediations_one_open_per_node", "remediations", [*cluster, "node"], unique=True,
                    postgresql_where=OPEN, sqlite_where=OPEN)
    op.drop_index("ix_remediations_node_opened", table_name="remediations")
    op.create_index("ix_remediations_node_opened", "remediations", [*cluster, "node", "opened_at"])
    old, new = ("events_dedupe_key_key", "uq_events_cluster_dedupe_key")[::1 if cluster else -1]
    with op.batch_alter_table("events", naming_convention=CONVENTION) as batch:
        batch.drop_constraint(old, type_="unique")
        batch.create_unique_constraint(new, [*cluster, "dedupe_key"])


def downgrade() -> None:
    others = [t for t in (*INDEXED, *KEYED)
              if op.get_bind().execute(sa.text(f"SELECT 1 FROM {t} WHERE cluster <> 'default' LIMIT 1")).first()]
    if others:
        raise RuntimeError(f"rows of clusters other than 'default' in {', '.join(others)}: a one-cluster "
                           "schema cannot hold them")
    with op.batch_alter_table("remediations", naming_convention=CONVENTION) as batch:
        batch.drop_constraint("fk_remediations_node", type_="foreignkey")
    _rekey(())
    for table, key in KEYED.items():
        with op.batch_alter_table(table, naming_convention=CONVENTION, recreate="auto") as batch:
            batch.drop_constraint(f"{table}_pkey", type_="primary")
            batch.create_primary_key(f"{table}_pkey", list(key))
            batch.drop_column("cluster")
    with op.batch_alter_table("remediations", naming_convention=CONVENTION) as batch:
        batch.create_foreign_key("remediations_node_fkey", "nodes", ["node"], ["name"])
    for table in INDEXED:
        op.drop_index(f"ix_{table}_cluster", table_name=table)
        op.drop_column(table, "cluster")
