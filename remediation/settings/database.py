"""``database``: where the faulty-node database lives (``REMEDIATION_DATABASE__*``)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from remediation.settings.base import Section


class DatabaseSettings(Section):
    """Where the faulty-node database lives."""
    url: str = Field(
        "sqlite:///./remediation.db",
        description="SQLAlchemy URL. Postgres (postgresql+psycopg://...) in production; the SQLite "
        "default is only for a first run and the demo.",
    )
    pool_size: int = Field(5, ge=1, le=100, description="Connections kept open per process.")
    echo: bool = Field(False, description="Log every SQL statement (debugging only).")

    @field_validator("url")
    @classmethod
    def _a_url(cls, value: str) -> str:
        # Checked here so that a wrong value is named as this field at start-up (without its text,
        # which may hold a password) rather than failing later as a database error.
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value.strip()):
            raise ValueError("give an SQLAlchemy URL, e.g. postgresql+psycopg://user@host/dbname")
        return value.strip()
