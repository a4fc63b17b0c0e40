"""The rehearsal's outcome model: what each kind of fault really needs, as data, never as policy.

``remediation simulate`` has to say whether an action *worked*, and no decision code may know the
answer: that is the ground truth the policy is trying to guess. So it lives here, read from a file
(``--truth``), one entry per failure-mix category:

- ``p_restart``: the chance that a restart on the same host fixes the fault;
- ``p_move``: the chance that moving to other hardware (GCE/AWS stop-start, Azure redeploy) fixes it;
  a move also reboots, so it is at least ``p_restart``;
- ``p_reimage``: the chance that a fresh disk image fixes it (defaults to ``p_restart``: a reimage
  reboots the same host, and fixes software besides);
- ``fabric``: the fault is outside the node (a switch, a cable): no node action fixes it, the fabric
  is repaired by hand and every node it hit comes back together;
- ``xids`` / ``conditions``: the causes the fault shows in its signals, drawn at random by the trace.

One uniform draw per fault decides all three (``u < p``), so the three outcomes are nested: whatever a
restart fixes, a move fixes too. Everything else is repaired by hand ``repair_hours`` after a human is
handed the node (a quarantine, a page) — that part lives in the simulation, not here.

These numbers are assumptions. The shipped file says where each one came from, and the rehearsal's
gains are checked against other models (``remediation/data/truth-*.yaml``) because of that.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class TruthError(ValueError):
    """An outcome model that cannot be used; the message names the category and field."""


@dataclass(frozen=True)
class CategoryTruth:
    p_restart: float
    p_move: float
    p_reimage: float
    fabric: bool = False
    xids: tuple[int, ...] = ()
    conditions: tuple[str, ...] = ()  # "Type: message" pairs a Kubernetes signal may carry
    source: str = ""  # where the numbers came from (free text, shown in docs)


@dataclass(frozen=True)
class Outcome:
    """What one fault needs. ``fixed_by`` holds the action kinds (restart, move, reimage) that fix it."""

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
        fixed = {kind for kind, p in (("restart", t.p_restart), ("move", t.p_move), ("reimage", t.p_reimage))
                 if u < p}
        return Outcome(category, frozenset(fixed))


def _probability(raw: Mapping[str, Any], key: str, category: str, default: float | None = None) -> float:
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
    """An outcome model from its parsed YAML/JSON: ``{"categories": {NAME: {p_restart: ..., ...}}}``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("categories"), Mapping):
        raise TruthError(f"{name}: an outcome model is a mapping with a 'categories' mapping")
    out: dict[str, CategoryTruth] = {}
    for category, raw in data["categories"].items():
        if not isinstance(raw, Mapping):
            raise TruthError(f"category {category!r}: expected a mapping of fields")
        unknown = set(raw) - {"p_restart", "p_move", "p_reimage", "fabric", "xids", "conditions", "source"}
        if unknown:
            raise TruthError(f"category {category!r}: unknown field(s) {sorted(unknown)}")
        fabric = bool(raw.get("fabric", False))
        restart = _probability(raw, "p_restart", category, 0.0 if fabric else None)
        move = _probability(raw, "p_move", category, 0.0 if fabric else None)
        reimage = _probability(raw, "p_reimage", category, restart)
        if move < restart:
            raise TruthError(f"category {category!r}: p_move ({move}) must be at least p_restart ({restart}): "
                             "a move reboots too")
        try:
            xids = tuple(int(x) for x in raw.get("xids", ()))
        except (TypeError, ValueError):
            raise TruthError(f"category {category!r}: xids must be a list of integers") from None
        conditions = tuple(str(c) for c in raw.get("conditions", ()))
        out[str(category)] = CategoryTruth(restart, move, reimage, fabric, xids, conditions, str(raw.get("source", "")))
    return OutcomeModel(name, out)
