"""The main-thread half of the Kubernetes watcher: held conditions in, NodeEvents on the bus out.

:class:`Publisher` runs queued Nodes through :class:`~remediation.domain.flap.FlapFilter`, maps them to
Slurm nodes, publishes a condition held ``kube.min_condition_s`` and its end, re-publishes bad conditions
on every relist, and keeps what Redis refused in an outbox. An episode keeps the Slurm nodes it was first
published for (``sent``).

Why: docs/kubernetes.md#the-kubernetes-watcher
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime

from kubernetes import client

from remediation.adapters.bus import BusUnavailable, RedisEventBus
from remediation.adapters.kube.client import kube_client
from remediation.domain.events import EventKind, NodeEvent
from remediation.domain.flap import Change, FlapFilter
from remediation.profiles.rules import label_keys
from remediation.settings import Settings
from remediation.watchers.kube.domains import DomainLabels
from remediation.watchers.kube.mapping import SlurmNames, conditions_of, to_event
from remediation.watchers.kube.stream import Item

log = logging.getLogger("remediation.watchers.kube.watcher")

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
        self.domains = DomainLabels(settings.incidents.label_keys, settings.incidents.enabled)
        self.labels = DomainLabels(label_keys(settings.profiles), kind=EventKind.LABELS)  # what profiles select on

    def handle(self, item: Item) -> None:
        kind, payload = item
        if kind == "RELIST":
            nodes = {n["metadata"]["name"]: conditions_of(n) for n in payload}
            for n in payload:
                self.domains.observe(n)
                self.labels.observe(n)
            changes = self.flap.relist(nodes)
            changes += [c for c in self.flap.published() if c not in changes]  # level re-publish
            self._keep_only(set(nodes))
        elif kind == "DELETED":
            self.flap.forget(payload["metadata"]["name"])
            self.domains.forget(payload["metadata"]["name"])
            self.labels.forget(payload["metadata"]["name"])
            self._keep_only(None, gone=payload["metadata"]["name"])
            changes = []
        else:
            self.domains.observe(payload)
            self.labels.observe(payload)
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
        self.outbox += self.domains.events(self.names) + self.labels.events(self.names)
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
