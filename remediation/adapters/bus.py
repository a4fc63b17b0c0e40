"""The event bus: a Redis stream that watchers append to and the ingest task consumes.

Publishing is "XADD, then kick": a batch goes out as one pipeline, ending with ``WAIT`` when
``broker.replica_acks`` is set (else :class:`BusUnavailable`, and the caller keeps the batch). A watcher's
bus is :meth:`RedisEventBus.fenced_by` its leader lock: events carry the fencing token, on the watcher's
own stream. The kick is the workers' relay (:mod:`remediation.workers.kick_relay`), or a ``kick`` callable.

Why: docs/architecture.md#events-travel-on-a-redis-stream-not-one-celery-message-each
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import redis

from remediation.domain.admission import Publisher
from remediation.domain.events import Fence, NodeEvent
from remediation.vocabulary import DEFAULT_CLUSTER

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
    Redis user may append to: the ingest knows who published an entry by where it is). A cluster other
    than ``default`` has its keys under ``<prefix>:cluster:<name>``, so the ingest knows an entry's
    cluster by where it is too. ``served``: every cluster the workers read (empty: ``cluster``)."""

    prefix: str
    publisher: Publisher | None = None
    cluster: str = DEFAULT_CLUSTER
    served: tuple[str, ...] = ()

    @property
    def space(self) -> str:
        """Where this cluster's keys live: its streams and its leader locks."""
        return self.prefix if self.cluster == DEFAULT_CLUSTER else f"{self.prefix}:cluster:{self.cluster}"

    @property
    def stream(self) -> str:
        return f"{self.space}:events" if self.publisher is None else f"{self.space}:events:{self.publisher.value}"

    def every_stream(self) -> list[Keys]:
        """The workers' own stream and each publisher's, of every cluster served: what the ingest reads."""
        return [Keys(self.prefix, publisher, one.cluster) for one in self.every_cluster()
                for publisher in (None, *Publisher)]

    def every_cluster(self) -> list[Keys]:
        """The keys of each cluster served, one by one: each has its own ingest and kick."""
        return [Keys(self.prefix, cluster=cluster) for cluster in (self.served or (self.cluster,))]

    @property
    def kick(self) -> str:
        """Set while this cluster's ingest is asked for or running (:func:`~remediation.adapters.stream.claim_kick`)."""
        return f"{self.space}:ingest:kick"


def ours(event: NodeEvent, cluster: str) -> NodeEvent:
    """``event`` as this cluster's watcher publishes it: stamped with the cluster whose stream it goes on."""
    return event if event.cluster == cluster else event.model_copy(update={"cluster": cluster})


class RedisEventBus:
    def __init__(
        self, client: redis.Redis, prefix: str, kick: Callable[[], None] | None = None,
        *, replica_acks: int = 0, replica_ack_timeout_ms: int = 1000, cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.client = client
        self.keys = Keys(prefix, cluster=cluster)
        self._kick = kick
        self.replica_acks, self.replica_ack_timeout_ms = replica_acks, replica_ack_timeout_ms
        self._lock: Fencing | None = None

    def fenced_by(self, lock: Fencing) -> None:
        """Stamp every event published from now on with ``lock``'s fencing token, on the stream of the
        publisher the lock is named for (the one stream that watcher's Redis user may write)."""
        self._lock = lock
        self.keys = Keys(self.keys.prefix, Publisher(lock.kind), self.keys.cluster)

    def publish(self, events: Iterable[NodeEvent]) -> int:
        """Append events to the stream; returns how many. Raises BusUnavailable (NotLeader when fenced
        by a lock that is not held)."""
        batch = [ours(event, self.keys.cluster) for event in events]
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
