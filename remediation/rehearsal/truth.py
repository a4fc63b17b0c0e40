"""The rehearsal's outcome model: what each kind of fault really needs, as data, never as policy.

Read from a file (``--truth``), one entry per failure-mix category: the chances that a GPU reset, a
restart, a move or a reimage fixes it, whether it is the fabric's, and the causes its signals show;
``times`` says how long each machine action takes; ``racks`` (optional) the NVL72 racks' domain faults.
Every number must name its ``source``, or the model is refused.

Why: docs/rehearsal.md#the-outcome-model-file
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from remediation.vocabulary import FAULT_CLASSES


class TruthError(ValueError):
    """An outcome model that cannot be used; the message names the category and field."""


@dataclass(frozen=True)
class CategoryTruth:
    p_restart: float
    p_move: float
    p_reimage: float
    p_reset: float = 0.0
    fabric: bool = False
    xids: tuple[int, ...] = ()
    conditions: tuple[str, ...] = ()  # "Type: message" pairs a Kubernetes signal may carry
    source: str = ""  # where the numbers came from (free text, shown in docs)


#: The machine actions whose duration an outcome model gives (``times``), in minutes.
TIMES = ("gpu-reset", "vm-restart", "bare-metal-reboot")
#: A site's reboot: a cloud restarts a VM, a bare-metal site reboots the machine.
SITE_REBOOT = {"cloud": "vm-restart", "bare-metal": "bare-metal-reboot"}


@dataclass(frozen=True)
class Duration:
    minutes: float
    source: str


#: The domain ladder's repairs in order (``p_<cure>``: the chance it cures a domain fault); past them, RMA.
CURES = ("fabric-restart", "power-cycle")
RMA = "rma"
#: What a rack section times, in minutes: the domain ladder's rungs and the GPU check after a tray's action.
RACK_TIMES = ("fabric-restart", "domain-check", "chassis-power-cycle", "tray-check")


@dataclass(frozen=True)
class DomainKind:
    """One kind of NVLink domain fault: how often it strikes a rack, the chance each domain repair
    cures it (nested: what a fabric restart cures, a power cycle cures too), and the fault class its
    trays' signals fall in (the node ladder they climb when each tray is remediated alone)."""

    per_rack_year: float
    p_fabric_restart: float
    p_power_cycle: float
    fault_class: str
    source: str


@dataclass(frozen=True)
class RackModel:
    """NVL72 racks: ``compute_trays`` nodes and ``switch_trays`` switch trays (not nodes) in one NVLink domain."""

    compute_trays: int
    switch_trays: int
    source: str
    kinds: Mapping[str, DomainKind] = field(default_factory=dict)
    times: Mapping[str, Duration] = field(default_factory=dict)

    def seconds(self, action: str) -> float:
        return self.times[action].minutes * 60

    def cure(self, kind: str, u: float) -> str:
        """What cures a fault of ``kind`` for the uniform draw ``u``: the first repair whose chance is above it."""
        k = self.kinds[kind]
        return next((c for c, p in zip(CURES, (k.p_fabric_restart, k.p_power_cycle), strict=True) if u < p), RMA)


@dataclass(frozen=True)
class Outcome:
    """What one fault needs. ``fixed_by`` holds the action kinds (reset, restart, move, reimage) that
    fix it."""

    category: str
    fixed_by: frozenset[str]
    fabric: bool = False

    @property
    def needs_hands(self) -> bool:
        return not self.fixed_by


@dataclass(frozen=True)
class OutcomeModel:
    name: str
    categories: Mapping[str, CategoryTruth] = field(default_factory=dict)
    times: Mapping[str, Duration] = field(default_factory=dict)
    racks: RackModel | None = None

    def minutes(self, action: str, default: float | None = None) -> float:
        """How long ``action`` takes in this model; ``default`` for a model without ``times``."""
        if action in self.times:
            return self.times[action].minutes
        if default is None:
            raise TruthError(f"outcome model {self.name!r} gives no time for {action!r} (times)")
        return default

    def truth(self, category: str) -> CategoryTruth:
        try:
            return self.categories[category]
        except KeyError:
            raise TruthError(f"outcome model {self.name!r} has no category {category!r}") from None

    def roll(self, category: str, rng: random.Random) -> Outcome:
        t = self.truth(category)
        if t.fabric:
            return Outcome(category, frozenset(), fabric=True)
        u = rng.random()
        fixed = {kind for kind, p in (("reset", t.p_reset), ("restart", t.p_restart), ("move", t.p_move),
                                      ("reimage", t.p_reimage)) if u < p}
        return Outcome(category, frozenset(fixed))


def _probability(raw: Mapping[str, Any], key: str, category: str, *, default: float | None = None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise TruthError(f"category {category!r}: {key} is required")
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise TruthError(f"category {category!r}: {key} {value!r} is not a number") from None
    if not 0.0 <= p <= 1.0:
        raise TruthError(f"category {category!r}: {key} must be between 0 and 1 (got {p})")
    return p


def parse_model(name: str, data: Any) -> OutcomeModel:
    """An outcome model from its parsed YAML/JSON: ``{"categories": {NAME: {p_restart: ..., source: ...}},
    "times": {ACTION: {minutes: ..., source: ...}}, "racks": {...}}`` (racks: see :func:`_racks`)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("categories"), Mapping):
        raise TruthError(f"{name}: an outcome model is a mapping with a 'categories' mapping")
    racks = _racks(data["racks"]) if data.get("racks") is not None else None
    return OutcomeModel(name, _categories(data["categories"]), _times(data.get("times", {})), racks)


def _categories(data: Mapping[str, Any]) -> dict[str, CategoryTruth]:
    out: dict[str, CategoryTruth] = {}
    for category, raw in data.items():
        if not isinstance(raw, Mapping):
            raise TruthError(f"category {category!r}: expected a mapping of fields")
        unknown = set(raw) - {"p_restart", "p_move", "p_reimage", "p_reset", "fabric", "xids", "conditions", "source"}
        if unknown:
            raise TruthError(f"category {category!r}: unknown field(s) {sorted(unknown)}")
        fabric = bool(raw.get("fabric", False))
        restart = _probability(raw, "p_restart", category, default=0.0 if fabric else None)
        move = _probability(raw, "p_move", category, default=0.0 if fabric else None)
        reimage = _probability(raw, "p_reimage", category, default=restart)
        reset = _probability(raw, "p_reset", category, default=0.0)
        if reset > restart:
            raise TruthError(f"category {category!r}: p_reset ({reset}) must be at most p_restart ({restart}): "
                             "a reboot resets every GPU too")
        if move < restart:
            raise TruthError(f"category {category!r}: p_move ({move}) must be at least p_restart ({restart}): "
                             "a move reboots too")
        try:
            xids = tuple(int(x) for x in raw.get("xids", ()))
        except (TypeError, ValueError):
            raise TruthError(f"category {category!r}: xids must be a list of integers") from None
        conditions = tuple(str(c) for c in raw.get("conditions", ()))
        if not str(raw.get("source") or "").strip():
            raise TruthError(f"category {category!r}: source is required (where its numbers came from)")
        out[str(category)] = CategoryTruth(restart, move, reimage, reset, fabric, xids, conditions, str(raw["source"]))
    return out


def _times(data: Any, actions: tuple[str, ...] = TIMES, where: str = "times") -> dict[str, Duration]:
    if not isinstance(data, Mapping):
        raise TruthError(f"{where}: expected a mapping of action -> {{minutes, source}}")
    out: dict[str, Duration] = {}
    for action, raw in data.items():
        if action not in actions:
            raise TruthError(f"{where}: unknown action {action!r}; choose from {list(actions)}")
        if not isinstance(raw, Mapping) or set(raw) - {"minutes", "source"}:
            raise TruthError(f"{where}: {action}: expected {{minutes, source}}")
        try:
            minutes = float(raw.get("minutes"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TruthError(f"{where}: {action}: minutes {raw.get('minutes')!r} is not a number") from None
        if minutes <= 0:
            raise TruthError(f"{where}: {action}: minutes must be more than 0 (got {minutes})")
        if not str(raw.get("source") or "").strip():
            raise TruthError(f"{where}: {action}: source is required (where the time came from)")
        out[str(action)] = Duration(minutes, str(raw["source"]))
    return out


def _racks(data: Any) -> RackModel:
    """The ``racks`` section: ``{compute_trays, switch_trays, source, times: {RUNG: {minutes, source}},
    kinds: {NAME: {per_rack_year, p_fabric_restart, p_power_cycle, class, source}}}``; every rung timed."""
    if not isinstance(data, Mapping) or set(data) - {"compute_trays", "switch_trays", "source", "times", "kinds"}:
        raise TruthError("racks: expected compute_trays, switch_trays, source, times and kinds")
    try:
        compute, switch = int(data.get("compute_trays", 0)), int(data.get("switch_trays", 0))
    except (TypeError, ValueError):
        raise TruthError("racks: compute_trays and switch_trays must be whole numbers") from None
    if compute < 1 or switch < 0:
        raise TruthError(f"racks: compute_trays must be at least 1 and switch_trays not negative (got {compute}, {switch})")
    _sourced(data, "racks")
    times = _times(data.get("times", {}), RACK_TIMES, "racks.times")
    if missing := [a for a in RACK_TIMES if a not in times]:
        raise TruthError(f"racks.times: no time for {missing}: every rung of both ladders needs one")
    kinds = data.get("kinds")
    if not isinstance(kinds, Mapping) or not kinds:
        raise TruthError("racks.kinds: expected a mapping of domain fault kinds")
    return RackModel(compute, switch, str(data["source"]), {str(k): _kind(str(k), v) for k, v in kinds.items()}, times)


def _kind(name: str, raw: Any) -> DomainKind:
    where = f"racks.kinds.{name}"
    if not isinstance(raw, Mapping) or set(raw) - {"per_rack_year", "p_fabric_restart", "p_power_cycle", "class",
                                                  "source"}:
        raise TruthError(f"{where}: expected per_rack_year, p_fabric_restart, p_power_cycle, class and source")
    restart, cycle = (_probability(raw, f"p_{c.replace('-', '_')}", where) for c in CURES)
    if cycle < restart:
        raise TruthError(f"{where}: p_power_cycle ({cycle}) must be at least p_fabric_restart ({restart}): "
                         "a power cycle restarts the fabric software too")
    try:
        rate = float(raw.get("per_rack_year"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TruthError(f"{where}: per_rack_year {raw.get('per_rack_year')!r} is not a number") from None
    if rate < 0:
        raise TruthError(f"{where}: per_rack_year must not be negative (got {rate})")
    if raw.get("class") not in FAULT_CLASSES:
        raise TruthError(f"{where}: class {raw.get('class')!r} is not a fault class; choose from {list(FAULT_CLASSES)}")
    _sourced(raw, where)
    return DomainKind(rate, restart, cycle, str(raw["class"]), str(raw["source"]))


def _sourced(raw: Mapping[str, Any], where: str) -> None:
    if not str(raw.get("source") or "").strip():
        raise TruthError(f"{where}: source is required (where its numbers came from)")
