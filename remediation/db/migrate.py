"""Run Alembic migrations from code (CLI `remediation db upgrade`, test fixtures, the demo).

The revision scripts are the ``migrations`` package, installed beside ``remediation``; Alembic finds them
as the package resource ``migrations:``, so this works from an installed wheel as well as from a
checkout, and needs no alembic.ini (the one at the repository root serves the plain ``alembic`` command).
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config

SCRIPT_LOCATION = "migrations:"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
