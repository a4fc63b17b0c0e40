"""Queue depth counts every task waiting: at each message priority, on each cluster's isolate queue, and
each served cluster's events, on real Redis."""

from __future__ import annotations

from datetime import UTC, datetime

import redis
from kombu import Exchange, Queue

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.celery import WORKFLOW_QUEUE, CeleryDispatcher, isolate_queue, make_app
from remediation.adapters.queues import queue_depth
from remediation.adapters.stream import ensure_group
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings
from remediation.workers.context import Runtime
from tests.conftest import REDIS_URL


def test_every_waiting_task_and_event_is_counted(redis_client: redis.Redis, redis_prefix: str) -> None:
    settings = Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix},
                        clusters=[{"name": "west"}, {"name": "east"}])
    app = make_app(settings)
    with app.connection_for_write() as conn:  # as a worker serving both declares them
        for name in (WORKFLOW_QUEUE, isolate_queue("west"), isolate_queue("east")):
            Queue(name, Exchange(name), routing_key=name)(conn.default_channel).declare()
    dispatcher = CeleryDispatcher(app, isolate_batch=2)
    dispatcher.steps([FollowUp(1, "slurm_drain"), FollowUp(2, "slurm_drain"), FollowUp(3, "return")], "west")
    dispatcher.steps([FollowUp(4, "slurm_drain")], "east")
    ensure_group(redis_client, Runtime(settings).keys)
    RedisEventBus(redis_client, redis_prefix, cluster="east").publish(
        [NodeEvent(source=Source.SLURM, node="gpu-node-1", kind=EventKind.UNHEALTHY, state="DOWN",
                   observed_at=datetime.now(UTC))])
    depth = queue_depth(settings)
    assert depth["workflow"] == 3  # west's isolate task, east's, and west's step behind them
    assert depth["events"] == 1  # east's event, not yet read
