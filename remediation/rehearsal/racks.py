"""NVL72 racks in the rehearsal: domain faults placed on a rack fleet, and each played out twice, by the
domain ladder (one repair of the whole rack) and per tray (every tray climbs its own node ladder).

A domain fault takes all of a rack's compute trays out at once; what cures it is drawn from the outcome
model's ``racks`` section, and so is every rung's duration. :func:`compare` counts the node-hours each
way loses, per domain fault.

Why: docs/rehearsal.md#nvl72-racks-and-domain-faults
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from remediation.rehearsal.truth import CURES, RackModel
from remediation.vocabulary import GPU_RESET, HOLD, QUARANTINE


@dataclass(frozen=True)
class DomainFault:
    """A fault of one rack's NVLink domain: ``cure`` is the first repair that fixes it (or ``rma``)."""

    at: datetime
    rack: int
    kind: str
    fault_class: str
    cure: str


def trays(rack: int, model: RackModel) -> list[str]:
    """The compute trays (nodes) of rack ``rack``: the fleet's nodes are racked in order."""
    n = model.compute_trays
    return [f"gpu-node-{rack * n + i}" for i in range(n)]


def domain_faults(model: RackModel, racks: int, *, start: datetime, days: float, seed: int) -> list[DomainFault]:
    """Each kind's faults on each rack over ``days`` (its yearly rate scaled, the remainder drawn), at
    random times, each with its cure drawn from the kind's chances. Seeded: same seed, same faults."""
    rng = random.Random(seed * 104729 + 3)  # its own stream: the node faults' trace stays as it was
    out = []
    for rack in range(racks):
        for name, kind in model.kinds.items():
            expected = kind.per_rack_year * days / 365.0
            n = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
            for _ in range(n):
                at = start + timedelta(days=rng.uniform(0, days))
                out.append(DomainFault(at, rack, name, kind.fault_class, model.cure(name, rng.random())))
    return sorted(out, key=lambda f: (f.at, f.rack))


@dataclass
class Playout:
    """One strategy on one domain fault: each tray's hours out of service until it is back in service or
    quarantined, the trays quarantined, the pages and the actions taken (by rung)."""

    tray_hours: dict[str, float] = field(default_factory=dict)
    quarantined: int = 0
    pages: int = 0
    actions: Counter[str] = field(default_factory=Counter)

    @property
    def hours(self) -> float:
        return sum(self.tray_hours.values())


def domain_ladder(fault: DomainFault, model: RackModel) -> Playout:
    """Fabric restart on every tray (a job per tray, side by side), the domain check; then the rack's
    chassis power cycle and the check again; then the whole domain quarantined with one page."""
    names, out = trays(fault.rack, model), Playout()
    t = 0.0
    for cure, rung in zip(CURES, ("fabric-restart", "chassis-power-cycle"), strict=True):
        t += model.seconds(rung) + model.seconds("domain-check")
        out.actions[rung] += len(names) if rung == "fabric-restart" else 1
        out.actions["domain-check"] += 1
        if fault.cure == cure:
            break
    else:
        out.quarantined, out.pages = len(names), 1
    out.tray_hours = {n: t / 3600 for n in names}
    return out


@dataclass(frozen=True)
class TrayPace:
    """What a tray's own rungs take: a GPU reset, a reboot (the site's), and a human's repair once the
    service hands a tray over (a hold or a quarantine)."""

    reset_s: float
    reboot_s: float
    repair_s: float


def per_tray(fault: DomainFault, model: RackModel, rungs: tuple[str, ...], *, pace: TrayPace) -> Playout:
    """Every tray climbs ``rungs`` alone: each action, then the GPU check, which fails while the domain is
    broken (a tray's own reset or reboot does not restart the domain). The first tray handed to a
    human (held or quarantined) gets the rack repaired ``repair_s`` later; every tray still out then
    comes back with it, and a quarantined one counts until its quarantine."""
    names, out = trays(fault.rack, model), Playout()
    ends: dict[str, tuple[float, str]] = {}
    for name in names:
        t = 0.0
        for rung in (*rungs, QUARANTINE):
            if rung in (HOLD, QUARANTINE):
                ends[name] = (t, rung)
                out.pages += 1  # a hold and a quarantine each page on-call, tray by tray
                break
            t += (pace.reset_s if rung == GPU_RESET else pace.reboot_s) + model.seconds("tray-check")
            out.actions[rung] += 1
    repaired = min(t for t, _ in ends.values()) + pace.repair_s
    for name, (t, how) in ends.items():
        quarantined = how == QUARANTINE and t < repaired
        out.quarantined += quarantined
        out.tray_hours[name] = (t if quarantined else repaired) / 3600
    return out


@dataclass
class DomainFigures:
    """Both strategies over the same domain faults: node-hours lost in all and per fault, and what each did."""

    racks: int
    faults: int
    by_kind: dict[str, int]
    domain_ladder: Playout
    per_tray: Playout

    def per_fault(self, p: Playout) -> float | None:
        return p.hours / self.faults if self.faults else None

    @property
    def ratio(self) -> float | None:
        a, b = self.per_fault(self.domain_ladder), self.per_fault(self.per_tray)
        return a / b if a is not None and b else None

    def as_dict(self) -> dict[str, Any]:
        def side(p: Playout) -> dict[str, Any]:
            per = self.per_fault(p)
            return {"node_hours_lost": round(p.hours, 2),
                    "node_hours_lost_per_fault": None if per is None else round(per, 2),
                    "quarantined_trays": p.quarantined, "pages": p.pages, "actions": dict(sorted(p.actions.items()))}

        ratio = self.ratio
        return {"racks": self.racks, "faults": self.faults, "by_kind": self.by_kind,
                "domain_ladder": side(self.domain_ladder), "per_tray": side(self.per_tray),
                "ratio": None if ratio is None else round(ratio, 3)}


def compare(faults: list[DomainFault], model: RackModel, *, racks: int, rungs: Callable[[str], tuple[str, ...]],
            pace: TrayPace) -> DomainFigures:
    """Play every domain fault out both ways and add up; ``rungs`` gives a fault class's node ladder."""
    ladder, alone = Playout(), Playout()
    for f in faults:
        for total, one in ((ladder, domain_ladder(f, model)), (alone, per_tray(f, model, rungs(f.fault_class),
                                                                                   pace=pace))):
            for name, hours in one.tray_hours.items():
                total.tray_hours[name] = total.tray_hours.get(name, 0.0) + hours
            total.quarantined += one.quarantined
            total.pages += one.pages
            total.actions.update(one.actions)
    return DomainFigures(racks, len(faults), dict(sorted(Counter(f.kind for f in faults).items())), ladder, alone)

