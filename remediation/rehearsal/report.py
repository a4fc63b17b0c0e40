"""What a rehearsal reports: the decisions and remediations as the service recorded them, and what the
policy cost as the world saw it.

:func:`read_report` reads the throw-away database after the replay; :func:`world_figures` and
:func:`fabric_quarantines` judge by the world (the outcome model), never by the policy's own records: a
VM action that fixed nothing is one the world says left the node broken.

Why: docs/rehearsal.md#how-the-rehearsal-is-built
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select

from remediation.adapters.memory import MemoryWorld
from remediation.clock import aware
from remediation.db.models import AuditLog, Event, Incident, Remediation, RemediationStep
from remediation.domain.events import EventKind
from remediation.domain.gpu_reset import machine_step_did
from remediation.domain.policy import DecisionKind
from remediation.domain.statemachine import RemediationStatus, Step
from remediation.domain.states import AuditAction
from remediation.rehearsal.goodput import Goodput
from remediation.rehearsal.trace import Fault
from remediation.services.notify import NOTIFIABLE


@dataclass
class Report:
    faults: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    vm_actions: dict[str, int] = field(default_factory=dict)
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    breaker_openings: int = 0
    breaker_open_s: float = 0.0
    max_vm_in_flight: int = 0
    recovery_p50_s: float | None = None
    ignored: dict[str, int] = field(default_factory=dict)
    per_event: list[tuple[str, str, str]] = field(default_factory=list)  # (dedupe key, decision, reason)
    runs: int = 0  # workflow steps run (claims included): the rehearsal's cost
    # Every remediation in id order: (node, cause, status, outcome, opened, closed, ladder, steps), each step
    # (step, attempt, status, started, finished, outcome, error); times as ISO text.
    history: list[tuple[Any, ...]] = field(default_factory=list)
    # What the policy cost, judged by the world (the outcome model), never by the policy's own records:
    wasted_vm_actions: int = 0  # completed VM actions that left the node broken
    auto_fixed: int = 0  # faults ended by one of our VM actions
    fabric_vm_actions: int = 0  # VM actions on a node whose fault was the fabric's
    node_hours_out: float = 0.0  # sum over nodes of the time out of service (faulted, drained, quarantined)
    node_hours_by_class: dict[str, float] = field(default_factory=dict)  # the same, by the fault's class
    gpu_resets: int = 0  # GPU resets (gpu-reset rung) that ran to an end
    gpu_resets_fixed: int = 0  # of those, the ones that fixed the node
    hand_repairs: int = 0  # nodes handed to a human (a quarantine, a hold with a page) and repaired by hand
    pages: int = 0  # audit rows that page on-call
    incidents: int = 0  # correlated-fault incidents opened
    fabric_quarantines: int = 0  # quarantines of remediations a fabric fault opened
    # With profiles: every figure above for each profile's pool ("(base)": the nodes none selects).
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The training jobs on the fleet and their ETTR (the whole fleet's only, not per pool).
    goodput: Goodput | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("per_event", "history", "goodput")}
        if self.goodput is not None:
            d["goodput"] = {**self.goodput.as_dict(), "gpu_resets": self.gpu_resets,
                            "quarantined": len(self.quarantined)}
        d["vm_actions_total"] = sum(self.vm_actions.values())
        d["node_hours_out"] = round(self.node_hours_out, 1)
        d["node_hours_by_class"] = {k: round(v, 1) for k, v in self.node_hours_by_class.items()}
        return d


def fabric_quarantines(sessions: Any, faults: list[Fault]) -> int:
    keys = {f.event.dedupe_key for f in faults if f.outcome is not None and f.outcome.fabric}
    if not keys:
        return 0
    with sessions() as s:
        rows = s.execute(select(Event.dedupe_key).join(Remediation, Remediation.event_id == Event.id)
                         .where(Remediation.status == RemediationStatus.QUARANTINED)).scalars().all()
    return sum(1 for k in rows if k in keys)


def world_figures(world: MemoryWorld, r: Report, nodes: Collection[str] | None = None) -> None:
    ops = [o for o in world.snapshot()["ops"].values() if nodes is None or o.get("vm", {}).get("name") in nodes]
    done = [o["data"] for o in ops if o["data"].get("done")]
    r.wasted_vm_actions = sum(1 for d in done if d.get("fixed") is False)
    r.auto_fixed = sum(1 for d in done if d.get("fixed") is True)
    r.fabric_vm_actions = sum(1 for o in ops if o["data"].get("fabric"))


def read_report(sessions: Any, faults: int, end: datetime, *, nodes: Collection[str] | None = None,
                profile: str | None = None) -> Report:
    """The figures of the whole fleet, or with ``nodes`` of one profile's pool (``profile``: whose latch
    is counted as the storm breaker; None: the fleet's)."""
    r = Report(faults=faults)

    def mine(node: str) -> bool:
        return nodes is None or node in nodes

    with sessions() as s:
        events = [(k, d, why) for k, d, why, node in s.execute(
            select(Event.dedupe_key, Event.decision, Event.decision_reason, Event.node)
            .where(Event.kind != EventKind.DOMAINS.value).order_by(Event.id))
            if mine(node)]
        r.per_event = events
        r.decisions = dict(Counter(d for _, d, _ in events))
        r.ignored = dict(Counter(why.split(" (")[0].split(":")[0] for _, d, why in events if d == DecisionKind.RECORD))
        rems = [x for x in s.scalars(select(Remediation).order_by(Remediation.id)) if mine(x.node)]
        r.history = [(x.node, x.cause, x.status, x.outcome, _iso(x.opened_at), _iso(x.closed_at), x.ladder,
                      [(st.step, st.attempt, st.status, _iso(st.started_at), _iso(st.finished_at), st.outcome,
                        st.error) for st in x.steps]) for x in rems]
        r.outcomes = dict(Counter(x.status for x in rems))
        r.quarantined = [(x.node, x.ctx.quarantine_reason or x.cause) for x in rems
                         if x.status == RemediationStatus.QUARANTINED]
        recov = [(aware(x.closed_at) - aware(x.opened_at)).total_seconds() for x in rems
                 if x.status == RemediationStatus.SUCCEEDED and x.closed_at]
        r.recovery_p50_s = statistics.median(recov) if recov else None
        vm_rows = [row for row, node in s.execute(select(RemediationStep, Remediation.node).join(Remediation)
                                                  .where(RemediationStep.step == Step.VM_RESTART)) if mine(node)]
        r.vm_actions = dict(Counter(machine_step_did(row.provider_op or {}) for row in vm_rows))
        spans = [(aware(row.started_at), aware(row.finished_at) or end) for row in vm_rows]
        r.max_vm_in_flight = _max_overlap(spans)
        r.incidents = sum(1 for members in s.scalars(select(Incident.nodes)) if any(mine(n) for n in members))
        pages = s.execute(select(AuditLog.action, AuditLog.target, AuditLog.detail)
                          .where(AuditLog.action.in_(NOTIFIABLE))).all()
        r.pages = sum(1 for _, target, detail in pages if (mine(target) if target else nodes is None or (
            profile is not None and (detail or {}).get("profile") == profile)))
        audit = [(action, at) for action, at, detail in s.execute(
            select(AuditLog.action, AuditLog.at, AuditLog.detail)
            .where(AuditLog.action.in_((AuditAction.BREAKER_OPEN, AuditAction.BREAKER_CLOSED))).order_by(AuditLog.id))
            if (detail or {}).get("profile") == profile]
    opened_at = None
    for action, at in audit:
        if action == AuditAction.BREAKER_OPEN:
            r.breaker_openings += 1
            opened_at = aware(at)
        elif opened_at is not None:
            r.breaker_open_s += (aware(at) - opened_at).total_seconds()
            opened_at = None
    if opened_at is not None:  # still open at the end
        r.breaker_open_s += (aware(end) - opened_at).total_seconds()
    return r


def _iso(at: datetime | None) -> str | None:
    return aware(at).isoformat() if at is not None else None


def _max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, delta in points:
        cur += delta
        best = max(best, cur)
    return best
