"""Queue depth for the dashboard and /metrics: events waiting in the stream and tasks in each queue.

``events`` is the ingest consumer group's lag: entries it has not acknowledged, whether never
delivered or read and still pending (``events_pending``); ``requests`` holds what the API and beat ask. The stream may hold acknowledged history
besides (``broker.stream_max_len``), which waits for nothing and is not counted.

Why: docs/architecture.md#events-travel-on-a-redis-stream-not-one-celery-message-each
"""

from __future__ import annotations

import redis

from remediation.adapters.bus import Keys
from remediation.adapters.celery import (
    INGEST_QUEUE,
    REQUEST_QUEUE,
    WORKFLOW_QUEUE,
    isolate_queue,
    queue_lists,
)
from remediation.adapters.factory import redis_client
from remediation.adapters.stream import ingest_lag
from remediation.settings import Settings


def queue_depth(settings: Settings) -> dict[str, int]:
    if settings.broker.embedded:
        from remediation.adapters import memstream

        return {"events": memstream.pending()}
    client = redis_client(settings, timeout=2.0)  # a page renders without queue depths rather than wait
    keys = Keys(settings.broker.key_prefix, served=tuple(settings.fleet()))  # every served cluster's streams
    prefix = f"{settings.broker.key_prefix}:celery:"
    try:
        # Every priority's list of each queue; "workflow" counts each served cluster's isolate queue too.
        queues = {INGEST_QUEUE: [INGEST_QUEUE], REQUEST_QUEUE: [REQUEST_QUEUE],
                  WORKFLOW_QUEUE: [WORKFLOW_QUEUE, *(isolate_queue(c) for c in settings.fleet())]}
        pipe = client.pipeline(transaction=False)
        for names in queues.values():
            for name in names:
                for key in queue_lists(name):
                    pipe.llen(prefix + key)
        lengths = iter(pipe.execute())
        ingest, requests, workflow = (sum(int(next(lengths)) for name in names for _ in queue_lists(name))
                                      for names in queues.values())
        try:
            events, pending = ingest_lag(client, keys)
        except redis.ResponseError:  # no stream yet
            events, pending = 0, 0
    except redis.RedisError:
        return {}
    finally:
        client.close()
    return {"events": events, "events_pending": pending, "ingest": int(ingest), "workflow": int(workflow),
            "requests": int(requests)}
