"""The kick relay starts each cluster's own ingest when an event lands on that cluster's streams, on
real Redis."""

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
    """The relay's Celery app, at our dispatcher's boundary: each task it was asked to send, with the
    cluster it names (None: every cluster)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None]] = []

    def send_task(self, name: str, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
        self.sent.append((name, (kwargs or {}).get("cluster")))


def fault(node: str) -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="DOWN",
                     observed_at=datetime.now(UTC))


def test_an_event_kicks_the_ingest_of_its_own_cluster_only(redis_client: redis.Redis, redis_prefix: str) -> None:
    settings = Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix},
                        clusters=[{"name": "west"}, {"name": "east"}])
    app = SentTasks()
    relay = KickRelay(settings, app)  # type: ignore[arg-type]
    relay.thread.start()
    try:
        # Barrier: the relay's first pass read the streams' tails and kicked each cluster's ingest for
        # what waited from before.
        wait_for(lambda: len(app.sent) == 2, 5, "the relay's first pass")
        assert sorted(app.sent) == [(INGEST_TASK, "east"), (INGEST_TASK, "west")]
        for name in ("west", "east"):  # as each ingest does before its last read
            redis_client.delete(Keys(redis_prefix, cluster=name).kick)
        RedisEventBus(redis_client, redis_prefix, cluster="east").publish([fault("gpu-node-1")])
        wait_for(lambda: len(app.sent) == 3, 5, "east's event to kick east's ingest")
        assert app.sent[2] == (INGEST_TASK, "east")
        # East's ingest is asked for and has not run: its kick stands, so another east event sends
        # nothing more; a west event sends west's ingest, and the relay's pass over both is a barrier.
        RedisEventBus(redis_client, redis_prefix, cluster="east").publish([fault("gpu-node-2")])
        RedisEventBus(redis_client, redis_prefix, cluster="west").publish([fault("gpu-node-3")])
        wait_for(lambda: len(app.sent) == 4, 5, "west's event to kick west's ingest")
        assert app.sent[3] == (INGEST_TASK, "west")
        assert redis_client.exists(Keys(redis_prefix, cluster="east").kick)
    finally:
        relay.stopping.set()
        relay.thread.join(timeout=5)
    assert len(app.sent) == 4, app.sent
