"""The workers' kick relay: it starts the ingest task when an event lands on the stream.

A thread in each worker's main process blocks on the streams' tails, every served cluster's
(``XREAD BLOCK``); on a new entry it sets that cluster's kick key and, if it set it, sends that
cluster's ingest task. It retries once a second; beat's periodic ingest covers a relay that is down.

Why: docs/architecture.md#events-travel-on-a-redis-stream-not-one-celery-message-each
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import Celery, bootsteps

from remediation.adapters.bus import Keys
from remediation.adapters.celery import celery_dispatcher
from remediation.adapters.factory import redis_client
from remediation.adapters.stream import claim_kick, tail, wait_for_new
from remediation.settings import Settings

log = logging.getLogger(__name__)

BLOCK_MS = 1000  # how long one XREAD waits; also how soon a stop request is seen


class KickRelay:
    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.keys = Keys(settings.broker.key_prefix, served=tuple(settings.fleet()))  # every cluster served
        self.dispatcher = celery_dispatcher(settings, app)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="kick-relay", daemon=True)

    def run(self) -> None:
        client = redis_client(self.settings, timeout=BLOCK_MS / 1000 + 5)
        after: dict[str, str] | None = None
        while not self.stopping.is_set():
            try:
                if after is None:
                    after = tail(client, self.keys)
                    self.kick(client, self.keys.every_cluster())  # whatever waits from before this worker started
                elif wait_for_new(client, self.keys, after, block_ms=BLOCK_MS):
                    newest = tail(client, self.keys)
                    self.kick(client, advanced(self.keys, after, newest))
                    after = newest
            except redis.RedisError as exc:
                log.warning("kick relay cannot read the event stream, retrying: %s", exc)
                after = None
                self.stopping.wait(1.0)
        client.close()

    def kick(self, client: redis.Redis, clusters: list[Keys]) -> None:
        """Send each cluster's ingest whose kick key we set: one ingest per cluster, in parallel, so a
        lone fault in one cluster is read while another's storm is still being recorded."""
        for one in clusters:
            if claim_kick(client, one):
                self.dispatcher.kick_ingest(one.cluster)


def advanced(keys: Keys, before: dict[str, str], after: dict[str, str]) -> list[Keys]:
    """The clusters of ``keys`` with a stream whose newest entry changed between two :func:`tail` reads."""
    moved = {one.cluster for one in keys.every_stream() if before.get(one.stream) != after.get(one.stream)}
    return [one for one in keys.every_cluster() if one.cluster in moved]


class KickRelayStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Run the relay in the worker's main process while the worker runs.

    It starts after the pool and the embedded beat have forked their processes. A process forked while
    the relay's thread is inside an import (its first connection imports a codec in ``getaddrinfo``)
    inherits that module's import lock held by a thread it does not have, and blocks on its own first
    connection for ever: a beat that never sends a sweep, a pool child that never finishes a task.
    """

    requires = ("celery.worker.components:Pool", "celery.worker.components:Beat")

    def __init__(self, w: Any, **kwargs: Any) -> None:
        self.relay: KickRelay | None = None

    def start(self, w: Any) -> None:
        assert _settings is not None, "install() adds the step"
        self.relay = KickRelay(_settings, w.app)
        self.relay.thread.start()

    def stop(self, w: Any) -> None:
        if self.relay is not None:
            self.relay.stopping.set()
            self.relay.thread.join(timeout=BLOCK_MS / 1000 + 2)


_settings: Settings | None = None


def install(app: Celery, settings: Settings) -> None:
    """Give ``app``'s workers the relay, unless events live in process memory (the embedded bus kicks
    the ingest itself)."""
    global _settings
    _settings = settings
    if not settings.broker.embedded:
        app.steps["worker"].add(KickRelayStep)
