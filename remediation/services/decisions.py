"""One batch's decisions: its nodes, their remediations, profiles and histories, read once and changed
as its events are decided round by round (:func:`remediation.services.ingest.record`). docs/policy.md,
"Every signal is explained before it is counted", says how each event is decided.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.bulk import set_decisions, update_nodes
from remediation.db.models import Node
from remediation.db.queries import (
    among,
    latest_healthy,
    latest_windows,
    open_remediations_for,
)
from remediation.domain.attribution import Condition, Window, healthy_observations
from remediation.domain.events import EventKind, NodeEvent
from remediation.domain.lemon import Failure
from remediation.domain.policy import (
    Decision,
    DecisionKind,
    NodeView,
    decide,
    slurm_bad_states,
)
from remediation.domain.statemachine import QUARANTINE_STATUSES, NodeStatus, Step
from remediation.domain_repair.service import Routes
from remediation.incidents.service import correlate_opened
from remediation.profiles.rules import Governance, Resolution, govern
from remediation.profiles.service import governed, histories
from remediation.profiles.settings import Mode
from remediation.settings import EffectivePolicy, PolicySettings


@dataclass
class Batch:
    """What deciding a batch reads once and changes as it goes: its nodes (locked until commit, as
    plain rows, written back in one UPDATE at the end: ORM objects would flush one statement shape per
    changed-column set, hundreds per batch), their remediations, profiles and histories."""

    nodes: dict[str, LockedNode]
    open_by_node: dict[str, int]
    gov: dict[str, tuple[Resolution, EffectivePolicy]]
    failures: dict[str, int]
    app_xids: dict[str, int]
    history: dict[str, list[Failure]]
    windows: dict[str, Window]
    healthy: dict[str, dict[Condition, datetime]]
    routes: Routes
    dry_run: bool = False
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    updates: list[dict[str, Any]] = field(default_factory=list)
    by_policy: dict[tuple[str | None, bool], tuple[EffectivePolicy, set[str]]] = field(default_factory=dict)

    @classmethod
    def load(cls, session: Session, fresh: list[NodeEvent], unique: dict[str, NodeEvent],
             *, policy: PolicySettings, governance: Governance, now: datetime) -> Batch:
        names = {ev.node for ev in fresh}
        nodes = {
            name: LockedNode(name, status, reason, updated, last)
            for name, status, reason, updated, last in session.execute(
                select(Node.name, Node.status, Node.status_reason, Node.updated_at, Node.last_event_at)
                .where(among(session, Node.name, names)).with_for_update()
            )
        }
        gov = governed(session, governance, names)
        past = histories(session, {name: eff for name, (_, eff) in gov.items()}, now)
        return cls(nodes, open_remediations_for(session, names), gov, past.failures, past.app_xids,
                   past.history, latest_windows(session, names), _healthy(session, fresh, unique.values(),
                       policy=policy), Routes.load(session, names))

    def decide_round(self, todo: list[NodeEvent], new_keys: dict[str, int], now: datetime
                     ) -> tuple[list[NodeEvent], dict[str, tuple[NodeEvent, Decision]]]:
        """Decide ``todo`` up to each node's first opening event; returns the deferred and the openings."""
        deferred: list[NodeEvent] = []
        opens: dict[str, tuple[NodeEvent, Decision]] = {}
        for ev in todo:
            if ev.node in opens:
                deferred.append(ev)
                continue
            node = self.nodes[ev.node]
            view = NodeView(NodeStatus(node.status), self.open_by_node.get(ev.node), self.failures.get(ev.node, 0),
                            self.windows.get(ev.node), self.healthy.get(ev.node, {}), self.app_xids.get(ev.node, 0),
                            self.history.get(ev.node, ()), self.routes.size(ev.node),
                            self.routes.under_repair(ev.node))
            eff = self.gov[ev.node][1]
            decision = govern(decide(ev, view, eff.policy), eff)
            if decision.kind is DecisionKind.OPEN and (
                    cause := self.routes.nvlink_domain_fault(ev, decision.cause, eff.incidents)) is not None:
                decision = Decision(DecisionKind.DOMAIN, cause.evidence, cause=cause)
            if decision.kind is DecisionKind.DOMAIN:
                decision = replace(decision, reason=self.routes.route(
                    ev, decision.cause, now=now, dry_run=self.dry_run or eff.mode == Mode.SHADOW))
                self._repairing(ev.node, now)
            node.last_event_at = ev.observed_at
            if decision.kind is DecisionKind.APP_XID:
                self.app_xids[ev.node] = self.app_xids.get(ev.node, 0) + 1
            if decision.kind in (DecisionKind.OPEN, DecisionKind.QUARANTINE):
                opens[ev.node] = (ev, decision)
                continue
            _apply_record(ev, node, decision, now=now)
            self.counts[decision.kind] += 1
            self.updates.append(_decided(new_keys[ev.dedupe_key], decision, decision.remediation))
        return deferred, opens

    def opened_round(self, session: Session, opens: dict[str, tuple[NodeEvent, Decision]], opened: dict[str, int],
                     *, new_keys: dict[str, int], now: datetime, dry_run: bool) -> list[tuple[int, str]]:
        """Take in what a round opened (or a concurrent ingest opened first); returns (remediation id,
        first step) of each remediation this batch opened."""
        started: list[tuple[int, str]] = []
        for name, (ev, decision) in opens.items():
            rid = opened.get(name)
            if rid is None:  # a concurrent ingest opened one first: this event is recorded only
                decision = Decision(DecisionKind.RECORD, "a remediation was opened concurrently")
                self.open_by_node.update(open_remediations_for(session, [name]))
            else:
                started.append((rid, self._opened(name, ev, decision, rid=rid, now=now, dry_run=dry_run)))
            self.counts[decision.kind] += 1
            self.updates.append(_decided(new_keys[ev.dedupe_key], decision, rid))
        return started

    def _opened(self, name: str, ev: NodeEvent, decision: Decision, *, rid: int, now: datetime,
                dry_run: bool) -> str:
        """Take in one opened remediation; returns its first step."""
        self.open_by_node[name] = rid
        eff = self.gov[name][1]
        dry = dry_run or eff.mode == Mode.SHADOW
        self.windows[name] = Window(rid, now, dry_run=dry, quarantined=decision.kind is DecisionKind.QUARANTINE)
        self.failures[name] = self.failures.get(name, 0) + 1
        if not dry:
            cls = decision.cause.fault_class if decision.cause else None
            self.history[name] = [*self.history.get(name, ()), Failure(ev.observed_at, cls)]
        node = self.nodes[name]
        node.status, node.status_reason, node.updated_at = NodeStatus.REMEDIATING, decision.reason, now
        # A quarantine decided on this failure too: an incident may take it back.
        self.by_policy.setdefault((eff.profile, dry), (eff, set()))[1].add(name)
        return (Step.QUARANTINE if decision.kind is DecisionKind.QUARANTINE else Step.SLURM_DRAIN).value

    def _repairing(self, node: str, now: datetime) -> None:
        """The batch's trays of ``node``'s domain under repair are remediating (written back at the end)."""
        for tray in self.routes.trays_of(node):
            if (locked := self.nodes.get(tray)) is not None and locked.status not in QUARANTINE_STATUSES:
                locked.status, locked.status_reason, locked.updated_at = (
                    NodeStatus.REMEDIATING, self.routes.under_repair(tray) or "", now)

    def write_back(self, session: Session, now: datetime) -> None:
        """The decisions, the nodes, and each profile's incident rule (K, F) on the nodes it opened."""
        set_decisions(session, self.updates)
        update_nodes(session, [
            {"name": n.name, "status": n.status, "status_reason": n.status_reason, "updated_at": n.updated_at,
             "last_event_at": n.last_event_at} for n in self.nodes.values()
        ])
        for (_, dry), (eff, opened_here) in self.by_policy.items():
            correlate_opened(session, opened_here, eff.incidents, actor="remediation", now=now, dry_run=dry)


@dataclass(slots=True)
class LockedNode:
    """One locked ``nodes`` row as the batch changes it (status and last event)."""

    name: str
    status: str
    status_reason: str
    updated_at: datetime
    last_event_at: datetime | None


def _healthy(session: Session, fresh: list[NodeEvent], batch: Iterable[NodeEvent],
             *, policy: PolicySettings) -> dict[str, dict[Condition, datetime]]:
    """The latest healthy observation per node and condition, at or after the oldest unhealthy edge
    of the batch: recorded ones and the batch's own (a later event in the batch counts too)."""
    edges = [ev.observed_at for ev in fresh if ev.kind is EventKind.UNHEALTHY]
    if not edges:
        return {}
    bad = slurm_bad_states(policy)
    names = {ev.node for ev in fresh if ev.kind is EventKind.UNHEALTHY}
    out = latest_healthy(session, names, min(edges), slurm_bad=bad)
    mine = healthy_observations(
        ((ev.node, ev.source.value, ev.kind.value, ev.state, ev.observed_at) for ev in batch if ev.node in names),
        {"slurm": bad},
    )
    for (node, cond), at in mine.items():
        seen = out.setdefault(node, {})
        if cond not in seen or at > seen[cond]:
            seen[cond] = at
    return out


def _decided(event_id: int, decision: Decision, rid: int | None) -> dict[str, Any]:
    return {"id": event_id, "decision": decision.kind.value, "decision_reason": decision.reason[:2000],
            "remediation_id": rid}


def _apply_record(ev: NodeEvent, node: LockedNode, decision: Decision, *, now: datetime) -> None:
    if decision.kind is DecisionKind.RECOVERED:
        node.status, node.status_reason, node.updated_at = NodeStatus.HEALTHY, decision.reason, now
    elif (ev.kind is EventKind.UNHEALTHY and node.status == NodeStatus.HEALTHY
          and decision.kind in (DecisionKind.RECORD, DecisionKind.APP_XID) and not decision.our_own):
        node.status, node.status_reason, node.updated_at = NodeStatus.UNHEALTHY, decision.reason, now
