"""``broker``: Redis, holding the event stream and the Celery queues (``REMEDIATION_BROKER__*``).

Each component connects as its own Redis ACL user named in its URL
(``redis://USER:PASSWORD@HOST:6379/0``; users in ``deploy/base/redis/users.acl``); ``rediss://`` speaks
TLS verified against :attr:`BrokerSettings.ca_file`. ``replica_acks`` makes writes that must not be
lost wait until that many replicas hold them. Sentinel: :mod:`remediation.settings.sentinel`.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from remediation.settings.base import Section
from remediation.settings.sentinel import SentinelSettings


class BrokerSettings(Section):
    """Redis: the event stream and the Celery queues."""
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding the event stream and the Celery queues.",
    )
    key_prefix: str = Field(
        "remediation",
        description="Prefix of every Redis key we own, so several deployments (or test runs) can share "
        "one Redis without seeing each other's events.",
    )
    celery_broker_url: str | None = Field(
        None, description="Celery broker URL. Defaults to redis_url (under Sentinel, a sentinel:// URL "
        "naming every sentinel, built from it); 'memory://' for the embedded mode."
    )
    sentinel: SentinelSettings = Field(
        default_factory=SentinelSettings,
        description="Redis Sentinel: the sentinels that name the primary (none: redis_url is the server).",
    )
    replica_acks: int = Field(
        0, ge=0, le=8,
        description="Replicas that must hold an event (and a new leader's fencing token) before its "
        "writer counts it as written (Redis WAIT). 0, the default, suits a single Redis, which has no "
        "replica to wait for; under Sentinel set 1, or an acknowledged event can die with a primary "
        "before it reached the replica that takes over. While fewer replicas answer, publishers keep "
        "their events and retry: nothing is lost, events wait.",
    )
    replica_ack_timeout_ms: int = Field(
        1000, ge=10, le=60_000,
        description="Milliseconds a writer waits for replica_acks replicas before it counts the write "
        "as not done and retries (its events stay in its outbox; a repeat is deduplicated).",
    )
    ca_file: str | None = Field(
        None,
        description="PEM file of the CA that signed Redis's TLS certificate, for rediss:// URLs (the "
        "event bus, the leader lock and Celery's broker). Unset: the system's trusted CAs; the "
        "server's certificate is verified either way, never skipped.",
    )
    visibility_timeout_s: int = Field(
        900,
        ge=60,
        description="Seconds before Redis redelivers an unacknowledged task. Must exceed the longest "
        "countdown any step schedules (steps never sleep; see workflow.max_wait_s).",
    )
    ingest_batch: int = Field(
        500, ge=1, le=10_000, description="Events read from the stream per ingest transaction."
    )
    ingest_claim_idle_s: int = Field(
        60,
        ge=1,
        description="Seconds an event may sit read-but-unacknowledged (its consumer died) before "
        "another ingest task claims it.",
    )
    stream_max_len: int = Field(
        0,
        ge=0,
        description="Entries of acknowledged history the event stream keeps, for a look at what went "
        "through (0: none; the database, not Redis, is the record). Entries some consumer group has "
        "not read, or read but not acknowledged, are never trimmed, however many: "
        "remediation_queue_depth{queue=\"events\"} counts the ingest group's, and an alert fires on it.",
    )
    max_event_bytes: int = Field(
        65_536,
        ge=1024,
        description="Largest event payload, in bytes, the ingest records. A larger one is rejected "
        "whole (a rejected_events row and a log line naming node and size), never cut to fit; 64 KiB "
        "is far above any event a watcher writes (a Slurm reason is at most a few hundred bytes).",
    )
    max_clock_skew_s: int = Field(
        300,
        ge=0,
        description="Seconds an event's observed_at (or since, or published_at) may be ahead of the "
        "ingest's clock. Further ahead, the event is refused (a rejected_events row says why); within "
        "it, a future observed_at is clamped to the ingest's clock, so it never counts as fresher than "
        "now. Five minutes is far above the drift of NTP-synced hosts and far below any policy window.",
    )
    max_event_age_s: int = Field(
        86_400,
        ge=60,
        description="Seconds an event's observed_at may be behind the ingest's clock; an older event "
        "is refused. A day covers a watcher's outbox held through a long Redis outage; an older "
        "condition that still holds comes again with the watcher's next resync, observed anew.",
    )
    beat_state_dir: str | None = Field(
        None,
        description="Directory of Celery beat's schedule state (when each periodic task last ran), "
        "for `remediation beat` and `worker -B`; created if missing. Unset: node-remediation-KEY_PREFIX "
        "under the system's temporary directory, never the directory the process started in. Losing "
        "it is safe: each periodic task then first runs one interval after start.",
    )

    @property
    def embedded(self) -> bool:
        """The event stream lives in process memory (``redis_url`` is ``memory://``): the embedded
        mode, decided here once from the URL's scheme."""
        return urlsplit(self.redis_url).scheme == "memory"

    @property
    def celery_embedded(self) -> bool:
        """Celery's broker is its in-process ``memory://`` transport."""
        return urlsplit(self.celery_url).scheme == "memory"

    @property
    def celery_url(self) -> str:
        if self.celery_broker_url:
            return self.celery_broker_url
        if not self.sentinel.enabled:
            return self.redis_url
        # kombu's Sentinel transport: one sentinel:// URL per sentinel, joined by ';'. The first one's
        # user and password authenticate to the primary it finds (the component's ACL user).
        url = urlsplit(self.redis_url)
        auth = url.netloc.rpartition("@")[0]
        return ";".join(f"sentinel://{auth + '@' if auth else ''}{address}{url.path or '/0'}"
                        for address in self.sentinel.addresses)

    def celery_tls(self) -> dict[str, Any]:
        """Celery's TLS keywords: the broker URL's, or under Sentinel the primary's (redis_url's scheme)."""
        return self.tls(self.redis_url if self.celery_url.startswith("sentinel://") else self.celery_url)

    def celery_transport_options(self) -> dict[str, Any]:
        """kombu's transport options for :attr:`celery_url` (Sentinel's master name and auth)."""
        options: dict[str, Any] = {"visibility_timeout": self.visibility_timeout_s,
                                   "global_keyprefix": f"{self.key_prefix}:celery:"}
        if self.celery_url.startswith("sentinel://"):
            options["master_name"] = self.sentinel.master
            options["sentinel_kwargs"] = self.sentinel_kwargs(timeout=5.0)
        return options

    def sentinel_kwargs(self, timeout: float) -> dict[str, Any]:
        """redis-py keywords for a connection to a sentinel: its auth, TLS when the broker speaks it
        (sentinels beside a TLS Redis speak TLS too), and ``timeout`` seconds to connect or answer."""
        tls = self.tls(self.redis_url)
        return {"socket_timeout": timeout, "socket_connect_timeout": timeout, **self.sentinel.auth(),
                **({"ssl": True, **tls} if tls else {})}

    def tls(self, url: str) -> dict[str, Any]:
        """redis-py's (and kombu's ``broker_use_ssl``) TLS keywords for ``url``: none for redis://;
        for rediss://, a required and verified server certificate, signed by :attr:`ca_file` if set."""
        if not url.startswith("rediss://"):
            return {}
        return {"ssl_cert_reqs": ssl.CERT_REQUIRED, **({"ssl_ca_certs": self.ca_file} if self.ca_file else {})}

    @property
    def beat_schedule_file(self) -> Path:
        """The file beat keeps its state in (``celerybeat-schedule`` under :attr:`beat_state_dir`)."""
        state_dir = self.beat_state_dir or Path(tempfile.gettempdir()) / f"node-remediation-{self.key_prefix}"
        return Path(state_dir) / "celerybeat-schedule"
