"""Profiles in the database: what the watchers report a profile selects on, and each node's policy.

The Slurm watcher's inventory events carry a node's partitions and features, the Kubernetes watcher's
``labels`` events the Node labels some profile's selector names; :func:`record_facts` keeps the latest
of each on the ``nodes`` row. :func:`governed` resolves the profile of each node of an ingest batch from
those rows (:class:`remediation.profiles.rules.Governance`), and :func:`histories` reads each node's
repeat-offender, application-XID and lemon history over the windows of its own policy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from remediation.db.fault_history import app_xid_counts, failure_history
from remediation.db.models import Node
from remediation.db.queries import among, recent_failure_counts
from remediation.db.scope import cluster_of
from remediation.domain.events import EventKind, NodeEvent
from remediation.domain.lemon import Failure
from remediation.profiles.rules import Governance, NodeFacts, Resolution
from remediation.profiles.settings import Mode
from remediation.settings import (
    EffectivePolicy,
    IncidentSettings,
    MachineSettings,
    PolicySettings,
    Settings,
    ValidationSettings,
    WorkflowSettings,
)


def record_facts(session: Session, events: Iterable[NodeEvent]) -> int:
    """Keep the latest partitions, features and labels each node's events report."""
    slurm: dict[str, dict[str, Any]] = {}
    labels: dict[str, dict[str, Any]] = {}
    for ev in sorted(events, key=lambda e: e.observed_at):
        if ev.kind is EventKind.INVENTORY and ev.partitions is not None:
            slurm[ev.node] = {"name": ev.node, "partitions": ev.partitions, "features": ev.features or []}
        elif ev.kind is EventKind.LABELS and ev.labels is not None:
            labels[ev.node] = {"name": ev.node, "labels": ev.labels}
    cluster = cluster_of(session)  # an UPDATE by primary key names the row's cluster too
    for rows in (slurm, labels):  # one statement shape each
        if rows:
            session.execute(update(Node), [{"cluster": cluster, **row} for row in rows.values()])
    return len(slurm) + len(labels)


def facts_of(session: Session, names: Collection[str] | None = None) -> dict[str, NodeFacts]:
    """The facts of ``names`` (every known node when None)."""
    return {name: facts for name, (facts, _) in _nodes(session, names).items()}


def governance(settings: Settings) -> Governance:
    """The profiles of ``settings`` over its base policy."""
    return Governance(settings.base_policy(), settings.profiles)


def base_only(policy: PolicySettings, incidents: IncidentSettings | None) -> EffectivePolicy:
    """The policy of an ingest whose caller names no profiles: ``policy`` and ``incidents``, the only
    sections the ingest reads (such an ingest records no policy on what it opens)."""
    return EffectivePolicy(None, Mode.ACT, policy, WorkflowSettings(), MachineSettings(), ValidationSettings(),
                           incidents or IncidentSettings())


def governed(session: Session, governance: Governance, names: Collection[str]
             ) -> dict[str, tuple[Resolution, EffectivePolicy]]:
    """Each node's profile and effective policy, from what the watchers reported of it; a node whose
    profile changed joins its new pool (``nodes.profile``)."""
    if not governance.profiles:
        return {name: (Resolution(None), governance.base) for name in names}
    out, _ = _resolve(session, governance, names)
    return out


def refresh_pools(session: Session, governance: Governance) -> int:
    """Put every node in the pool of the profile that governs it now (the sweeper's, so that a new
    configuration's pools are right before any event arrives). Returns how many nodes moved."""
    if not governance.profiles:
        stale = list(session.scalars(select(Node.name).where(Node.profile.is_not(None))))
        if stale:
            session.execute(update(Node).where(among(session, Node.name, stale)).values(profile=None))
        return len(stale)
    return _resolve(session, governance, None)[1]


def _resolve(session: Session, governance: Governance, names: Collection[str] | None
             ) -> tuple[dict[str, tuple[Resolution, EffectivePolicy]], int]:
    rows = _nodes(session, names)
    out, moved = {}, []
    for name in sorted(rows if names is None else names):
        facts, stored = rows.get(name, (NodeFacts(name), None))
        out[name] = governance.of(facts)
        if name in rows and out[name][0].name != stored:
            moved.append({"cluster": cluster_of(session), "name": name, "profile": out[name][0].name})
    if moved:
        session.execute(update(Node), moved)
    return out, len(moved)


def _nodes(session: Session, names: Collection[str] | None) -> dict[str, tuple[NodeFacts, str | None]]:
    query = select(Node.name, Node.partitions, Node.features, Node.labels, Node.profile)
    if names is not None:
        query = query.where(among(session, Node.name, names))
    return {name: (NodeFacts(name, frozenset(parts or ()), frozenset(feats or ()), dict(labels or {})), profile)
            for name, parts, feats, labels, profile in session.execute(query)}


@dataclass
class Histories:
    failures: dict[str, int]  # fault episodes within the node's repeat-offender window
    app_xids: dict[str, int]  # application-level XIDs within its window
    history: dict[str, list[Failure]]  # its real failures, for the lemon score


def histories(session: Session, policies: dict[str, EffectivePolicy], now: datetime) -> Histories:
    """Each node's history over the windows of its own policy: one query per distinct policy."""
    groups: dict[int, tuple[EffectivePolicy, list[str]]] = {}
    for name, eff in policies.items():
        groups.setdefault(id(eff), (eff, []))[1].append(name)
    out = Histories({}, {}, {})
    for eff, names in groups.values():
        policy = eff.policy
        out.failures.update(recent_failure_counts(session, names, now, window=policy.repeat_offender_window))
        if policy.faults.classify:
            window = timedelta(seconds=policy.faults.app_xid_repeat_window_s)
            out.app_xids.update(app_xid_counts(session, names, now, window=window))
        if policy.lemon.enabled:
            out.history.update(
                failure_history(session, names, now, horizon=timedelta(seconds=policy.lemon.horizon_s))
            )
    return out
