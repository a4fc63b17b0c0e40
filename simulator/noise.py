"""What a healthy fleet shows that is no fault, replayed on a simulated cluster: the false-positive soak's mix.

:data:`NOISE_MIX` names each kind and its weight; :class:`NoiseReplay` draws from it on each of its
nodes in turn (one signal at a time per node, ``mean_gap_s`` apart on average), and every
``stall_every_s`` stalls slurmctld. Each signal's length is set against the thresholds the service
applies (``kube.min_condition_s``, ``slurm.not_responding_grace_s``) and the policy's own counts: a
node never shows ``policy.faults.app_xid_repeat_count`` application XIDs, which the policy remediates.

Why: docs/benchmarks.md#the-false-positive-soak
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from remediation.simulator.fault_injection import APP_XIDS, MAINTENANCE_PREFIX

if TYPE_CHECKING:
    from remediation.simulator.cluster import SimCluster

#: (kind, weight, what it is); each kind is the one the injector logs. Kinds whose signal reaches the ingest (held past its threshold) and
#: kinds the watchers must absorb (shorter than it) both count as chances to act wrongly.
NOISE_MIX: tuple[tuple[str, float, str], ...] = (
    ("app_xid", 2, "an application XID (13, 31, 43, 45) on GpuXidError, held past min_condition_s"),
    ("flap", 2, "Ready toggling False/True, every False shorter than min_condition_s"),
    ("ready_blip", 1, "one Ready=False shorter than min_condition_s"),
    ("xid_blip", 1, "GpuXidError=True (XID 79) cleared before min_condition_s"),
    ("npd_condition", 2, "a node-problem-detector condition the policy does not watch, held"),
    ("human_drain", 1, "a human DRAIN whose reason policy.ignore_reasons matches, resumed later"),
    ("slurmd_blip", 1, "slurmd silent for less than not_responding_grace_s (NOT_RESPONDING, never DOWN)"),
)
#: Conditions node-problem-detector posts that the shipped policy.kube_conditions does not watch.
NPD_CONDITIONS = ("FrequentContainerdRestart", "FrequentKubeletRestart", "FrequentDockerRestart")
#: Every kind a NoiseReplay logs, the cluster-wide stall included.
NOISE_KINDS = frozenset({kind for kind, _, _ in NOISE_MIX} | {"slurmctld_stall"})


@dataclass(frozen=True)
class Thresholds:
    """The service's settings each signal is sized against, and the cluster's SlurmdTimeout."""

    hold_s: float  # kube.min_condition_s
    grace_s: float  # slurm.not_responding_grace_s
    slurmd_timeout_s: float
    app_xid_limit: int  # policy.faults.app_xid_repeat_count: each node gets fewer than this


@dataclass(frozen=True)
class NoisePace:
    """A signal every ``mean_gap_s`` per node on average (after the last one ended), maintenance of
    ``maintenance_s``, and a slurmctld stall of ``stall_s`` every ``stall_every_s`` (0: none)."""

    mean_gap_s: float = 20.0
    maintenance_s: float = 20.0
    stall_every_s: float = 60.0
    stall_s: float = 3.0


class NoiseReplay:
    """Schedules itself on ``cluster.at`` over ``nodes``; :meth:`start` once the cluster runs, :meth:`stop`
    to begin nothing more (a signal under way still ends as planned, see :meth:`ends_at`)."""

    def __init__(
        self, cluster: SimCluster, nodes: list[str], limits: Thresholds, *, pace: NoisePace = NoisePace(),
        seed: int = 0,
    ) -> None:
        self.cluster, self.nodes, self.limits = cluster, list(nodes), limits
        self.mean_gap_s, self.stall_every_s, self.stall_s = pace.mean_gap_s, pace.stall_every_s, pace.stall_s
        self.maintenance_s = pace.maintenance_s
        self.rng = random.Random(seed)
        self.app_xids = dict.fromkeys(self.nodes, 0)
        self.busy_until = dict.fromkeys(self.nodes, 0.0)  # time.monotonic() each node's signal ends
        self.reserved: set[str] = set()  # nodes keeping one application XID below the limit in hand
        self.stopped = False

    def reserve_app_xid(self, node: str) -> None:
        """Keep one application XID of ``node``'s allowance for a caller's own :meth:`inject` (a
        barrier's last signal): the mix gives it one fewer."""
        self.reserved.add(node)

    def start(self) -> NoiseReplay:
        for node in self.nodes:
            self.cluster.at(self.rng.expovariate(1 / self.mean_gap_s), lambda n=node: self._next(n))  # type: ignore[misc]
        if self.stall_every_s > 0:
            self.cluster.at(self.stall_every_s, self._stall)
        return self

    def stop(self) -> None:
        self.stopped = True

    def ends_at(self) -> float:
        """When (time.monotonic()) the last signal begun ends."""
        return max(self.busy_until.values(), default=0.0)

    def inject(self, node: str, kind: str) -> float:
        """One signal of ``kind`` on ``node`` now; returns how long it lasts."""
        hold, c = self.limits.hold_s, self.cluster
        if kind == "app_xid":
            self.app_xids[node] += 1
            xid = sorted(APP_XIDS)[sum(self.app_xids.values()) % len(APP_XIDS)]
            seconds = 2 * hold + 1  # past the hold: the ingest sees it and records it as app_xid
            c.app_xid(node, xid, seconds)
        elif kind == "flap":
            seconds = 2 * hold
            c.flap(node, period_s=min(0.4, hold / 2), duration_s=seconds)
        elif kind == "ready_blip":
            seconds = 0.4 * hold
            c.condition_pulse(node, "Ready", seconds, status="False", message="PLEG is not healthy", kind=kind)
        elif kind == "xid_blip":
            seconds = 0.4 * hold
            c.condition_pulse(node, "GpuXidError", seconds, message="XID 79: GPU has fallen off the bus", kind=kind)
        elif kind == "npd_condition":
            seconds = 2 * hold + 1
            c.condition_pulse(node, self.rng.choice(NPD_CONDITIONS), seconds, message="restarted 5 times in 20m",
                              kind=kind)
        elif kind == "human_drain":
            seconds = self.maintenance_s
            c.human_drain(node, f"{MAINTENANCE_PREFIX} firmware update (planned)", user="root")

            def resume() -> None:
                c.end_human_drain(node)

            c.at(seconds, resume)
        elif kind == "slurmd_blip":
            seconds = 0.4 * min(self.limits.grace_s, self.limits.slurmd_timeout_s)
            c.slurmd_blip(node, seconds)
        else:
            raise ValueError(f"unknown noise kind {kind!r}")
        self.busy_until[node] = time.monotonic() + seconds
        return seconds

    def _next(self, node: str) -> None:
        if self.stopped:
            return
        kinds = [(k, w) for k, w, _ in NOISE_MIX
                 if k != "app_xid" or self.app_xids[node] + 1 + (node in self.reserved) < self.limits.app_xid_limit]
        kind = self.rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
        seconds = self.inject(node, kind)
        self.cluster.at(seconds + self.rng.expovariate(1 / self.mean_gap_s), lambda: self._next(node))

    def _stall(self) -> None:
        if self.stopped:
            return
        self.cluster.slurmctld_stall(self.stall_s)
        self.cluster.at(self.stall_every_s, self._stall)
