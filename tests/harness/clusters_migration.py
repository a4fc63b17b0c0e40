"""The clusters migration (0012) on a database with rows in it, for SQLite and Postgres alike."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, text

from remediation.db.migrate import downgrade, upgrade

ROWS = [
    "INSERT INTO nodes (name, status, status_reason, first_seen_at, updated_at) "
    "VALUES ('gpu-node-0', 'healthy', '', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
    "INSERT INTO remediations (node, cause, source, status, step, ladder, opened_at, updated_at, context) "
    "VALUES ('gpu-node-0', 'xid 79', 'slurm', 'running', 'slurm_drain', 0, CURRENT_TIMESTAMP, "
    "CURRENT_TIMESTAMP, '{}')",
    "INSERT INTO control (key, value, updated_at) VALUES ('paused', '{}', CURRENT_TIMESTAMP)",
]


def check_round_trip(url: str) -> None:
    """Earlier rows become cluster ``default``; a second cluster's node of the same name fits; a
    downgrade refuses while it is there and restores the one-cluster keys once it is gone."""
    upgrade(url, "0011")
    engine = create_engine(url)
    with engine.begin() as conn:
        for row in ROWS:
            conn.execute(text(row))
    upgrade(url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT cluster, node FROM remediations")).all() == [("default", "gpu-node-0")]
        assert conn.execute(text("SELECT cluster FROM control")).scalars().all() == ["default"]
        conn.execute(text("INSERT INTO nodes (cluster, name, status, status_reason, first_seen_at, updated_at) "
                          "VALUES ('east', 'gpu-node-0', 'healthy', '', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    assert inspect(engine).get_pk_constraint("nodes")["constrained_columns"] == ["cluster", "name"]
    with pytest.raises(RuntimeError, match="rows of clusters other than 'default' in nodes"):
        downgrade(url, "0011")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM nodes WHERE cluster = 'east'"))
    downgrade(url, "0011")
    engine.dispose()
    engine = create_engine(url)
    assert inspect(engine).get_pk_constraint("nodes")["constrained_columns"] == ["name"]
    with engine.begin() as conn:
        assert conn.execute(text("SELECT node FROM remediations")).scalars().all() == ["gpu-node-0"]
    engine.dispose()
