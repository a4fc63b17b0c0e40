"""``broker.sentinel``: find the Redis primary through Redis Sentinel (``REMEDIATION_BROKER__SENTINEL__*``).

Unset (no ``addresses``), every process talks to the one Redis ``broker.redis_url`` names. Set, the
sentinels name the primary of ``master`` for redis-py and for Celery's ``sentinel://`` transport, and
``broker.redis_url`` supplies only the ACL user, password, database and scheme.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from remediation.settings.base import Section

_ADDRESS = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")


class SentinelSettings(Section):
    """The sentinels that watch the broker's Redis, and the name they know its primary by."""

    addresses: list[str] = Field(
        default_factory=list,
        description="host:port of each sentinel (three or more, on separate machines, so that a "
        "majority can agree on a failover). Empty: no Sentinel, broker.redis_url is the server.",
    )
    master: str = Field(
        "mymaster",
        min_length=1,
        max_length=128,
        description="The name the sentinels monitor the primary under (`sentinel monitor NAME ...`).",
    )
    username: str | None = Field(
        None,
        description="ACL user to authenticate to the sentinels as (unset: no user, or the "
        "default user with `password`).",
    )
    password: SecretStr | None = Field(
        None,
        description="Password of the sentinels themselves (their `requirepass` or ACL user); "
        "unset when they ask for none. Never logged.",
    )

    @field_validator("addresses")
    @classmethod
    def _host_port(cls, value: list[str]) -> list[str]:
        for address in value:
            if not _ADDRESS.match(address):
                raise ValueError(f"{address!r} is not host:port (e.g. redis-sentinel-0:26379)")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.addresses)

    def hosts(self) -> list[tuple[str, int]]:
        """(host, port) of each sentinel, as redis-py's ``Sentinel`` takes them."""
        pairs = []
        for address in self.addresses:
            host, _, port = address.rpartition(":")
            pairs.append((host.strip("[]"), int(port)))
        return pairs

    def auth(self) -> dict[str, str]:
        """redis-py keywords that authenticate a connection to a sentinel (``sentinel_kwargs``)."""
        out: dict[str, str] = {}
        if self.username:
            out["username"] = self.username
        if self.password is not None:
            out["password"] = self.password.get_secret_value()
        return out
