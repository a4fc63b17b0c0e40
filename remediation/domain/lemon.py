"""Lemon scoring: a node's failure history as one number, and the words that explain it.

The score sums each failure's class weight, halved every ``half_life_s`` of age, and multiplies by a
bonus per distinct cause class. A node at or over ``policy.lemon.threshold`` with at least
``policy.lemon.min_failures`` failures is quarantined; only real failures after its last human release
count. Pure: the caller passes the history; the clock is the time of the failure being decided.

Why: docs/policy.md#lemons-the-score
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from remediation.domain.causes import shipped
from remediation.settings import LemonSettings


@dataclass(frozen=True)
class Failure:
    at: datetime
    fault_class: str | None  # None: opened before classification existed, or by hand: unknown


@dataclass(frozen=True)
class LemonScore:
    score: float
    failures: int  # failures counted (within the horizon, of a class with weight)
    distinct: int  # distinct classes among them
    explanation: str

    def over(self, cfg: LemonSettings) -> bool:
        return cfg.enabled and self.failures >= cfg.min_failures and self.score >= cfg.threshold


def weight_of(fault_class: str | None, cfg: LemonSettings) -> float:
    """The class's weight: the site's (policy.lemon.weights), else the shipped table's, else 1."""
    cls = fault_class or "unknown"
    if cls in cfg.weights:
        return cfg.weights[cls]
    info = shipped().classes.get(cls)
    return info.lemon_weight if info else 1.0


def score(history: Iterable[Failure], now: datetime, cfg: LemonSettings) -> LemonScore:
    """The node's score at ``now`` from ``history`` (its failures; anything older than the horizon or
    in the future is left out)."""
    kept = [f for f in history if 0 <= (now - f.at).total_seconds() <= cfg.horizon_s]
    if not kept:
        return LemonScore(0.0, 0, 0, "no failures counted")
    by_class: Counter[str] = Counter()
    decayed: dict[str, float] = {}
    for f in kept:
        cls = f.fault_class or "unknown"
        by_class[cls] += 1
        age = (now - f.at).total_seconds()
        decayed[cls] = decayed.get(cls, 0.0) + weight_of(cls, cfg) * 0.5 ** (age / cfg.half_life_s)
    # Classes of zero weight (fabric) do not make a node's failures more varied.
    distinct = sum(1 for cls in by_class if weight_of(cls, cfg) > 0)
    factor = (1 + cfg.distinct_bonus) ** max(distinct - 1, 0)
    total = sum(decayed.values()) * factor
    parts = ", ".join(f"{cls} x{n} (w {weight_of(cls, cfg):g}, now {decayed[cls]:.2f})"
                      for cls, n in sorted(by_class.items(), key=lambda kv: (-decayed[kv[0]], kv[0])))
    days = cfg.half_life_s / 86400
    why = (f"{len(kept)} failure(s) decayed with a {days:g}-day half-life: {parts}; "
           f"{distinct} distinct cause(s) x{factor:.2f} = {total:.2f} (quarantine at {cfg.threshold:g} "
           f"with {cfg.min_failures}+ failures)")
    counted = sum(n for cls, n in by_class.items() if weight_of(cls, cfg) > 0)
    return LemonScore(round(total, 3), counted, distinct, why)
