"""Keep a simulated cluster busy, so that a long-running stack (``docker compose up``) shows the loop.

:class:`ContinuousReplay` replays the bundled failure trace round after round on the cluster's clock (mean
gap ``mean_gap_s``), resumes maintenance drains after ``Tempo.maintenance_s``, and every ``storm_every_s`` fails
``storm_fraction`` of the pool (``nodes``: the ones it may fault, default all). No repeat offenders.

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from remediation.rehearsal.trace import PAPER_DAYS, read_mix
from remediation.simulator import replay

if TYPE_CHECKING:
    from remediation.simulator.cluster import SimCluster


def default_speedup(trace_csv: Path, nodes: int, mean_gap_s: float) -> float:
    """The speedup that spaces a round's faults ``mean_gap_s`` apart on average."""
    faults = max(1, sum(replay.scaled_counts(read_mix(trace_csv), nodes).values()))
    return PAPER_DAYS * 86400 / (faults * mean_gap_s)


@dataclass(frozen=True)
class Tempo:
    """How fast the trace plays: ``speedup`` times its own pace (None: so that faults arrive about
    ``mean_gap_s`` apart on this cluster); a maintenance drain ends ``maintenance_s`` after it began."""

    speedup: float | None = None
    mean_gap_s: float = 20.0
    maintenance_s: float = 120.0


@dataclass(frozen=True)
class Storms:
    """A storm every ``every_s`` seconds (0: none), hitting ``fraction`` of the nodes at once."""

    every_s: float = 240.0
    fraction: float = 0.2


class ContinuousReplay:
    """Schedules itself on ``cluster.at``; call :meth:`start` once the cluster runs."""

    def __init__(
        self,
        cluster: SimCluster,
        trace_csv: Path,
        *,
        tempo: Tempo = Tempo(),
        storms: Storms = Storms(),
        seed: int = 0,
        nodes: list[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.nodes = list(nodes or cluster.names)
        self.trace_csv = trace_csv
        self.speedup = tempo.speedup or default_speedup(trace_csv, len(self.nodes), tempo.mean_gap_s)
        self.round_s = PAPER_DAYS * 86400 / self.speedup
        self.storm_every_s = storms.every_s
        self.storm_fraction = storms.fraction
        self.maintenance_s = tempo.maintenance_s
        self.seed = seed
        self.rounds = 0
        self.in_maintenance: set[str] = set()
        self.stopped = False

    def start(self) -> ContinuousReplay:
        self.cluster.at(0.0, self._round)
        if self.storm_every_s > 0:
            self.cluster.at(self.storm_every_s, self._storm)
        return self

    def stop(self) -> None:
        """Inject nothing more: faults already scheduled by this round, later rounds and storms are
        skipped (ends of maintenance still happen, as the admin would still resume)."""
        self.stopped = True

    def _round(self) -> None:
        if self.stopped:
            return
        pool = [n for n in self.nodes if n not in self.in_maintenance]
        planned = replay.plan(
            read_mix(self.trace_csv), pool, scale_nodes=len(self.nodes),
            speedup=self.speedup, seed=self.seed + self.rounds,
        )  # fmt: skip
        self.rounds += 1
        for fault in planned:
            self.cluster.at(fault.at_s, lambda f=fault: None if self.stopped else self.cluster.apply(f))  # type: ignore[misc]
            if fault.kind == "human_drain":
                for node in fault.nodes:
                    self.in_maintenance.add(node)
                    self.cluster.at(fault.at_s + self.maintenance_s, lambda n=node: self._end_maintenance(n))  # type: ignore[misc]
        self.cluster.at(self.round_s, self._round)

    def _end_maintenance(self, node: str) -> None:
        self.in_maintenance.discard(node)
        self.cluster.end_human_drain(node)

    def _storm(self) -> None:
        if self.stopped:
            return
        spared = self.in_maintenance | (set(self.cluster.names) - set(self.nodes))
        self.cluster.storm(self.storm_fraction, exclude=tuple(sorted(spared)))
        self.cluster.at(self.storm_every_s, self._storm)
