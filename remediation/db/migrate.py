"""Run Alembic migrations from code (CLI `remediation db upgrade`, test fixtures, the demo).

The revision scripts are the ``remediation.migrations`` package (the top-level migrations/, linked into
the namespace); Alembic finds them as the package resource ``remediation.migrations:``, so this works
from an installed wheel as well as from a checkout, and needs no alembic.ini (the one at the repository root serves the plain ``alembic`` command).
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

SCRIPT_LOCATION = "remediation.migrations:"
# The advisory lock key migrations hold (any constant no other code of this database uses: "remediat").
MIGRATION_LOCK = int.from_bytes(b"remediat", "big") & 0x7FFF_FFFF_FFFF_FFFF


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``. On Postgres, under a session advisory lock: every API and worker pod runs
    this in an init container on start (deploy/README.md, "Upgrades"), so several may race; the first
    migrates, the others wait for it and then find nothing to do."""
    engine = create_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            command.upgrade(alembic_config(url), revision)
            return
        with engine.connect() as lock:
            lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            try:
                command.upgrade(alembic_config(url), revision)
            finally:
                lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
