"""Which profile governs a node, and why each field of its policy has the value it has.

:func:`resolve` walks the profiles in order over :class:`NodeFacts`; the first that selects the node
wins, and the later ones that also select it are kept for ``policy explain``. :func:`explain` lists each
field of the effective policy with the layer that set it (``default``, ``base config`` or
``profile``). Pure: the facts and the settings are passed in.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

from remediation.domain.policy import Decision, DecisionKind
from remediation.hostlist import expand
from remediation.profiles.settings import SECTIONS, Mode, effective
from remediation.settings import EffectivePolicy, ProfileSelect, ProfileSettings
from remediation.settings.selector import Requirement, matches, parse_selector


@dataclass(frozen=True)
class NodeFacts:
    """What the watchers have told of a node that a profile may select on."""

    name: str
    partitions: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolution:
    profile: ProfileSettings | None  # the winner; None: the base policy
    also: tuple[str, ...] = ()  # later profiles that select the node too

    @property
    def name(self) -> str | None:
        return self.profile.name if self.profile is not None else None


def selects(select: ProfileSelect, node: NodeFacts) -> bool:
    """Every criterion given holds for ``node``."""
    if select.partitions and not node.partitions & set(select.partitions):
        return False
    if select.features and not set(select.features) <= node.features:
        return False
    if select.hostlist is not None and node.name not in _hosts(select.hostlist):
        return False
    return select.labels is None or matches(_requirements(select.labels), node.labels)


def resolve(profiles: Sequence[ProfileSettings], node: NodeFacts) -> Resolution:
    chosen = [p for p in profiles if selects(p.select, node)]
    if not chosen:
        return Resolution(None)
    return Resolution(chosen[0], tuple(p.name for p in chosen[1:]))


def winners(profiles: Sequence[ProfileSettings], nodes: Sequence[NodeFacts]) -> dict[str, list[str]]:
    """Profile name -> the known nodes it governs (a profile that wins none maps to an empty list)."""
    out: dict[str, list[str]] = {p.name: [] for p in profiles}
    for node in nodes:
        if (name := resolve(profiles, node).name) is not None:
            out[name].append(node.name)
    return out


def label_keys(profiles: Sequence[ProfileSettings]) -> list[str]:
    """The Node label keys the profiles' selectors name: what the Kubernetes watcher reports."""
    keys = (r.key for p in profiles if p.select.labels for r in _requirements(p.select.labels))
    return sorted(set(keys))


class Governance:
    """The profiles of one configuration with their effective policies, worked out once."""

    def __init__(self, base: EffectivePolicy, profiles: Sequence[ProfileSettings] = ()) -> None:
        self.base = base
        self.profiles = tuple(profiles)
        self._policies = {p.name: effective(base, p) for p in self.profiles}

    def of(self, node: NodeFacts) -> tuple[Resolution, EffectivePolicy]:
        """Which profile governs ``node`` and its effective policy."""
        found = resolve(self.profiles, node)
        return found, self.named(found.name)

    def named(self, name: str | None) -> EffectivePolicy:
        """The effective policy of profile ``name`` (the base for None, or a name no longer configured)."""
        return self._policies.get(name, self.base) if name is not None else self.base


def govern(decision: Decision, policy: EffectivePolicy) -> Decision:
    """A profile in mode ``off`` opens nothing: the fault is recorded, and the node left to humans."""
    if policy.mode == Mode.OFF and decision.kind in (DecisionKind.OPEN, DecisionKind.QUARANTINE, DecisionKind.DOMAIN):
        return Decision(
            DecisionKind.RECORD, f"profile {policy.profile} is off: {decision.reason}", cause=decision.cause
        )
    return decision


class Layer(StrEnum):
    DEFAULT = "default"
    BASE = "base config"
    PROFILE = "profile"


@dataclass(frozen=True)
class FieldValue:
    path: str  # section.field, nested sections dotted (policy.faults.ladders)
    value: Any
    layer: Layer


def explain(base: EffectivePolicy, profile: ProfileSettings | None) -> list[FieldValue]:
    """Every field of the effective policy, its value and the layer that set it."""
    eff = effective(base, profile)
    overrides = profile.overrides() if profile is not None else {}
    out = [FieldValue("mode", eff.mode, Layer.PROFILE if profile is not None else Layer.DEFAULT)]
    for section in SECTIONS:
        out += _fields(section, getattr(eff, section), getattr(base, section),
                       override=overrides.get(section, {}))
    return out


def _fields(
    prefix: str, model: BaseModel, base: BaseModel, *, override: Mapping[str, Any]
) -> Iterator[FieldValue]:
    for name in type(model).model_fields:
        if prefix == "machine" and name != "backend":
            continue  # endpoints and credentials are the service's, not the policy's
        value, path = getattr(model, name), f"{prefix}.{name}"
        below = getattr(base, name)
        if isinstance(value, BaseModel) and isinstance(below, BaseModel):
            nested = override.get(name, {})
            yield from _fields(path, value, below, override=nested if isinstance(nested, Mapping) else {})
            continue
        layer = (
            Layer.PROFILE
            if name in override
            else Layer.BASE
            if name in base.model_fields_set
            else Layer.DEFAULT
        )
        yield FieldValue(
            path, value.model_dump(mode="json") if isinstance(value, BaseModel) else value, layer
        )


@lru_cache(maxsize=256)
def _hosts(hostlist: str) -> frozenset[str]:
    return frozenset(expand(hostlist))


@lru_cache(maxsize=256)
def _requirements(selector: str) -> tuple[Requirement, ...]:
    return parse_selector(selector)
