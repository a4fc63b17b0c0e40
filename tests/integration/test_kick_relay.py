"""The kick relay starts the ingest when an event lands on any served cluster's stream, on real Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from remediation.adapters.bus import Keys, RedisEventBus
from remediation.adapters.celery import INGEST_TASK
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import Settings
from remediation.workers.kick_relay import KickRelay
from tests.conftest import REDIS_URL
from tests.integration.workerproc import wait_for


class SentTasks:
    """The relay's Celery app, at our dispatcher's boundary: the names of the tasks it was asked to send."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def send_task(self, name: str, **_: Any) -> None:
        self.names.append(name)


def test_an_event_on_a_named_clusters_stream_kicks_the_ingest(redis_client: redis.Redis, redis_prefix: str) -> None:
    settings = Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix},
                        clusters=[{"name": "west"}, {"name": "east"}])
    app = SentTasks()
    relay = KickRelay(settings, app)  # type: ignore[arg-type]
    relay.thread.start()
    try:
        # Barrier: the relay's first pass read the streams' tails and kicked what waited from before.
        wait_for(lambda: app.names == [INGEST_TASK], 5, "the relay's first pass")
        redis_client.delete(Keys(redis_prefix).kick)  # as the ingest does before its last read
        bus = RedisEventBus(redis_client, redis_prefix, cluster="east")
        bus.publish([NodeEvent(source=Source.SLURM, node="gpu-node-1", kind=EventKind.UNHEALTHY, state="DOWN",
                               observed_at=datetime.now(UTC))])
        wait_for(lambda: len(app.names) == 2, 5, "east's event to kick the ingest")
    finally:
        relay.stopping.set()
        relay.thread.join(timeout=5)
