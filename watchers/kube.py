"""The Kubernetes watcher: Node conditions in, NodeEvents out (``python -m watchers.kube``).

Two threads, so that no wait can starve another:

- the **stream** thread does list+watch of Nodes, the way an informer does: list, then watch from the
  list's resourceVersion, resume each timed-out watch from the last resourceVersion seen (bookmarks
  included), relist on 410 Expired (the history moved past us) and relist every
  ``kube.resync_interval_s`` (a periodic level check, so a missed event costs latency, not
  correctness). Errors back off and relist. It only parses and queues; it publishes nothing.
- the **main** thread holds the leader lock, feeds the queued Nodes through the pure
  :class:`~remediation.domain.flap.FlapFilter`, and wakes on its own for the next hold deadline, the lock
  renewal or SIGTERM, even when the watch is silent. A condition that has held for
  ``kube.min_condition_s`` is published once; its end is published as HEALTHY. Each relist also
  re-publishes the bad conditions already published (same dedupe keys, so the ingest records them
  once): that covers an event lost to a Redis outage.

Only the leader watches. A standby waits for the lock; a leader that cannot renew stops its stream
and goes back to waiting. On SIGTERM the main loop returns within a fraction of a second, stops the
stream (closing its socket) and releases the lock. Events that could not be published (Redis down)
stay in an outbox and are retried on the next wake-up.

**Node names become Slurm node names before anything is published.** The rest of the service keys
everything on the Slurm node (it drains it, and resolves its Node again through ``kube.mapping``), so
a condition on Node ``gke-pool-abc-1`` is published once per Slurm node running there, with the Node
named in the reason. :class:`SlurmNames` holds the Node -> Slurm nodes map of the configured strategy:
``node`` is the identity, ``static`` inverts the mapping file (read by the adapter's
:class:`~remediation.adapters.kube.mapping.StaticMap`, so both sides agree), and ``pod`` inverts the slurmd pods'
``spec.nodeName``. A Node that hosts no Slurm node is none of our business: it is logged once, counted
and skipped (a later resync re-offers its condition, so a slurmd pod scheduled later is picked up).

For ``pod`` we LIST the slurmd pods (one request, namespace + label selector) on demand rather than
watch them: the RBAC we ask for grants pods ``list`` only, a healthy cluster then costs no pod
requests at all, and a pod watch would be a second stream to keep in sync for a map we read only
when a condition has held. The rule that makes the LIST trustworthy: a *new* condition is translated
only with a map listed after that condition became due, so a slurmd pod re-created on another Node
can never send a Node's problem to the wrong Slurm node (the workflow would then drain the wrong
node, and the adapter would restart the pod's new Node). LISTs are rate-limited to one per
``POD_LIST_INTERVAL_S``; what waits for one stays queued, as does everything while the map cannot be
read (API error, bad mapping file). An episode keeps the Slurm nodes it was first published for: its
re-publishes and its recovery go to them even after the remediation evicted the pod elsewhere, so
the dedupe keys (``k8s:SLURM_NODE@NODE:Type=Status:lastTransitionTime``) stay stable.
"""

from __future__ import annotations

import logging
import queue
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from remediation.adapters import logs
from remediation.adapters.bus import RedisEventBus
from remediation.adapters.factory import make_bus, make_lock
from remediation.adapters.kube.client import kube_client
from remediation.settings import Settings, load_settings
from watchers.health import WatcherHealth
from watchers.kube_publisher import Publisher
from watchers.kube_stream import Item, NodeStream
from watchers.runtime import Polls, Stopper

log = logging.getLogger("watchers.kube")


def _lead(
    settings: Settings, stopper: Stopper, bus: RedisEventBus, api: client.CoreV1Api, lock: Any,
    health: WatcherHealth, polls: Polls,
) -> None:
    """Watch and publish while we hold the lock; return on SIGTERM or when the lock is lost."""
    items: queue.Queue[Item] = queue.Queue()
    stream = NodeStream(api, settings, items, health)
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
    lock = make_lock(settings, "kube", client=bus.client, ttl_s=settings.kube.leader_ttl_s)
    health = health or WatcherHealth("kube", settings)
    server = health.serve()
    try:
        while not stopper.stopped:
            health.turned()
            if lock.acquire_or_renew():
                log.info("leader lock acquired; watching Nodes")
                health.leading(True)
                try:
                    _lead(settings, stopper, bus, api, lock, health, polls)
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
    settings = load_settings()
    logs.configure_from(settings)
    run(settings, Stopper())


if __name__ == "__main__":
    main()
