"""``broker``: Redis, holding the event stream and the Celery queues (``REMEDIATION_BROKER__*``).

Each component connects as its own Redis ACL user, named with its password in its URL
(``redis://USER:PASSWORD@HOST:6379/0``); the users and what each may do are in
``deploy/base/redis/users.acl``. A URL without a user is Redis's default user, as before.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import Field

from remediation.settings.base import Section


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
        None, description="Celery broker URL. Defaults to redis_url; 'memory://' for the embedded mode."
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
    beat_state_dir: str | None = Field(
        None,
        description="Directory of Celery beat's schedule state (when each periodic task last ran), "
        "for `remediation beat` and `worker -B`; created if missing. Unset: node-remediation-KEY_PREFIX "
        "under the system's temporary directory, never the directory the process started in. Losing "
        "it is safe: each periodic task then first runs one interval after start.",
    )

    @property
    def celery_url(self) -> str:
        return self.celery_broker_url or self.redis_url

    @property
    def beat_schedule_file(self) -> Path:
        """The file beat keeps its state in (``celerybeat-schedule`` under :attr:`beat_state_dir`)."""
        state_dir = self.beat_state_dir or Path(tempfile.gettempdir()) / f"node-remediation-{self.key_prefix}"
        return Path(state_dir) / "celerybeat-schedule"
