"""``database``: where the faulty-node database lives (``REMEDIATION_DATABASE__*``).

An HA Postgres is named by every host in one URL,
``postgresql+psycopg://USER:PASSWORD@/DBNAME?host=pg-0:5432&host=pg-1:5432&target_session_attrs=read-write``.
A URL with several hosts must say ``target_session_attrs=read-write`` (or ``primary``): without it a
process could settle on a standby and fail every write, so it is refused at start-up.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

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
    connect_timeout_s: int = Field(
        5, ge=1, le=120,
        description="Seconds libpq waits for each host of the URL to answer a connect before it tries "
        "the next (Postgres only). Short, so that a primary that vanished without a reset (a powered-off "
        "machine) costs seconds, not the kernel's minutes, before the next host is tried.",
    )
    echo: bool = Field(False, description="Log every SQL statement (debugging only).")

    @field_validator("url")
    @classmethod
    def _a_url(cls, value: str) -> str:
        # Checked here so that a wrong value is named as this field at start-up (without its text,
        # which may hold a password) rather than failing later as a database error.
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value.strip()):
            raise ValueError("give an SQLAlchemy URL, e.g. postgresql+psycopg://user@host/dbname")
        query = value.partition("?")[2]
        hosts = re.findall(r"(?:^|&)host=([^&]*)", query)
        if len(hosts) + sum(h.count(",") for h in hosts) > 1 and not re.search(
                r"(?:^|&)target_session_attrs=(read-write|primary)(?:&|$)", query):
            raise ValueError("a URL naming several hosts must carry target_session_attrs=read-write, "
                             "or a process may settle on a standby and fail every write")
        return value.strip()
