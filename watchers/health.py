"""A watcher's health and metrics: what ``/livez``, ``/readyz`` and ``/metrics`` of its process say.

Alive while the main loop turns (a standby too); ready as a standby, or as a leader whose last successful
poll or watch response is within ``health.readiness_stale_s``. Metrics, labelled ``watcher``:
``remediation_watcher_leader``, ``..._last_success_timestamp_seconds`` and ``..._poll_duration_seconds``.
Each watcher owns its registry.

Why: docs/architecture.md#each-process-says-how-it-is-without-asking-anyone-else
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from remediation.adapters.health import HealthServer
from remediation.settings import Settings

# A change probe is sub-millisecond, a full read of thousands of nodes seconds; a Node list likewise.
POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WatcherHealth:
    def __init__(self, watcher: str, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.watcher = watcher
        self.clock = clock
        self.s = settings.health
        self.settings = settings
        self.registry = CollectorRegistry()
        self._leader_gauge = Gauge(
            "remediation_watcher_leader",
            "1 while this replica holds the watcher's leader lock.",
            ["watcher"],
            registry=self.registry,
        ).labels(watcher)
        self._success_gauge = Gauge(
            "remediation_watcher_last_success_timestamp_seconds",
            "Unix time of the last successful poll or watch response (0: none yet).",
            ["watcher"],
            registry=self.registry,
        ).labels(watcher)
        self._poll = Histogram(
            "remediation_watcher_poll_duration_seconds",
            "Duration of one Slurm poll or Kubernetes Node list.",
            ["watcher"],
            buckets=POLL_BUCKETS,
            registry=self.registry,
        ).labels(watcher)
        self._turned = clock()
        self.leader = False
        self._since = clock()  # last success, or when we took the lead
        self._leader_gauge.set(0)
        self._success_gauge.set(0)

    def turned(self) -> None:
        """The main loop went round once."""
        self._turned = self.clock()

    def leading(self, leader: bool) -> None:
        if leader and not self.leader:
            self._since = self.clock()
        self.leader = leader
        self._leader_gauge.set(1 if leader else 0)

    def succeeded(self, duration_s: float | None = None) -> None:
        """A poll, list or watch response came back; ``duration_s`` for polls and lists."""
        self._since = self.clock()
        self._success_gauge.set(time.time())
        if duration_s is not None:
            self._poll.observe(duration_s)

    def live(self) -> tuple[bool, dict[str, Any]]:
        age = self.clock() - self._turned
        return age < self.s.liveness_stale_s, {
            "watcher": self.watcher,
            "role": self._role(),
            "loop_age_s": round(age, 3),
        }

    def ready(self) -> tuple[bool, dict[str, Any]]:
        body: dict[str, Any] = {"watcher": self.watcher, "role": self._role()}
        if not self.leader:
            return True, body
        age = self.clock() - self._since
        body["last_success_age_s"] = round(age, 3)
        return age < self.s.readiness_stale_s, body

    def _role(self) -> str:
        return "leader" if self.leader else "standby"

    def serve(self) -> HealthServer | None:
        """Start the endpoint if ``health.port`` is set."""
        if self.s.port is None:
            return None
        return HealthServer(self.s.bind, self.s.port, self.live, ready=self.ready,
                            registry=self.registry).start()
