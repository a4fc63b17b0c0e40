"""The Kubernetes watcher: Node conditions in, NodeEvents out (``python -m watchers.kube``).

Two threads, so that no wait can starve another:

- the **stream** thread does list+watch of Nodes, the way an informer does: list, then watch from the
  list's resourceVersion, resume each timed-out watch from the last resourceVersion seen (bookmarks
  included), relist on 410 Expired (the history moved past us) and relist every
  ``kube.resync_interval_s`` (a periodic level check, so a missed event costs latency, not
  correctness). Errors back off and relist. It only parses and queues; it publishes nothing.
- the **main** thread holds the leader lock, feeds the queued Nodes through the pure
  :class:`~remediation.flap.FlapFilter`, and wakes on its own for the next hold deadline, the lock
  renewal or SIGTERM, even when the watch is silent. A condition that has held for
  ``kube.min_condition_s`` is published once; its end is published as HEALTHY. Each relist also
  re-publishes the bad conditions already published (same dedupe keys, so the ingest records them
  once): that covers an event lost to a Redis outage.

Only the leader watches. A standby waits for the lock; a leader that cannot renew stops its stream
and goes back to waiting. On SIGTERM the main loop returns within a fraction of a second, stops the
stream (closing its socket) and releases the lock. Events that could not be published (Redis down)
stay in an outbox and are retried on the next wake-up.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from remediation.events import NodeEvent, Source
from remediation.flap import Change, Condition, FlapFilter
from remediation.settings import Settings, load_settings
from watchers.runtime import Stopper, make_bus, make_lock
from workers.adapters.kube import kube_client
from workers.bus import BusUnavailable, RedisEventBus

log = logging.getLogger("watchers.kube")

Item = tuple[str, Any]  # ("RELIST", [node, ...]) or ("ADDED"|"MODIFIED"|"DELETED", node)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def conditions_of(node: dict[str, Any]) -> list[Condition]:
    return [
        Condition(
            c["type"], c.get("status", ""), c.get("message") or "", parse_time(c.get("lastTransitionTime"))
        )
        for c in (node.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and "type" in c
    ]


def to_event(change: Change) -> NodeEvent:
    return NodeEvent(
        source=Source.KUBERNETES,
        node=change.node,
        kind=change.kind,
        state=change.state,
        reason=change.message[:2048],
        observed_at=datetime.now(UTC),
        dedupe_key=change.key,
    )


class NodeStream(threading.Thread):
    """list+watch of Nodes, queueing RELIST snapshots and watch events for the main loop."""

    def __init__(self, api: client.CoreV1Api, settings: Settings, out: queue.Queue[Item]) -> None:
        super().__init__(name="kube-node-stream", daemon=True)
        self.api, self.s, self.out = api, settings.kube, out
        self._halt = threading.Event()
        self._watch: watch.Watch | None = None

    def stop(self) -> None:
        self._halt.set()
        if self._watch is not None:
            self._watch.stop()  # shuts the socket, so a blocked read returns now

    def _list(self) -> str:
        # Raw JSON: deserializing 10,000 V1Node models costs seconds; we need a few fields of each.
        resp = self.api.list_node(_preload_content=False, _request_timeout=self.s.request_timeout_s)
        body = json.loads(resp.data)
        self.out.put(("RELIST", body.get("items") or []))
        return str(body["metadata"]["resourceVersion"])

    def run(self) -> None:
        backoff = 0.5
        while not self._halt.is_set():
            try:
                rv = self._list()
                backoff = 0.5
                resync_at = time.monotonic() + self.s.resync_interval_s
                while not self._halt.is_set() and time.monotonic() < resync_at:
                    timeout = max(1, min(self.s.watch_timeout_s, int(resync_at - time.monotonic()) or 1))
                    rv = self._watch_once(rv, timeout)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired (%s); relisting", exc.reason)
                    continue
                log.warning("Kubernetes API error %s %s; relisting in %.1fs", exc.status, exc.reason, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as exc:
                if self._halt.is_set():
                    break
                log.warning("Kubernetes API unreachable (%s); relisting in %.1fs", exc, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch_once(self, rv: str, timeout: int) -> str:
        self._watch = watch.Watch()
        for event in self._watch.stream(
            self.api.list_node,
            resource_version=rv,
            timeout_seconds=timeout,
            allow_watch_bookmarks=True,
            deserialize=False,
            _request_timeout=(self.s.request_timeout_s, timeout + self.s.request_timeout_s),
        ):
            obj = event["object"]
            rv = str(obj["metadata"]["resourceVersion"])
            if event["type"] != "BOOKMARK":
                self.out.put((event["type"], obj))
            if self._halt.is_set():
                break
        return rv


class Publisher:
    """The leader's side: flap filter, outbox and lock renewal."""

    def __init__(self, settings: Settings, bus: RedisEventBus) -> None:
        self.s = settings
        self.bus = bus
        self.flap = FlapFilter(
            settings.policy.kube_conditions,
            settings.kube.min_condition_s,
            clock=lambda: datetime.now(UTC),
            skew_s=settings.kube.condition_skew_s,
        )
        self.outbox: list[NodeEvent] = []

    def handle(self, item: Item) -> None:
        kind, payload = item
        if kind == "RELIST":
            nodes = {n["metadata"]["name"]: conditions_of(n) for n in payload}
            changes = self.flap.relist(nodes)
            changes += [c for c in self.flap.published() if c not in changes]  # level re-publish
        elif kind == "DELETED":
            self.flap.forget(payload["metadata"]["name"])
            changes = []
        else:
            changes = self.flap.observe(payload["metadata"]["name"], conditions_of(payload))
        self.outbox.extend(to_event(c) for c in changes)

    def flush(self) -> None:
        self.outbox.extend(to_event(c) for c in self.flap.due())
        if not self.outbox:
            return
        try:
            self.bus.publish(self.outbox)
            for event in self.outbox:
                log.info("published %s %s %s", event.node, event.kind, event.state)
            self.outbox = []
        except BusUnavailable as exc:
            log.warning("cannot publish %d event(s), will retry: %s", len(self.outbox), exc)


def _lead(settings: Settings, stopper: Stopper, bus: RedisEventBus, api: client.CoreV1Api, lock: Any) -> None:
    """Watch and publish while we hold the lock; return on SIGTERM or when the lock is lost."""
    items: queue.Queue[Item] = queue.Queue()
    stream = NodeStream(api, settings, items)
    publisher = Publisher(settings, bus)
    renew_every = settings.kube.leader_ttl_s / 3
    renew_at = time.monotonic() + renew_every
    stream.start()
    try:
        while not stopper.stopped:
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
            publisher.flush()
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
) -> None:
    """Run until ``stopper`` is set: wait for the leader lock, then watch and publish."""
    bus = bus or make_bus(settings)
    api = api or kube_client(settings.kube)
    lock = make_lock(settings, "kube", client=bus.client, ttl_s=settings.kube.leader_ttl_s)
    try:
        while not stopper.stopped:
            if lock.acquire_or_renew():
                log.info("leader lock acquired; watching Nodes")
                _lead(settings, stopper, bus, api, lock)
            else:
                stopper.wait(min(1.0, settings.kube.leader_ttl_s / 3))
    finally:
        lock.release()
        log.info("kube watcher stopped")


def main() -> None:
    settings = load_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run(settings, Stopper())


if __name__ == "__main__":
    main()
