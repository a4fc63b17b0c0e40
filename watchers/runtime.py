"""What every watcher process shares: the bus it publishes to, its leader lock and clean shutdown.

A watcher's loop is: wait for the leader lock, observe, publish, sleep until the next poll or until
SIGTERM/SIGINT. ``Stopper.wait`` is an interruptible sleep, so a signal ends the process within one
poll at most, after it has released its lock.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import redis

from remediation.settings import Settings
from watchers.leader import LeaderLock
from workers.bus import RedisEventBus


class Stopper:
    """Set by SIGTERM or SIGINT; ``wait`` sleeps until the timeout or the signal."""

    def __init__(self, install: bool = True) -> None:
        self._event = threading.Event()
        if install and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()

    def stop(self) -> None:
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True if asked to stop."""
        return self._event.wait(timeout)


def redis_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker.redis_url, socket_timeout=5, socket_connect_timeout=5)


def make_bus(settings: Settings, client: redis.Redis | None = None) -> RedisEventBus:
    """The bus watchers publish to; new events kick the ingest task. ``memory://`` (embedded mode)
    gives the in-process bus with the same contract."""
    from workers.celery_app import kick_ingest

    if settings.broker.redis_url.startswith("memory://"):
        from workers.memstream import MemoryEventBus

        return MemoryEventBus(kick=kick_ingest)  # type: ignore[return-value]
    return RedisEventBus(client or redis_client(settings), settings.broker.key_prefix, kick=kick_ingest)


def make_lock(settings: Settings, kind: str, client: redis.Redis | None = None, ttl_s: float = 10.0) -> LeaderLock:
    if settings.broker.redis_url.startswith("memory://"):
        from workers.memstream import LocalLock

        return LocalLock()  # type: ignore[return-value]
    return LeaderLock(client or redis_client(settings), f"{settings.broker.key_prefix}:leader:{kind}", ttl_s)
