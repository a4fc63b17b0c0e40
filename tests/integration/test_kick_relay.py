"""The kick relay starts the ingest when an event lands on any served cluster's stream, on real Redis."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import redis

from remediation.adapters.bus import Keys, RedisEventBus
from remediation.adapters.celery import INGEST_TASK
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import Settings
from remediation.workers.kick_relay import KickRelay
from tests.conftest import REDIS_URL


class SentTasks:
    """The relay's Celery app, at our dispatcher's boundary: the names of the tasks it was asked to send."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def send_task(self, name: str, **_: Any) -> None:
        self.names.append(name)


def until(check: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_an_event_on_a_named_clusters_stream_kicks_the_ingest(redis_client: redis.Redis, redis_prefix: str) -> None:
    settings = Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix},
                        clusters=[{"name": "west"}, {"name": "east"}])
    app = SentTasks()
    relay = KickRelay(settings, app)  # type: ignore[arg-type]
    relay.thread.start()
    try:
        # Barrier: the relay's first pass read the streams' tails and kicked what waited from before.
        assert until(lambda: app.names == [INGEST_TASK])
        redis_client.delete(Keys(redis_prefix).kick)  # as the ingest does before its last read
        bus = RedisEventBus(redis_client, redis_prefix, cluster="east")
        bus.publish([NodeEvent(source=Source.SLURM, node="gpu-node-1", kind=EventKind.UNHEALTHY, state="DOWN",
                               observed_at=datetime.now(UTC))])
        assert until(lambda: len(app.names) == 2), "east's event never kicked the ingest"
    finally:
        relay.stopping.set()
        relay.thread.join(timeout=5)
