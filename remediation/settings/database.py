"""``database``: where the faulty-node database lives (``REMEDIATION_DATABASE__*``)."""

from __future__ import annotations

from pydantic import Field

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
