"""What ``remediation policy show`` and ``remediation policy explain`` say, and the API serves.

``show`` lists the profiles in order: what each selects, its mode, its overrides and how many known
nodes it governs (flagging none); with a name, each effective field and its layer. ``explain`` takes a
node: its reported facts, its profile and the later ones that also select it, each field with its
layer, and the policy an open remediation recorded.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.models import Remediation
from remediation.domain.statemachine import OPEN_STATUSES
from remediation.profiles.rules import NodeFacts, explain, resolve, winners
from remediation.profiles.service import facts_of
from remediation.services.readmodels import RecordNotFound
from remediation.settings import ProfileSettings, Settings


def show(session: Session, settings: Settings, name: str | None = None) -> dict[str, Any]:
    known = facts_of(session)
    won = winners(settings.profiles, list(known.values()))
    base = len(known) - sum(len(nodes) for nodes in won.values())
    profiles = [_profile(p, won[p.name]) for p in settings.profiles]
    out: dict[str, Any] = {"profiles": profiles, "base_nodes": base, "known_nodes": len(known)}
    if name is not None:
        profile = settings.profile(name)
        if profile is None:
            raise RecordNotFound(
                f"no profile {name!r}; configured: {', '.join(p.name for p in settings.profiles)}"
                if settings.profiles
                else f"no profile {name!r}: none is configured"
            )
        out["profile"] = _profile(profile, won[name])
        out["fields"] = _fields(settings, profile)
    return out


def explain_node(session: Session, settings: Settings, node: str) -> dict[str, Any]:
    facts = facts_of(session, [node]).get(node)
    if facts is None:
        raise RecordNotFound(f"unknown node {node!r}: it is not in the inventory (has a watcher seen it?)")
    found = resolve(settings.profiles, facts)
    rem = session.scalars(
        select(Remediation).where(Remediation.node == node, Remediation.status.in_(OPEN_STATUSES))
    ).first()
    return {
        "node": node,
        "facts": _facts(facts),
        "profile": found.name,
        "also_matched": list(found.also),
        "why": _why(found.name, list(found.also)),
        "mode": settings.policy_of(found.name).mode,
        "fields": _fields(settings, found.profile),
        "open_remediation": None
        if rem is None
        else {"id": rem.id, "profile": rem.profile, "dry_run": bool(rem.dry_run), "policy": rem.policy},
    }


def _profile(profile: ProfileSettings, nodes: list[str]) -> dict[str, Any]:
    return {
        "name": profile.name,
        "mode": profile.mode,
        "select": profile.select.model_dump(exclude_defaults=True),
        "overrides": {s: v for s, v in profile.overrides().items()},
        "nodes": len(nodes),
        "wins_no_node": not nodes,
    }


def _fields(settings: Settings, profile: ProfileSettings | None) -> list[dict[str, Any]]:
    return [
        {"field": f.path, "value": f.value, "layer": f.layer.value}
        for f in explain(settings.base_policy(), profile)
    ]


def _facts(facts: NodeFacts) -> dict[str, Any]:
    return {
        "partitions": sorted(facts.partitions),
        "features": sorted(facts.features),
        "labels": dict(facts.labels),
    }


def _why(winner: str | None, also: list[str]) -> str:
    if winner is None:
        return "no profile selects it: the base policy governs it"
    if also:
        return f"profile {winner} is the first that selects it; {', '.join(also)} also do, later in the list"
    return f"profile {winner} is the only one that selects it"
