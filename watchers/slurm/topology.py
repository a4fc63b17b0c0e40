"""The Slurm watcher's topology half: topology.conf switches in, DOMAINS events out.

Every ``incidents.topology_refresh_s`` (and on taking the lead) it reads the switches from the source
:func:`remediation.adapters.slurm.topology.topology_source` chose and publishes a ``DOMAINS`` event per
node whose domains changed. Unreadable output is logged and the last domains stand.

Why: docs/slurm-releases.md#topology
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import UTC, datetime

from remediation.adapters.bus import BusUnavailable, RedisEventBus
from remediation.adapters.slurm.topology import TopologySource
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.topology import TopologyError, slurm_domain_sizes, slurm_domains
from remediation.ports.errors import RemediationError
from remediation.settings import Settings

log = logging.getLogger("remediation.watchers.slurm.watcher")

#: What the watcher published of a node: its domains (kind -> name) and their sizes (kind -> nodes).
Report = tuple[dict[str, str], dict[str, int]]


class TopologyPublisher:
    def __init__(self, settings: Settings, bus: RedisEventBus, source: TopologySource) -> None:
        read = source.read
        self.enabled = settings.incidents.enabled and settings.incidents.slurm_topology and read is not None
        if self.enabled:
            log.info("switch domains from %s", source.origin)
        elif settings.incidents.enabled and settings.incidents.slurm_topology:
            # A real cluster's missing source is worth a warning; the simulated world has no switches.
            real = settings.slurm.backend in ("cli", "rest", "pyslurm")
            log.log(logging.WARNING if real else logging.INFO, "no switch domains: learnt from %s", source.origin)
        self.read = read
        self.bus = bus
        self.every = settings.incidents.topology_refresh_s
        self.published: dict[str, Report] = {}
        self.due = 0.0

    def reset(self) -> None:
        """A new leader publishes the whole topology again."""
        self.published = {}
        self.due = 0.0

    def step(self) -> int:
        if not self.enabled or self.read is None or time.monotonic() < self.due:
            return 0
        self.due = time.monotonic() + self.every
        try:
            switches = self.read()
            sizes = slurm_domain_sizes(switches)
            domains = {n: (d, sizes.get(n, {})) for n, d in slurm_domains(switches).items()}
        except TopologyError as exc:
            log.error("cannot read the Slurm topology, keeping the domains last published: %s", exc)
            return 0
        except RemediationError as exc:
            log.warning("cannot read the Slurm topology (%s); trying again in %.0fs", exc, self.every)
            return 0
        now = datetime.now(UTC)
        changed = {n: d for n, d in domains.items() if self.published.get(n) != d}
        changed.update({n: ({}, {}) for n in self.published if n not in domains})
        events = [self._event(node, report, now) for node, report in sorted(changed.items())]
        if not events:
            return 0
        try:
            self.bus.publish(events)
        except BusUnavailable as exc:
            log.warning("cannot publish the Slurm topology, will retry: %s", exc)
            self.due = 0.0
            return 0
        for node, report in changed.items():
            if report[0]:
                self.published[node] = report
            else:
                self.published.pop(node, None)
        log.info("published the failure domains of %d node(s) from the Slurm topology", len(events))
        return len(events)

    @staticmethod
    def _event(node: str, report: Report, now: datetime) -> NodeEvent:
        domains, sizes = report
        digest = hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:16]
        return NodeEvent(
            source=Source.SLURM, node=node, kind=EventKind.DOMAINS, state="topology", domains=domains,
            domain_sizes=sizes or None,
            reason=", ".join(f"{k}={v}" for k, v in sorted(domains.items())) or "in no switch",
            observed_at=now, published_at=now, dedupe_key=f"slurm:{node}:domains:{digest}:{now.isoformat()}",
        )
