"""The event bus: a Redis stream that watchers append to and the ingest task drains.

Why a stream and not one Celery message per event: the ingest task reads events in batches (up to
``broker.ingest_batch``) and records each batch in one transaction, which is what lets a 2-core box
record thousands of events a second. Entries are acknowledged (XACK) only after the transaction that
recorded them commits; an ingest worker that dies leaves its entries pending, and the next ingest claims
them (XAUTOCLAIM) after ``broker.ingest_claim_idle_s``. Recording is idempotent (dedupe key), so a claim
that repeats work changes nothing.

Publishing is "XADD, then kick". A publisher on Redis only appends: its ACL user may XADD to the stream
and nothing else (deploy/base/redis/users.acl), so it cannot read, delete or trim events, nor put a task
on a Celery queue. The kick is the workers': their relay (workers.kick_relay) blocks on the stream's
tail, and on a new entry sets a short-lived kick key and, if it was the one to set it, sends the ingest
task. The ingest task deletes the key before its final read, so an event is either seen by the running
ingest or triggers a new one. A periodic beat task covers anything else. (A ``kick`` callable given
here, as tests and the embedded mode do, sets the key and kicks from the publisher instead.)

A batch (whatever one poll or one watch burst produced) goes to Redis as **one pipeline**: every XADD
(and a kick's SET NX) in one round trip. Production Redis runs with ``appendfsync always`` (see
docs/architecture.md), which fsyncs once per event-loop pass before it answers, so a pipelined batch pays
one fsync, where one XADD per event paid one each and capped publishing at about 900 events/s. The
outbox guarantee is unchanged: the caller drops its events only after this returns, i.e. after Redis
acknowledged (and, with ``always``, persisted) every entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from remediation.domain.events import NodeEvent

GROUP = "ingest"


class BusUnavailable(ConnectionError):
    """Redis cannot be reached; the caller keeps its events and retries."""


@dataclass(frozen=True)
class Keys:
    prefix: str

    @property
    def stream(self) -> str:
        return f"{self.prefix}:events"

    @property
    def kick(self) -> str:
        return f"{self.prefix}:ingest:kick"


class RedisEventBus:
    def __init__(
        self, client: redis.Redis, prefix: str, kick: Callable[[], None] | None = None
    ) -> None:
        self.client = client
        self.keys = Keys(prefix)
        self._kick = kick

    def publish(self, events: Iterable[NodeEvent]) -> int:
        """Append events to the stream; returns how many. Raises BusUnavailable."""
        batch = list(events)
        if not batch:
            return 0
        self._append([event.to_json() for event in batch])
        return len(batch)

    def publish_raw(self, payload: str) -> None:
        """Append an arbitrary payload (used by tests and `remediation report` to prove that a
        malformed payload is kept, not dropped)."""
        self._append([payload])

    def _append(self, payloads: list[str]) -> None:
        """XADD every payload and SET NX the kick key in one pipeline; kick the ingest if we set it."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for payload in payloads:
                pipe.xadd(self.keys.stream, {"e": payload})
            if self._kick is not None:
                pipe.set(self.keys.kick, "1", nx=True, px=5000)
            replies = pipe.execute()
        except redis.RedisError as exc:
            raise BusUnavailable(f"cannot publish to Redis: {exc}") from exc
        if self._kick is not None and replies[-1]:
            self._kick()
