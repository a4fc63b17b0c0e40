"""The Slurm watcher: turns slurmctld's node table into NodeEvents on the Redis stream.

Every ``slurm.poll_interval_s`` it diffs the node table against the last snapshot
(:func:`remediation.adapters.slurm.diff.diff`) and publishes transitions: ``UNHEALTHY`` into a bad state
(``policy.slurm_states``) or between bad conditions, ``HEALTHY`` back, ``INVENTORY`` for a new node. Every
``slurm.resync_interval_s`` it re-publishes the bad set. Only the ``slurm`` lock's holder publishes,
fenced.

Why: docs/running.md#the-watchers
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from remediation.adapters import logs
from remediation.adapters.bus import BusUnavailable, RedisEventBus
from remediation.adapters.factory import make_bus, make_lock, slurm_backend
from remediation.adapters.slurm.backend import close_slurm
from remediation.adapters.slurm.diff import BAD_PRIORITY, bad_state, condition_key, diff
from remediation.adapters.slurm.parse import NodeRecord
from remediation.adapters.slurm.topology import topology_source
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.slurm_states import SlurmState
from remediation.ports.cluster import SlurmControl
from remediation.ports.errors import RemediationError
from remediation.settings import Settings, load_watched
from remediation.watchers.health import WatcherHealth
from remediation.watchers.runtime import Polls, Stopper
from remediation.watchers.slurm.reasons import KeptReasons
from remediation.watchers.slurm.topology import TopologyPublisher

log = logging.getLogger("remediation.watchers.slurm.watcher")

#: How many whole inventories reach the ingest within ``policy.pool_stale_s``: each confirms every
#: node in the storm breaker's pool, so two can be lost before a node leaves it.
CONFIRMATIONS_PER_STALE = 3


@runtime_checkable
class SnapshotSource(Protocol):
    """What the watcher reads. ``poll`` may answer None for "nothing changed since last time"."""

    def snapshot(self) -> dict[str, NodeRecord]: ...

    def poll(self) -> dict[str, NodeRecord] | None: ...


class ListNodesSource:
    """Any SlurmControl as a snapshot source (memory and no-op backends)."""

    def __init__(self, slurm: SlurmControl) -> None:
        self.slurm = slurm

    def snapshot(self) -> dict[str, NodeRecord]:
        out = {}
        for node in self.slurm.list_nodes():
            stamp = int(node.reason_time.timestamp()) if node.reason_time else 0
            out[node.name] = NodeRecord(node.name, node.state, node.flags, node.reason, node.reason_user, stamp,
                                        partitions=node.partitions, features=node.features)
        return out

    def poll(self) -> dict[str, NodeRecord] | None:
        return self.snapshot()


class SlurmWatcher:
    """One watcher's memory between polls. ``step`` is one poll; the loop is in :func:`run`."""

    def __init__(
        self,
        settings: Settings,
        bus: RedisEventBus,
        source: SnapshotSource,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.source = source
        self.clock = clock
        self.bad = watched_states(settings)
        self.resync_interval = settings.slurm.resync_interval_s
        self.grace = settings.slurm.not_responding_grace_s
        self.previous: dict[str, NodeRecord] | None = None
        self.next_resync = 0.0
        self._not_responding_since: dict[str, float] = {}
        self.kept_reasons = KeptReasons()  # each node's reason from an earlier episode
        self._inventoried: dict[str, str] = {}  # node -> the key of its inventory event last published
        self._resyncs = 0  # resyncs since the last full inventory
        self.full_every = full_inventory_every(settings)

    def reset(self) -> None:
        """Forget the snapshot: the next step is a full resync (start, regained leadership), and it
        publishes the whole inventory."""
        self.previous = None
        self._inventoried.clear()

    def step(self) -> int:
        """Poll once and publish what changed; returns the number of events published. Raises
        BusUnavailable (snapshot kept) and the Slurm adapter's typed errors."""
        now = self.clock()
        resync = self.previous is None or now >= self.next_resync
        current = self.source.snapshot() if resync else self.source.poll()
        if current is None and self._not_responding_since:
            # "Nothing changed" cannot tell whether a grace period ran out: look at the latest statuses
            # (the delta reader keeps them; slurmrestd's 304 needs a full read).
            current = getattr(self.source, "current", self.source.snapshot)()
        if current is None:
            return 0
        current = self.kept_reasons.strip(current)
        previous = self.previous or {}
        changes = diff(previous, current, self.bad)
        effective = current  # a fresh dict per read; nodes held back by the grace are swapped in
        observed = datetime.now(UTC)
        events: list[NodeEvent] = []
        held: set[str] = set()
        waiting: set[str] = set()
        for status, state in changes.unhealthy:
            if self._within_grace(status, state, now):
                held.add(status.name)
                waiting.add(status.name)
                if status.name in previous:
                    effective[status.name] = previous[status.name]
                else:
                    del effective[status.name]
                continue
            if not resync:
                events.append(self._event(EventKind.UNHEALTHY, status, state, key=condition_key(status,
                    state), observed=observed))
        for status, before, before_state in changes.healthy:
            key = f"slurm:{status.name}:healthy:" + condition_key(before, before_state).split(":", 2)[2]
            events.append(self._event(EventKind.HEALTHY, status, status.state, key=key, observed=observed))
        if resync:
            full = self._full_inventory()
            for status in effective.values():
                bad = bad_state(status, self.bad)
                if bad is not None and status.name not in held:
                    key = condition_key(status, bad)
                    events.append(self._event(EventKind.UNHEALTHY, status, bad, key=key, observed=observed))
                if (inventory := self._inventory(status, observed, full=full)) is not None:
                    events.append(inventory)
        else:
            events.extend(e for s in changes.added if s.name not in held
                          if (e := self._inventory(s, observed, full=True)) is not None)
        # A node that left NOT_RESPONDING (or gained another bad state) starts its grace afresh later.
        for name in list(self._not_responding_since):
            if name not in waiting:
                del self._not_responding_since[name]
        published = self._publish(events)  # raises BusUnavailable: the previous snapshot is kept
        self.previous = effective
        if resync:
            self.next_resync = now + self.resync_interval
        for name in changes.removed:
            log.info("node %s is no longer in Slurm", name)
        return published

    def _within_grace(self, status: NodeRecord, state: str, now: float) -> bool:
        alone = {SlurmState.NOT_RESPONDING}
        if state != SlurmState.NOT_RESPONDING or self.grace <= 0 or (status.states & self.bad) != alone:
            return False
        since = self._not_responding_since.setdefault(status.name, now)
        return now - since < self.grace

    def _event(self, kind: EventKind, status: NodeRecord, state: str, *, key: str, observed: datetime,
               **facts: list[str]) -> NodeEvent:
        return NodeEvent(
            source=Source.SLURM,
            node=status.name,
            kind=kind,
            state=state,
            reason=status.reason[:2048],
            reason_user=status.reason_user[:128] if status.reason_user else None,
            observed_at=observed,
            dedupe_key=key[:512],
            published_at=datetime.now(UTC),
            **facts,
        )

    def _full_inventory(self) -> bool:
        """Is this resync's inventory the whole fleet's (the first, then every ``full_every``-th)?"""
        full = not self._inventoried or self._resyncs % self.full_every == 0
        self._resyncs = 1 if full else self._resyncs + 1
        return full

    def _inventory(self, status: NodeRecord, observed: datetime, *, full: bool) -> NodeEvent | None:
        """The node's inventory event; None when ``full`` is not asked and the node's last one said the same."""
        state = bad_state(status, self.bad) or status.state
        stamp = status.reason_changed_at or f"s{status.slurmd_start_time}"
        key = f"slurm:{status.name}:inventory:{state}:{stamp}:{_digest(status.partitions, status.features)}"
        if not full and self._inventoried.get(status.name) == key:
            return None
        self._inventoried[status.name] = key
        return self._event(EventKind.INVENTORY, status, state, key=key, observed=observed,
                           partitions=list(status.partitions), features=list(status.features))

    def _publish(self, events: list[NodeEvent]) -> int:
        """Publish; on BusUnavailable the inventory not sent is sent again at the next resync."""
        try:
            return self.bus.publish(events) if events else 0
        except BusUnavailable:
            for event in events:
                if event.kind is EventKind.INVENTORY:
                    self._inventoried.pop(event.node, None)
            raise


class Pace:
    """The poll interval, stretched when polls get dear: the watcher (and the Slurm commands it runs)
    stays within ``budget`` of one core. A quiet cluster costs well under a millisecond per poll (the
    change probe), so it is polled at ``base``; while many nodes change, each poll reads the bad set
    and the changed nodes, and the interval grows until that costs ``budget``, never more than 8x."""

    def __init__(self, base: float, budget: float) -> None:
        self.base, self.budget = base, budget
        self.cost = 0.0  # CPU seconds per poll, smoothed
        self._t0 = 0.0

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        self._t0 = self._cpu()

    def interval(self) -> float:
        used = self._cpu() - self._t0
        self.cost = used if self.cost == 0.0 else 0.7 * self.cost + 0.3 * used
        return min(8 * self.base, max(self.base, self.cost / self.budget))


def _digest(*names: tuple[str, ...]) -> str:
    """A short digest of a node's partitions and features: a change makes a new inventory event."""
    return hashlib.sha256(repr(names).encode()).hexdigest()[:12]


def full_inventory_every(settings: Settings) -> int:
    """Every how many resyncs the whole inventory is published: ``CONFIRMATIONS_PER_STALE`` times within
    the shortest ``pool_stale_s`` of the policy and its profiles (5 at the defaults: 900 s, resyncs
    every 60 s). Between them a resync publishes the inventory of the nodes whose own changed, beside the
    whole bad set; a 25,000-node cluster would otherwise send 25,000 unchanged events a minute.
    Why: docs/running.md#the-watchers"""
    stale = min([settings.policy.pool_stale_s, *(float(p.policy["pool_stale_s"]) for p in settings.profiles
                                                 if "pool_stale_s" in p.policy)])
    return max(1, int(stale // (CONFIRMATIONS_PER_STALE * settings.slurm.resync_interval_s)))


def watched_states(settings: Settings) -> frozenset[str]:
    return frozenset(BAD_PRIORITY) | {s.upper() for s in settings.policy.slurm_states}


def as_source(slurm: SlurmControl, bad: frozenset[str] = frozenset(BAD_PRIORITY)) -> SnapshotSource:
    """The cheapest reader the backend offers: the cli backend's delta reader (only what changed),
    slurmrestd's update_time (304 when nothing did), else a full read per poll."""
    delta = getattr(slurm, "delta_source", None)
    reader = delta(bad) if callable(delta) else None
    if reader is not None:
        return reader  # type: ignore[no-any-return]
    return slurm if isinstance(slurm, SnapshotSource) else ListNodesSource(slurm)


def run(
    settings: Settings,
    stopper: Stopper,
    bus: RedisEventBus | None = None,
    *,
    slurm: SlurmControl | None = None,
    health: WatcherHealth | None = None,
    polls: Polls | None = None,
) -> None:
    """Watch until ``stopper`` is set. Only the leader-lock holder polls and publishes. ``health`` (made
    here, and served on ``health.port``, unless given) hears of every turn, lead and successful poll;
    ``polls`` counts the loop's passes (a standby's passes too: each is a chance it had to publish, and
    did not)."""
    polls = polls or Polls()
    owned = slurm is None  # a backend built here is closed here; a given one is its caller's
    slurm = slurm if slurm is not None else slurm_backend(settings)
    bus = bus or make_bus(settings)
    poll = settings.slurm.poll_interval_s
    # Renewed every poll; a TTL of several polls rides out one slow sinfo without a leader change.
    lock = make_lock(settings, "slurm", client=bus.client, ttl_s=max(10.0, 5 * poll))
    bus.fenced_by(lock)  # every event carries the lock's fencing token (remediation.domain.fencing)
    watcher = SlurmWatcher(settings, bus, as_source(slurm, watched_states(settings)))
    pace = Pace(poll, settings.slurm.cpu_budget)
    topology = TopologyPublisher(settings, bus, topology_source(settings.slurm, slurm))
    leading = False
    health = health or WatcherHealth("slurm", settings)
    server = health.serve()
    log.info("slurm watcher started (poll %.2fs, resync %.0fs)", poll, settings.slurm.resync_interval_s)
    try:
        while not stopper.stopped:
            started, decided = time.monotonic(), datetime.now(UTC)
            health.turned()
            pace.start()
            if lock.acquire_or_renew():
                if not leading:
                    log.info("slurm watcher is the leader")
                    watcher.reset()
                    topology.reset()
                    leading = True
                    health.leading(True)
                _poll(watcher, topology, health)
            elif leading:
                log.info("slurm watcher lost the leader lock")
                leading = False
                health.leading(False)
            polls.tick(decided)
            stopper.wait(max(0.0, pace.interval() - (time.monotonic() - started)))
    finally:
        lock.release()
        health.leading(False)
        if server is not None:
            server.stop()
        if owned:
            close_slurm(slurm)
        log.info("slurm watcher stopped")


def _poll(watcher: SlurmWatcher, topology: TopologyPublisher, health: WatcherHealth) -> None:
    """One poll as the leader: node states, then the topology. A bus or Slurm error is logged and
    the next poll retries."""
    try:
        polled = time.monotonic()
        watcher.step()
        if getattr(watcher.source, "pending", False) is True:
            # The delta reader published what its lines told and owes a detail read: it is
            # done now, as part of this poll, so its cost counts against the CPU budget.
            watcher.step()
        topology.step()
        health.succeeded(time.monotonic() - polled)
    except BusUnavailable as exc:
        log.warning("cannot publish, will retry the same transitions: %s", exc)
    except RemediationError as exc:
        log.warning("cannot read Slurm: %s", exc)


def main() -> int:
    settings = load_watched()
    logs.configure_from(settings)
    run(settings, Stopper())
    return 0


if __name__ == "__main__":
    sys.exit(main())
