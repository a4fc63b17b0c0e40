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
:class:`~remediation.adapters.kube.adapter.StaticMap`, so both sides agree), and ``pod`` inverts the slurmd pods'
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

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from remediation.adapters.bus import BusUnavailable, RedisEventBus
from remediation.adapters.factory import make_bus, make_lock
from remediation.adapters.kube.adapter import StaticMap, kube_client
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.flap import Change, Condition, FlapFilter
from remediation.ports.errors import RemediationError
from remediation.settings import KubeSettings, Settings, load_settings
from watchers.runtime import Stopper

log = logging.getLogger("watchers.kube")

Item = tuple[str, Any]  # ("RELIST", [node, ...]) or ("ADDED"|"MODIFIED"|"DELETED", node)

POD_LIST_INTERVAL_S = 2.0  # at most one slurmd pod LIST per this many seconds, and only when needed


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
            c["type"],
            c.get("status", ""),
            ": ".join(p for p in (c.get("reason"), c.get("message")) if p),  # "KubeletNotReady: PLEG ..."
            parse_time(c.get("lastTransitionTime")),
        )
        for c in (node.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and "type" in c
    ]


# ------------------------------------------------------------------- Node -> Slurm node names


def pod_placement(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """slurmd pods (raw JSON) -> ``{slurm_node: k8s_node}``; a pod not yet scheduled runs nowhere."""
    return {
        str(p["metadata"]["name"]): str(p["spec"]["nodeName"])
        for p in pods
        if (p.get("metadata") or {}).get("name") and (p.get("spec") or {}).get("nodeName")
    }


def invert(placement: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """``{slurm_node: k8s_node}`` -> ``{k8s_node: (slurm_node, ...)}``, names sorted (stable output)."""
    by_node: dict[str, list[str]] = {}
    for slurm_node, k8s_node in placement.items():
        by_node.setdefault(k8s_node, []).append(slurm_node)
    return {k8s_node: tuple(sorted(names)) for k8s_node, names in by_node.items()}


class SlurmNames:
    """The Slurm nodes running on a Kubernetes Node, per ``kube.mapping`` (see the module docstring)."""

    def __init__(
        self,
        settings: KubeSettings,
        api: Callable[[], client.CoreV1Api],
        *,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s, self.api, self.timeout_s, self.clock = settings, api, timeout_s, clock
        self.static = StaticMap(settings.static_map_file)
        self._by_node: dict[str, tuple[str, ...]] = {}
        self._listed_at = float("-inf")  # when the LIST behind _by_node started (monotonic)
        self._tried_at = float("-inf")
        self._failing = False

    def on(self, node: str, since: float) -> tuple[str, ...] | None:
        """The Slurm nodes on ``node`` per a map read at or after ``since`` (monotonic); ``()`` for
        none; None while no such map can be had yet (rate limit, API error, bad mapping file)."""
        if self.s.mapping == "node":
            return (node,)
        if self.s.mapping == "static":
            try:
                by_node = invert(self.static.load())  # a stat per call; re-read only when edited
            except RemediationError as exc:  # a bad mapping file: the configuration's fault
                self._warn(exc.message)
                return None
            self._failing = False
            return by_node.get(node, ())
        if self._listed_at < since and not self._list_pods():
            return None
        return self._by_node.get(node, ())

    def _list_pods(self) -> bool:
        now = self.clock()
        if now - self._tried_at < POD_LIST_INTERVAL_S:
            return False
        self._tried_at = now
        try:
            resp: Any = self.api().list_namespaced_pod(  # raw urllib3 response: _preload_content=False
                self.s.pod_namespace,
                label_selector=self.s.pod_label_selector,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )
            self._by_node = invert(pod_placement(json.loads(resp.data).get("items") or []))
        except ApiException as exc:
            self._warn(f"HTTP {exc.status} {exc.reason}")
            return False
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            self._warn(str(exc))
            return False
        self._listed_at, self._failing = now, False
        return True

    def _warn(self, why: str) -> None:
        if not self._failing:  # once per failure streak, not every half second
            log.warning(
                "cannot map Nodes to Slurm nodes (kube.mapping=%s): %s; will retry", self.s.mapping, why
            )
        self._failing = True


def to_event(change: Change, slurm_node: str) -> NodeEvent:
    """One NodeEvent for ``slurm_node``, which runs on the Node ``change`` is about. It is observed
    when the filter decided it (not when a slow translation or a Redis outage let it out), and says
    when its condition began, so the ingest can order it and attribute it to our own reboot."""
    detail = change.message or change.state
    return NodeEvent(
        source=Source.KUBERNETES,
        node=slurm_node,
        kind=change.kind,
        state=change.state,
        reason=f"Node {change.node}: {detail}"[:2048],
        observed_at=change.at or datetime.now(UTC),
        since=change.since,
        dedupe_key=f"k8s:{slurm_node}@{change.key.removeprefix('k8s:')}",
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
    """The leader's side: flap filter, Node -> Slurm node translation, outbox and lock renewal."""

    def __init__(self, settings: Settings, bus: RedisEventBus, api: client.CoreV1Api | None = None) -> None:
        self.s = settings
        self.bus = bus
        self.flap = FlapFilter(
            settings.policy.kube_conditions,
            settings.kube.min_condition_s,
            clock=lambda: datetime.now(UTC),
            skew_s=settings.kube.condition_skew_s,
        )
        core: list[client.CoreV1Api] = [api] if api is not None else []

        def lazy_api() -> client.CoreV1Api:
            if not core:
                core.append(kube_client(settings.kube))
            return core[0]

        # The main thread must still renew the lock (every leader_ttl_s / 3) after a slow LIST.
        self.names = SlurmNames(
            settings.kube,
            lazy_api,
            timeout_s=min(settings.kube.request_timeout_s, settings.kube.leader_ttl_s / 3),
        )
        self.pending: list[tuple[Change, float]] = []  # changes waiting for a fresh enough map
        self.sent: dict[tuple[str, str], tuple[str, ...]] = {}  # (Node, type) -> Slurm nodes published for
        self.unmapped: set[str] = set()  # Nodes already logged as hosting no Slurm node
        self.skipped = 0  # changes dropped because their Node hosts no Slurm node
        self.outbox: list[NodeEvent] = []
        self.unsent: dict[tuple[str, str], list[NodeEvent]] = {}  # episode -> its bad events in the outbox
        self.delivered: set[tuple[str, str]] = set()  # episodes whose bad edge Redis has taken

    def handle(self, item: Item) -> None:
        kind, payload = item
        if kind == "RELIST":
            nodes = {n["metadata"]["name"]: conditions_of(n) for n in payload}
            changes = self.flap.relist(nodes)
            changes += [c for c in self.flap.published() if c not in changes]  # level re-publish
            self._keep_only(set(nodes))
        elif kind == "DELETED":
            self.flap.forget(payload["metadata"]["name"])
            self._keep_only(None, gone=payload["metadata"]["name"])
            changes = []
        else:
            changes = self.flap.observe(payload["metadata"]["name"], conditions_of(payload))
        self.enqueue(changes)

    def enqueue(self, changes: Iterable[Change]) -> None:
        """Queue changes for translation. A held condition is published only if still bad: when an
        episode ends before its bad edge has left this process (waiting for the pod map, or in the
        outbox while Redis is down), the edge and its end are both dropped. Sent together, the stale
        edge would reach the ingest beside the observation that already ended it."""
        now = time.monotonic()
        for change in changes:
            episode = (change.node, change.state.partition("=")[0])
            if change.kind is EventKind.HEALTHY:
                self.pending = [(c, t) for c, t in self.pending if c.kind is not EventKind.UNHEALTHY
                                or (c.node, c.state.partition("=")[0]) != episode]
                dropped = {id(e) for e in self.unsent.pop(episode, [])}
                self.outbox = [e for e in self.outbox if id(e) not in dropped]
                if episode not in self.delivered:  # nobody heard of the bad edge: nothing ended
                    self.sent.pop(episode, None)
                    log.info("%s %s ended before it was published; publishing nothing", *episode)
                    continue
                self.delivered.discard(episode)
            self.pending.append((change, now))

    def _keep_only(self, nodes: set[str] | None, gone: str | None = None) -> None:
        def keep(node: str) -> bool:
            return node != gone and (nodes is None or node in nodes)

        self.pending = [(c, t) for c, t in self.pending if keep(c.node)]
        self.sent = {k: v for k, v in self.sent.items() if keep(k[0])}
        self.delivered = {k for k in self.delivered if keep(k[0])}
        self.unmapped = {n for n in self.unmapped if keep(n)}

    def translate(self) -> None:
        """Move the pending changes whose Slurm nodes are known into the outbox, in order."""
        waiting: list[tuple[Change, float]] = []
        for change, since in self.pending:
            episode = (change.node, change.state.partition("=")[0])
            names = None
            if not waiting:  # once one change waits, the later ones wait behind it (order kept)
                names = self.sent.get(episode) or self.names.on(change.node, since)
            if names is None:
                waiting.append((change, since))
                continue
            if change.kind is EventKind.HEALTHY:
                self.sent.pop(episode, None)
            elif names:  # an unmapped Node is looked up again when a resync re-offers its condition
                self.sent[episode] = names
            if not names:
                self.skipped += 1
                if change.node not in self.unmapped:
                    self.unmapped.add(change.node)
                    log.info(
                        "Node %s hosts no Slurm node (kube.mapping=%s); not publishing %s",
                        change.node,
                        self.s.kube.mapping,
                        change.state,
                    )
                continue
            self.unmapped.discard(change.node)
            for name in names:
                try:
                    event = to_event(change, name)
                except ValueError as exc:  # e.g. a mapping-file key that is no valid node name
                    log.warning("Node %s: cannot publish for Slurm node %r: %s", change.node, name, exc)
                    continue
                self.outbox.append(event)
                if change.kind is EventKind.UNHEALTHY:
                    self.unsent.setdefault(episode, []).append(event)
        self.pending = waiting

    def flush(self) -> None:
        self.enqueue(self.flap.due())
        self.translate()
        if not self.outbox:
            return
        try:
            self.bus.publish(self.outbox)
            for event in self.outbox:
                log.info("published %s %s %s (%s)", event.node, event.kind, event.state, event.reason[:200])
            self.outbox = []
            self.delivered |= set(self.unsent)
            self.unsent = {}
        except BusUnavailable as exc:
            log.warning("cannot publish %d event(s), will retry: %s", len(self.outbox), exc)


def _lead(settings: Settings, stopper: Stopper, bus: RedisEventBus, api: client.CoreV1Api, lock: Any) -> None:
    """Watch and publish while we hold the lock; return on SIGTERM or when the lock is lost."""
    items: queue.Queue[Item] = queue.Queue()
    stream = NodeStream(api, settings, items)
    publisher = Publisher(settings, bus, api)
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
