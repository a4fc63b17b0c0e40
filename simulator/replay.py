"""Turn a published failure trace into a timed list of faults for a simulated cluster.

:func:`plan` reads the rows (:func:`remediation.rehearsal.trace.read_mix`), scales the counts to the
cluster, spreads them over the trace's span divided by ``speedup`` (``until_s`` keeps a leading segment)
and maps each category to a signal. Reproducible from ``seed``.

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from remediation.rehearsal.trace import PAPER_DAYS, PAPER_NODES, MixRow

#: The nodes one fabric fault (a switch or a cable) takes NotReady at once.
NETWORK_BLAST = 4
#: Fault kinds a plan can hold; each is a SimCluster method of the same name, except "none".
KINDS = ("gpu_condition", "researcher_fail", "slurmd_stop", "node_not_ready", "human_drain", "none")


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # seconds after the replay starts (already sped up)
    category: str
    kind: str
    nodes: tuple[str, ...]
    remediable: bool
    component: str


def scaled_counts(rows: list[MixRow], scale_nodes: int) -> dict[str, int]:
    """Each category's count scaled from the paper's 2,048 nodes to ``scale_nodes`` (largest remainder)."""
    exact = {r.category: r.count * scale_nodes / PAPER_NODES for r in rows}
    total = round(sum(exact.values()))
    counts = {c: int(v) for c, v in exact.items()}
    by_remainder = sorted(exact, key=lambda c: (-(exact[c] - counts[c]), c))
    for category in by_remainder[: total - sum(counts.values())]:
        counts[category] += 1
    return counts


def kind_for(row: MixRow, rng: random.Random) -> str:
    signal = row.signal.lower()
    if "job failure only" in signal:
        return "none"
    if "gpu condition or researcher" in signal:
        return rng.choice(("gpu_condition", "researcher_fail"))
    if "gpu condition" in signal:
        return "gpu_condition"
    if "state=fail" in signal:
        return "researcher_fail"
    if "not responding" in signal:
        return "slurmd_stop"
    if "maintenance" in signal:
        return "human_drain"
    # "Node NotReady", "Node condition (disk)", "several nodes NotReady at once": the kubelet reports
    # the Node NotReady (a disk or memory fault takes the kubelet's health checks down with it).
    return "node_not_ready"


def plan(
    rows: list[MixRow],
    nodes: list[str],
    *,
    scale_nodes: int | None = None,
    speedup: float = 1.0,
    seed: int = 0,
    until_s: float | None = None,
) -> list[PlannedFault]:
    """The faults to inject, in time order (see the module docstring)."""
    rng = random.Random(seed)
    span_s = PAPER_DAYS * 86400 / speedup
    counts = scaled_counts(rows, scale_nodes if scale_nodes is not None else len(nodes))
    out: list[PlannedFault] = []
    for row in rows:
        for _ in range(counts[row.category]):
            kind = kind_for(row, rng)
            at = rng.uniform(0, span_s)
            blast = min(NETWORK_BLAST, len(nodes)) if "several nodes" in row.signal.lower() else 1
            targets = tuple(sorted(rng.sample(nodes, blast)))
            out.append(PlannedFault(at, row.category, kind, targets, row.remediable, row.component))
    out.sort(key=lambda f: (f.at_s, f.category))
    if until_s is not None:
        out = [f for f in out if f.at_s < until_s]
    return out
