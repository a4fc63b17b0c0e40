"""The embedded event bus: the Redis stream's contract, in process memory.

Used when ``broker.redis_url`` is ``memory://`` (the embedded default and the demo), together with
Celery's ``memory://`` transport. Same semantics as remediation.adapters.bus + remediation.adapters.stream: publish appends and
kicks the ingest task; ``consume`` hands batches to a handler and drops them only after it returned (a
handler that raises leaves them queued). One process only, which is all the embedded mode promises.

Why: docs/architecture.md#embedded-mode-and-the-simulated-cluster
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from remediation.adapters.bus import ours
from remediation.domain.admission import Published
from remediation.domain.events import NodeEvent
from remediation.vocabulary import DEFAULT_CLUSTER

_queue: deque[Published] = deque()
_lock = threading.Lock()


class MemoryEventBus:
    """One cluster's publisher: what it appends is read as that cluster's, as a Redis stream's would be."""

    def __init__(self, kick: Callable[[], None] | None = None, *, cluster: str = DEFAULT_CLUSTER) -> None:
        self._kick = kick
        self.cluster = cluster
        self.client = None  # watchers build no Redis lock from it (see LocalLock)

    def fenced_by(self, lock: object) -> None:
        """One process holds every lock here (LocalLock): there is no other leader to fence off."""

    def publish(self, events: Iterable[NodeEvent]) -> int:
        batch = [Published(ours(e, self.cluster).to_json().encode(), None, self.cluster) for e in events]
        with _lock:
            _queue.extend(batch)
        if batch and self._kick is not None:
            self._kick()
        return len(batch)

    def publish_raw(self, payload: str) -> None:
        with _lock:
            _queue.append(Published(payload.encode(), None, self.cluster))
        if self._kick is not None:
            self._kick()


def consume(handle: Callable[[Sequence[bytes]], None], batch: int) -> int:
    total = 0
    with _lock:  # one consumer at a time keeps per-node order
        while _queue:
            chunk = [_queue[i] for i in range(min(batch, len(_queue)))]
            handle(chunk)
            for _ in chunk:
                _queue.popleft()
            total += len(chunk)
    return total


def pending() -> int:
    return len(_queue)


class LocalLock:
    """A leader lock for a single process: always held."""

    held = True

    def acquire_or_renew(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def fence(self) -> None:
        return None
