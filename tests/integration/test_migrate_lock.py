"""`remediation db upgrade` is safe to run from every pod at once (deploy/: an init container of each
worker and API pod): on Postgres it migrates under an advisory lock, so racing upgrades serialise and
the later ones find the schema at head."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory

from remediation.db.migrate import MIGRATION_LOCK, alembic_config
from tests.conftest import PG_ADMIN_URL
from tests.harness.clusters_migration import check_round_trip

ROOT = Path(__file__).resolve().parents[2]


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def empty_db() -> Iterator[str]:
    """A database with no schema at all (not the suite's migrated template)."""
    name = f"remmig_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_dsn(PG_ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_ADMIN_URL.rpartition('/')[0]}/{name}"
    with psycopg.connect(_dsn(PG_ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def upgrade_process(url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env |= {"REMEDIATION_DATABASE__URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(  # noqa: S603 - our own CLI, fixed argv
        [sys.executable, "-c", "from remediation.cli.main import main; main()", "db", "upgrade"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def head() -> str:
    return str(ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head())


def version(url: str) -> str | None:
    with psycopg.connect(_dsn(url)) as conn:
        exists = conn.execute("SELECT to_regclass('alembic_version')").fetchone()
        if exists is None or exists[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if row is None else str(row[0])


def waiting_on_the_lock(url: str) -> bool:
    with psycopg.connect(_dsn(url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return bool(row and row[0])


def test_an_upgrade_waits_for_the_one_holding_the_lock(empty_db: str) -> None:
    with psycopg.connect(_dsn(empty_db), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        proc = upgrade_process(empty_db)
        try:
            deadline = 60.0
            start = time.monotonic()
            while not waiting_on_the_lock(empty_db):
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() - start < deadline, "the upgrade never asked for the lock"
                time.sleep(0.05)
            assert version(empty_db) is None  # it waits: nothing migrated while another holds the lock
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, output
    assert version(empty_db) == head()


def test_racing_upgrades_all_succeed_and_migrate_once(empty_db: str) -> None:
    procs = [upgrade_process(empty_db) for _ in range(3)]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n---\n".join(outputs)
    assert version(empty_db) == head()


def test_the_clusters_migration_keeps_every_row_on_postgres(empty_db: str) -> None:
    """The same round trip as on SQLite (tests/unit/db/test_migrate.py), on Postgres's named keys."""
    check_round_trip(empty_db)
