"""Queue depth for the dashboard and /metrics: events waiting in the stream and tasks in each queue."""

from __future__ import annotations

import redis

from remediation.adapters.bus import GROUP, Keys
from remediation.adapters.celery import INGEST_QUEUE, WORKFLOW_QUEUE
from remediation.adapters.factory import redis_client
from remediation.settings import Settings


def queue_depth(settings: Settings) -> dict[str, int]:
    if settings.broker.redis_url.startswith("memory://"):
        from remediation.adapters import memstream

        return {"events": memstream.pending()}
    client = redis_client(settings, timeout=2.0)  # a page renders without queue depths rather than wait
    keys = Keys(settings.broker.key_prefix)
    prefix = f"{settings.broker.key_prefix}:celery:"
    try:
        pipe = client.pipeline(transaction=False)
        pipe.xlen(keys.stream)
        pipe.llen(prefix + INGEST_QUEUE)
        pipe.llen(prefix + WORKFLOW_QUEUE)
        events, ingest, workflow = pipe.execute()
        try:
            pending = int(client.xpending(keys.stream, GROUP)["pending"])
        except redis.ResponseError:
            pending = 0
    except redis.RedisError:
        return {}
    finally:
        client.close()
    return {"events": int(events), "events_pending": pending, "ingest": int(ingest), "workflow": int(workflow)}
