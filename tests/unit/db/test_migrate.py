"""Schema migrations on SQLite, the embedded default (Postgres: tests/integration/test_migrate_lock.py)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.clusters_migration import check_round_trip


def test_the_clusters_migration_keeps_every_row_and_undoes_only_when_one_cluster_is_left(tmp_path: Path) -> None:
    check_round_trip(f"sqlite:///{tmp_path / 'm.db'}")
