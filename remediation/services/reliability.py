"""The reliability report: trends, hardware and lemons over a window, read from the database only.

It reads ``remediations``, ``nodes``, ``node_domains`` and ``hardware_sightings``; the arithmetic is
:mod:`remediation.domain.trends`. Groups are named by a *dimension*: ``pool``, ``rack`` and ``zone``
(the failure-domain kinds in :data:`DIMENSIONS`), ``sku``, ``node``, ``cluster``, or any other
failure-domain kind as recorded. A node is (cluster, name): over several clusters it is named
``cluster/name`` and the figures come per cluster and for the fleet; over one, as before clusters.

Why: docs/on-call.md#is-the-fleet-getting-better
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Node, NodeDomain, Remediation
from remediation.domain.hardware import Era, era_at, shared_serials
from remediation.domain.statemachine import RemediationStatus, Step
from remediation.domain.trends import (
    Fault,
    Group,
    Mtbf,
    RepairTime,
    Trends,
    Window,
    fleet_group,
    mtbf,
    opened_in,
    out_hours,
    overlap_h,
    per_node,
    repair_times,
    trends,
)
from remediation.repair_requests.service import repaired
from remediation.services.hardware import HardwareFlag, eras_by_node, hardware_flags, sightings
from remediation.services.lemons import LemonRow, lemons
from remediation.settings import LemonSettings
from remediation.vocabulary import node_label

#: Failure-domain kinds each named dimension reads, first match wins: the Slurm partition or node pool,
#: the leaf switch or rack (Slurm topology's switch, GKE's sub-block), the zone.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "pool": ("partition", "cloud.google.com/gke-nodepool", "kubernetes.azure.com/agentpool",
             "eks.amazonaws.com/nodegroup", "pool"),
    "rack": ("switch", "cloud.google.com/gce-topology-subblock", "rack"),
    "zone": ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone", "zone"),
}  # fmt: skip
BY = ("pool", "rack", "zone", "sku")
TOP_LEMONS = 10  # the lemons the report lists, worst first
NONE = "(none)"


@dataclass(frozen=True)
class Move:
    """A node name that moved to other hardware."""

    node: str
    at: datetime
    why: str
    before: str
    after: str


@dataclass(frozen=True)
class Reliability:
    trends: dict[str, Trends]  # by dimension
    hardware: list[Mtbf]
    moves: list[Move]
    shared_gpus: dict[str, list[str]]
    lemons: list[LemonRow]
    clusters: tuple[str, ...] = ()  # the clusters the figures cover
    fleet: Group | None = None  # every node of every cluster together (None: one cluster)
    flags: list[HardwareFlag] = field(default_factory=list)  # hardware that failed in another cluster
    repairs: list[RepairTime] = field(default_factory=list)  # the repair system's time per hardware item

    @property
    def window(self) -> Window:
        return next(iter(self.trends.values())).window


@dataclass(frozen=True)
class _View:
    """Which clusters the report reads, and how it names their nodes."""

    cluster: str | None  # one cluster only, or every cluster the session sees
    clusters: tuple[str, ...]

    @property
    def fleet(self) -> bool:
        return len(self.clusters) > 1

    def label(self, cluster: str, node: str) -> str:
        return node_label(cluster, node, fleet=self.fleet)

    def only(self, column: Any) -> Any:
        """A ``WHERE`` on ``column`` (a table's cluster) for the one cluster asked for, else none."""
        return column == self.cluster if self.cluster is not None else column.is_not(None)


def _faults(s: Session, w: Window, eras: dict[str, list[Era]], *, before: dict[int, str], view: _View) -> list[Fault]:
    released = {view.label(c, n): t for c, n, t in s.execute(
        select(Node.cluster, Node.name, Node.released_at).where(view.only(Node.cluster)))}
    r = Remediation
    q = select(r.id, r.cluster, r.node, r.fault_class, r.status, r.opened_at, r.closed_at).where(
        r.dry_run.is_(False), r.opened_at < w.until, view.only(r.cluster),
        or_(r.closed_at.is_(None), r.closed_at >= w.since, r.status == RemediationStatus.QUARANTINED),
    )  # fmt: skip
    out = []
    keyed: dict[str, dict[str, Era]] = {}  # node -> its first era of each hardware key, made once
    for rid, cluster, name, fault_class, status, opened_at, closed_at in s.execute(q.order_by(r.id)):
        node = view.label(cluster, name)
        opened = aware(opened_at) or opened_at
        mine = eras.get(node, [])
        if rid in before and node not in keyed:
            keyed[node] = {}
            for e in mine:
                keyed[node].setdefault(e.key, e)
        era = keyed[node].get(before[rid]) if rid in before else None
        era = era or era_at(mine, opened)
        out.append(Fault(rid, node, fault_class, status, opened, aware(closed_at), aware(released.get(node)),
                         era.key if era else None, era.sku if era else None))
    return out


def _hardware(
    faults: list[Fault], eras: dict[str, list[Era]], first: dict[str, datetime], *, w: Window
) -> list[Mtbf]:
    hours: dict[str, float] = defaultdict(float)
    names: dict[str, set[str]] = defaultdict(set)
    sku: dict[str, str | None] = {}
    for node, node_eras_ in eras.items():
        for e in node_eras_:
            start = first.get(node, e.since) if e.ordinal == 1 else e.since
            hours[e.key] += overlap_h(start, e.until or w.until, w.since, until=w.until)
            names[e.key].add(node)
            sku[e.key] = sku.get(e.key) or e.sku
    on: dict[str | None, list[Fault]] = defaultdict(list)
    for f in faults:
        on[f.hardware].append(f)
    rows = []
    for key in hours:
        mine = on.get(key, [])
        h = hours[key] - out_hours(mine, w.since, w.until)
        n = len(opened_in(mine, w))
        rows.append(Mtbf(key, n, h, mtbf(h, n), sku.get(key), tuple(sorted(names[key]))))
    return sorted(rows, key=lambda m: (-m.faults, m.name))


def _grouper(
    s: Session, by: str, eras: dict[str, list[Era]], *, view: _View, home: dict[str, str]
) -> Callable[[str, Fault | None], str]:
    if by == "node":
        return lambda node, fault: node
    if by == "cluster":
        return lambda node, fault: home.get(node, NONE)
    if by == "sku":
        latest = {n: next((e.sku for e in reversed(es) if e.sku), None) for n, es in eras.items()}
        return lambda node, fault: (fault.sku if fault else None) or latest.get(node) or NONE
    kinds = DIMENSIONS.get(by, (by,))
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for cluster, node, kind, name in s.execute(
        select(NodeDomain.cluster, NodeDomain.node, NodeDomain.kind, NodeDomain.name)
        .where(NodeDomain.kind.in_(kinds), view.only(NodeDomain.cluster))
    ):
        found[view.label(cluster, node)][kind] = name
    # Each node's group is looked up once here, not once per fault and per node row.
    group_of = {node: next((mine[k] for k in kinds if k in mine), NONE) for node, mine in found.items()}
    return lambda node, fault: group_of.get(node, NONE)


def _view(s: Session, cluster: str | None) -> _View:
    if cluster is not None:
        return _View(cluster, (cluster,))
    return _View(None, tuple(sorted(set(s.scalars(select(Node.cluster).distinct())))))


def reliability(
    s: Session,
    since: datetime,
    until: datetime,
    *, lemon: LemonSettings,
    by: tuple[str, ...] = BY,
    cluster: str | None = None,
) -> Reliability:
    """Every figure the Reliability page and ``remediation reliability`` show, for [since, until): of
    ``cluster`` alone, or of every cluster the session sees (then per cluster, and for the fleet)."""
    w = Window(since, until)
    view = _view(s, cluster)
    seen = sightings(s, until=until, cluster=cluster, fleet=view.fleet)
    eras = eras_by_node(seen)
    before = {sg.remediation_id: era.key for sg in seen
              if sg.remediation_id is not None and sg.step == Step.VM_RESTART and sg.action is None
              for era in [era_at(eras[sg.node], sg.at)] if era is not None}  # fmt: skip
    faults = _faults(s, w, eras, before=before, view=view)
    home: dict[str, str] = {}
    first: dict[str, datetime] = {}
    for c, n, t in s.execute(select(Node.cluster, Node.name, Node.first_seen_at)
                             .where(Node.first_seen_at < until, view.only(Node.cluster))):
        first[view.label(c, n)], home[view.label(c, n)] = aware(t) or t, c
    if view.fleet and "cluster" not in by:
        by = ("cluster", *by)
    rows = per_node(faults, first, w)
    per = {d: trends(faults, first, w, by=d, key=_grouper(s, d, eras, view=view, home=home), node_rows=rows)
           for d in by}  # fmt: skip
    moves = [
        Move(n, e.since, e.why, es[e.ordinal - 2].key, e.key)
        for n, es in eras.items()
        for e in es
        if e.ordinal > 1 and since <= e.since < until
    ]
    fleet = fleet_group(faults, rows, w) if view.fleet else None
    every_flag = hardware_flags(s, until)  # read once: the lemons count the same flags
    flags = [f for (c, _), f in every_flag.items() if c in view.clusters]
    return Reliability(
        per,
        _hardware(faults, eras, first, w=w),
        sorted(moves, key=lambda m: m.at),
        shared_serials(seen),
        lemons(s, until, lemon, top=TOP_LEMONS, cluster=cluster, every_flag=every_flag),
        view.clusters,
        fleet,
        flags,
        repair_times(repaired(s, until, cluster=cluster, label=view.label), w),
    )
