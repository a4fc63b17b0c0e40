"""Reliability trends: the arithmetic of faults over a window, on rows the caller read from the database.

Faults per day by cause class, time to repair, node-hours out of service and MTBF per node and per
piece of hardware (an era of :mod:`remediation.domain.hardware`), and the repair system's time per
hardware item (a repair request opened to done). Pure: no I/O.

Why: docs/on-call.md#is-the-fleet-getting-better
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from remediation.domain.statemachine import RemediationStatus

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Fault:
    """One remediation, as the trends need it."""

    id: int
    node: str
    fault_class: str | None
    status: str
    opened_at: datetime
    closed_at: datetime | None
    released_at: datetime | None = None  # the node's release after a quarantine
    hardware: str | None = None  # the hardware key it happened on (None: never read)
    sku: str | None = None

    @property
    def cause(self) -> str:
        return self.fault_class or UNKNOWN

    def out_until(self, until: datetime) -> datetime:
        """When the node came back into service from this fault (``until`` if not yet)."""
        if self.closed_at is None:
            return until
        if self.status == RemediationStatus.QUARANTINED:
            return self.released_at if self.released_at and self.released_at > self.closed_at else until
        return self.closed_at


def overlap_h(start: datetime, end: datetime, since: datetime, *, until: datetime) -> float:
    """Hours of [start, end) inside [since, until)."""
    return max(0.0, (min(end, until) - max(start, since)).total_seconds() / 3600.0)


def out_hours(faults: Iterable[Fault], since: datetime, until: datetime) -> float:
    """Node-hours out of service in the window; overlapping faults of one node count once."""
    by_node: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for f in faults:
        by_node[f.node].append((f.opened_at, f.out_until(until)))
    total = 0.0
    for spans in by_node.values():
        end_seen = since
        for start, end in sorted(spans):
            start = max(start, end_seen)
            if end > start:
                total += overlap_h(start, end, since, until=until)
                end_seen = end
    return total


@dataclass(frozen=True)
class Group:
    """The figures of one group (a pool, rack, zone, SKU...) over the window."""

    name: str
    nodes: int
    faults: int
    by_class: dict[str, int]
    repairs: int
    repair_median_h: float | None
    repair_mean_h: float | None
    out_h: float
    mtbf_h: float | None


@dataclass(frozen=True)
class Mtbf:
    """MTBF of one node or one piece of hardware."""

    name: str
    faults: int
    hours: float  # hours in service within the window
    mtbf_h: float | None
    sku: str | None = None
    nodes: tuple[str, ...] = ()  # the node names it served under (hardware)


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime

    @property
    def hours(self) -> float:
        return (self.until - self.since).total_seconds() / 3600.0

    @property
    def days(self) -> list[date]:
        first, last = self.since.date(), (self.until - timedelta(microseconds=1)).date()
        return [first + timedelta(days=i) for i in range((last - first).days + 1)]


@dataclass(frozen=True)
class Trends:
    window: Window
    by: str  # what the groups group by: pool, rack, zone, sku, or a failure-domain kind
    groups: list[Group]
    daily: list[tuple[date, dict[str, int]]]  # faults per UTC day, by class
    classes: list[str]
    nodes: list[Mtbf]


def opened_in(faults: Iterable[Fault], w: Window) -> list[Fault]:
    return [f for f in faults if w.since <= f.opened_at < w.until]


def repairs_h(faults: Iterable[Fault], w: Window) -> list[float]:
    return [
        (f.closed_at - f.opened_at).total_seconds() / 3600.0
        for f in faults
        if f.status == RemediationStatus.SUCCEEDED and f.closed_at is not None and w.since <= f.closed_at < w.until
    ]


def mtbf(hours: float, faults: int) -> float | None:
    return hours / faults if faults else None


def by_node(faults: Iterable[Fault]) -> dict[str, list[Fault]]:
    mine: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        mine[f.node].append(f)
    return mine


def exposure_h(mine: list[Fault], first: datetime | None, w: Window) -> float:
    """A node's hours in service in the window: from when the service first saw it (None: its first
    fault), or the window's start if later, to the window's end, less its hours out of service since."""
    if first is None:
        first = min((f.opened_at for f in mine), default=w.until)
    start = max(first, w.since)
    if start >= w.until:
        return 0.0
    return overlap_h(start, w.until, w.since, until=w.until) - out_hours(mine, start, w.until)


def group(name: str, nodes: set[str], faults: list[Fault], *, w: Window, hours: float) -> Group:
    """One group's figures: ``faults`` are every fault of its nodes (any time), ``nodes`` its members,
    ``hours`` the sum of its nodes' :func:`exposure_h`, over which its MTBF is counted."""
    inside = opened_in(faults, w)
    rep = repairs_h(faults, w)
    out = out_hours(faults, w.since, w.until)
    return Group(
        name, len(nodes), len(inside), dict(sorted(Counter(f.cause for f in inside).items())), len(rep),
        statistics.median(rep) if rep else None, statistics.fmean(rep) if rep else None, out,
        mtbf(hours, len(inside)),
    )  # fmt: skip


def per_node(faults: list[Fault], nodes: dict[str, datetime], w: Window) -> list[Mtbf]:
    """Each node's faults, hours in service (:func:`exposure_h`) and MTBF in the window (``nodes``: node
    -> first seen; a node with a fault and no first sighting has a row too)."""
    mine = by_node(faults)
    rows = []
    for n in nodes.keys() | mine.keys():
        hours = exposure_h(mine.get(n, []), nodes.get(n), w)
        count = len(opened_in(mine.get(n, []), w))
        rows.append(Mtbf(n, count, hours, mtbf(hours, count)))
    return sorted(rows, key=lambda m: (-m.faults, m.name))


def fleet_group(faults: list[Fault], rows: list[Mtbf], w: Window) -> Group:
    """Every node together: its MTBF is the sum of the node rows' hours over the faults."""
    return group("fleet", {m.name for m in rows}, faults, w=w, hours=sum(m.hours for m in rows))


def trends(faults: list[Fault], nodes: dict[str, datetime], w: Window, *, by: str,
           key: Callable[[str, Fault | None], str], node_rows: list[Mtbf] | None = None) -> Trends:
    """Every figure of the window. ``nodes``: node -> first seen; ``key(node, fault)`` names the group of
    a node (for a fault, of the node at that fault: the SKU it ran on); ``node_rows``: :func:`per_node`,
    when the caller has it already. A node's hours in service count in the group it is in now."""
    rows = per_node(faults, nodes, w) if node_rows is None else node_rows
    members: dict[str, set[str]] = defaultdict(set)
    hours: dict[str, float] = defaultdict(float)
    of_group: dict[str, list[Fault]] = defaultdict(list)
    for m in rows:
        g = key(m.name, None)
        members[g].add(m.name)
        hours[g] += m.hours
    for f in faults:
        g = key(f.node, f)
        members[g].add(f.node)
        of_group[g].append(f)
    groups = sorted((group(g, members[g], of_group[g], w=w, hours=hours[g]) for g in members),
                    key=lambda x: (-x.faults, x.name))
    inside = opened_in(faults, w)
    classes = sorted({f.cause for f in inside})
    per_day: dict[date, Counter[str]] = {d: Counter() for d in w.days}
    for f in inside:
        per_day[f.opened_at.date()][f.cause] += 1
    return Trends(w, by, groups, [(d, dict(c)) for d, c in per_day.items()], classes, rows)


@dataclass(frozen=True)
class Repaired:
    """One repair request the repair system finished: the hardware it named, opened and done."""

    node: str
    hardware: tuple[str, ...]  # the items it names: the machine (serial:, bmc:, host:, instance:) and gpu:SERIAL
    opened_at: datetime
    done_at: datetime


@dataclass(frozen=True)
class RepairTime:
    """The repair system's time for one hardware item over the window: each request opened to done."""

    hardware: str
    nodes: tuple[str, ...]
    repairs: int
    median_h: float
    total_h: float


def repair_times(done: Iterable[Repaired], w: Window) -> list[RepairTime]:
    """Per hardware item, the requests done within the window, longest total first."""
    spans: dict[str, list[float]] = defaultdict(list)
    names: dict[str, set[str]] = defaultdict(set)
    for r in done:
        if not w.since <= r.done_at < w.until:
            continue
        for item in r.hardware:
            spans[item].append((r.done_at - r.opened_at).total_seconds() / 3600)
            names[item].add(r.node)
    rows = [RepairTime(k, tuple(sorted(names[k])), len(v), statistics.median(v), sum(v)) for k, v in spans.items()]
    return sorted(rows, key=lambda x: (-x.total_h, x.hardware))
