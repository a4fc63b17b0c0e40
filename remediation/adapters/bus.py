"""The event bus: a Redis stream that watchers append to and the ingest task consumes.

Why a stream and not one Celery message per event: the ingest task reads events in batches (up to
``broker.ingest_batch``) and records each batch in one transaction, which is what lets a 2-core box
record thousands of events a second. Entries are acknowledged (XACK) only after the transaction that
recorded them commits; an ingest worker that dies leaves its entries pending, and the next ingest claims
them (XAUTOCLAIM) after ``broker.ingest_claim_idle_s``. Recording is idempotent (dedupe key), so a claim
that repeats work changes nothing.

Publishing is "XADD, then kick". A publisher on Redis only appends: its ACL user may XADD to its own stream
and nothing else (deploy/base/redis/users.acl), so it cannot read, delete or trim events, nor put a task
on a Celery queue. The kick is the workers': their relay (workers.kick_relay) blocks on the streams'
tails, and on a new entry sets a short-lived kick key and, if it was the one to set it, sends the ingest
task. The ingest task deletes the key before its final read, so an event is either seen by the running
ingest or triggers a new one. A periodic beat task covers anything else. (A ``kick`` callable given
here, as tests and the embedded mode do, sets the key and kicks from the publisher instead.)

A batch (whatever one poll or one watch burst produced) goes to Redis as **one pipeline**: every XADD
(and a kick's SET NX) in one round trip. Production Redis runs with ``appendfsync always`` (see
docs/architecture.md), which fsyncs once per event-loop pass before it answers, so a pipelined batch pays
one fsync, where one XADD per event paid one each and capped publishing at about 900 events/s. The
outbox guarantee is unchanged: the caller drops its events only after this returns, i.e. after Redis
acknowledged (and, with ``always``, persisted) every entry.

**Across a failover.** Under Redis Sentinel a primary can die with writes its replica never received.
With ``replica_acks`` (``broker.replica_acks``) the pipeline ends with ``WAIT``: publish returns only
once that many replicas hold the batch, and raises :class:`BusUnavailable` otherwise, so the caller
keeps the batch and sends it again (the dedupe key makes a repeat harmless). An acknowledged event is
then on a replica before the watcher forgets it, whichever server Sentinel promotes.

**Fenced.** A watcher's bus is :meth:`RedisEventBus.fenced_by` its leader lock: each event it publishes
carries the lock's fencing token, on the stream of its own (``<prefix>:events:slurm``, ``...:kube``),
the one its ACL user may append to; publishing without a held lock raises :class:`NotLeader` (see
remediation.adapters.lock and remediation.domain.fencing). The ingest knows each entry's publisher by
its stream, and never believes a field for it (remediation.domain.admission).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import redis

from remediation.domain.admission import Publisher
from remediation.domain.events import Fence, NodeEvent

GROUP = "ingest"


class BusUnavailable(ConnectionError):
    """Redis cannot be reached (or its replicas did not confirm); the caller keeps its events and retries."""


class NotLeader(BusUnavailable):
    """A fenced bus was asked to publish while its lock is not held; the caller keeps its events."""


class Fencing(Protocol):
    kind: str  # the lock's name, which is its publisher's

    def fence(self) -> Fence | None: ...


@dataclass(frozen=True)
class Keys:
    """The keys of one stream: the workers' own (``<prefix>:events``, which the ACL lets no watcher,
    API or beat write) or a publisher's (``<prefix>:events:<publisher>``, which only that watcher's
    Redis user may append to: the ingest knows who published an entry by where it is)."""

    prefix: str
    publisher: Publisher | None = None

    @property
    def stream(self) -> str:
        return f"{self.prefix}:events" if self.publisher is None else f"{self.prefix}:events:{self.publisher.value}"

    def every_stream(self) -> list[Keys]:
        """The workers' own stream and each publisher's: what the ingest reads."""
        return [Keys(self.prefix), *(Keys(self.prefix, p) for p in Publisher)]

    @property
    def kick(self) -> str:
        return f"{self.prefix}:ingest:kick"


class RedisEventBus:
    def __init__(
        self, client: redis.Redis, prefix: str, kick: Callable[[], None] | None = None,
        *, replica_acks: int = 0, replica_ack_timeout_ms: int = 1000,
    ) -> None:
        self.client = client
        self.keys = Keys(prefix)
        self._kick = kick
        self.replica_acks, self.replica_ack_timeout_ms = replica_acks, replica_ack_timeout_ms
        self._lock: Fencing | None = None

    def fenced_by(self, lock: Fencing) -> None:
        """Stamp every event published from now on with ``lock``'s fencing token, on the stream of the
        publisher the lock is named for (the one stream that watcher's Redis user may write)."""
        self._lock = lock
        self.keys = Keys(self.keys.prefix, Publisher(lock.kind))

    def publish(self, events: Iterable[NodeEvent]) -> int:
        """Append events to the stream; returns how many. Raises BusUnavailable (NotLeader when fenced
        by a lock that is not held)."""
        batch = list(events)
        if not batch:
            return 0
        if self._lock is not None:
            fence = self._lock.fence()
            if fence is None:
                raise NotLeader("not publishing: this watcher does not hold its leader lock")
            batch = [event.model_copy(update={"fence": fence}) for event in batch]
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
            if self.replica_acks > 0:
                pipe.wait(self.replica_acks, self.replica_ack_timeout_ms)
            replies = pipe.execute()
        except redis.RedisError as exc:
            raise BusUnavailable(f"cannot publish to Redis: {exc}") from exc
        if self.replica_acks > 0:
            confirmed = int(replies.pop())
            if confirmed < self.replica_acks:
                raise BusUnavailable(f"{confirmed} of {self.replica_acks} replica(s) confirmed the batch "
                                     f"within {self.replica_ack_timeout_ms} ms; keeping it to send again")
        if self._kick is not None and replies[-1]:
            self._kick()
