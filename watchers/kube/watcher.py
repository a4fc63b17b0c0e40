"""The Kubernetes watcher process: Node conditions in, NodeEvents out (``python -m remediation.watchers.kube.watcher``).

:func:`run` waits for the leader lock; while it holds it, :func:`_lead` runs the list+watch thread
(:mod:`remediation.watchers.kube.stream`) and, on this thread, the :class:`~remediation.watchers.kube.publisher.Publisher`. A
leader that cannot renew stands by again; SIGTERM stops the stream and releases the lock.

Why: docs/kubernetes.md#the-kubernetes-watcher
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from remediation.adapters import logs
from remediation.adapters.bus import RedisEventBus
from remediation.adapters.factory import make_bus, make_lock
from remediation.adapters.kube.client import kube_client
from remediation.settings import Settings, load_watched
from remediation.watchers.health import WatcherHealth
from remediation.watchers.kube.publisher import Publisher
from remediation.watchers.kube.stream import Item, NodeStream
from remediation.watchers.runtime import Polls, Stopper

log = logging.getLogger("remediation.watchers.kube.watcher")


@dataclass(frozen=True)
class Hooks:
    """What the watcher's loop stops on and reports to: SIGTERM (``stopper``), its health, its passes."""

    stopper: Stopper
    health: WatcherHealth
    polls: Polls


def _lead(settings: Settings, bus: RedisEventBus, *, api: client.CoreV1Api, lock: Any, hooks: Hooks) -> None:
    """Watch and publish while we hold the lock; return on SIGTERM or when the lock is lost."""
    stopper, health, polls = hooks.stopper, hooks.health, hooks.polls
    items: queue.Queue[Item] = queue.Queue(maxsize=settings.kube.queue_max_items)
    stream = NodeStream(api, settings, items, health=health)
    publisher = Publisher(settings, bus, api)
    renew_every = settings.kube.leader_ttl_s / 3
    renew_at = time.monotonic() + renew_every
    stream.start()
    try:
        while not stopper.stopped:
            health.turned()
            due = publisher.flap.next_due()
            wait = min(renew_at - time.monotonic(), 0.5)  # 0.5 s bounds the SIGTERM latency
            if due is not None:
                wait = min(wait, (due - datetime.now(UTC)).total_seconds())
            try:
                publisher.handle(items.get(timeout=max(wait, 0.0)))
                while True:
                    publisher.handle(items.get_nowait())
            except queue.Empty:
                pass
            decided = publisher.flap.clock()  # flush decides at this moment or later
            publisher.flush()
            polls.tick(decided)
            if time.monotonic() >= renew_at:
                if not lock.acquire_or_renew():
                    log.warning("lost the leader lock; standing by")
                    return
                renew_at = time.monotonic() + renew_every
    finally:
        stream.stop()
        stream.join(timeout=2)


def run(
    settings: Settings,
    stopper: Stopper,
    bus: RedisEventBus | None = None,
    *,
    api: client.CoreV1Api | None = None,
    health: WatcherHealth | None = None,
    polls: Polls | None = None,
) -> None:
    """Run until ``stopper`` is set: wait for the leader lock, then watch and publish. ``health`` (made
    here, and served on ``health.port``, unless given) hears of every turn, lead and list or watch response.
    ``polls`` counts the leader's passes, each stamped with the clock its flap filter decided with."""
    polls = polls or Polls()
    bus = bus or make_bus(settings)
    api = api or kube_client(settings.kube)
    lock = make_lock(settings, "kube", client=bus.client, ttl_s=settings.kube.leader_ttl_s, bus=bus)
    health = health or WatcherHealth("kube", settings)
    server = health.serve()
    try:
        while not stopper.stopped:
            health.turned()
            if lock.acquire_or_renew():
                log.info("leader lock acquired; watching Nodes")
                health.leading(True)
                try:
                    _lead(settings, bus, api=api, lock=lock, hooks=Hooks(stopper, health, polls))
                finally:
                    health.leading(False)
            else:
                polls.tick(datetime.now(UTC))  # a standby's pass: it asked for the lock and was refused
                stopper.wait(min(1.0, settings.kube.leader_ttl_s / 3))
    finally:
        lock.release()
        if server is not None:
            server.stop()
        log.info("kube watcher stopped")


def main() -> None:
    settings = load_watched()
    logs.configure_from(settings)
    if settings.kube.backend == "none":
        raise SystemExit(
            "kube.backend is none: this site has no Kubernetes, so there is no Kubernetes watcher to run"
        )
    run(settings, Stopper())


if __name__ == "__main__":
    main()
