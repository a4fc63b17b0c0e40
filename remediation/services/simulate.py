"""Rehearse a policy: replay a failure trace through the real ingest and workflow, on a simulated clock.

Nothing here is a model of the service: the trace's events go through the same ``ingest`` and the same
``Workflow`` as live processing, against a throw-away SQLite database and the in-memory world, with a
fake clock that jumps from one due task to the next. The decisions are therefore exactly the ones the
service would take for the same events under the same settings (a test holds the two side by side).

The world reacts as a cluster would: a fault makes its node bad in Slurm or Kubernetes; a VM action
takes ``reboot_s`` and fixes the node unless the fault is one a restart cannot fix, which stays until
``repair_s`` after it struck (a switch replaced, a part swapped). The report says what was decided, how
many VM actions were taken, who was quarantined, and how long the storm breaker was open.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, select

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.migrate import upgrade
from remediation.db.models import AuditLog, Event, Remediation, RemediationStep
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.events import Source
from remediation.domain.step_bodies import Adapters
from remediation.domain.trace import Fault
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import DatabaseSettings, Settings


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

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "per_event"}


def simulate(faults: list[Fault], settings: Settings, nodes: list[str], *, reboot_s: float = 600.0,
             repair_s: float = 4 * 3600.0, workdir: Path | None = None) -> Report:
    tmp = tempfile.TemporaryDirectory(prefix="remediation-simulate-") if workdir is None else None
    root = Path(tmp.name) if tmp else workdir
    assert root is not None
    url = f"sqlite:///{root / 'simulate.db'}"
    upgrade(url)
    db = make_engine(DatabaseSettings(url=url))
    # A throw-away database: durability buys nothing here, and fsync per step would dominate.
    event.listen(db, "connect", lambda conn, _rec: conn.execute("PRAGMA synchronous=OFF"))
    sessions = make_session_factory(db)
    world = MemoryWorld(nodes=nodes, op_polls=max(1, math.ceil(reboot_s / settings.workflow.poll_interval_s)))
    start = faults[0].at if faults else datetime.now().astimezone()
    clock = FakeClock(start - timedelta(seconds=1))
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock)
    seq = itertools.count()
    queue: list[tuple[datetime, int, str, Any]] = []
    for f in faults:
        heapq.heappush(queue, (f.at, next(seq), "fault", f))
    while queue:
        at, _, kind, item = heapq.heappop(queue)
        clock.set(at)
        if kind == "fault":
            _strike(world, item)
            if not item.fixed_by_restart:
                heapq.heappush(queue, (at + timedelta(seconds=repair_s), next(seq), "repair", item.event.node))
            with sessions() as s, s.begin():
                opened = ingest(s, [item.event.to_json()], settings.policy, clock).opened
            for rid, step in opened:
                heapq.heappush(queue, (at, next(seq), "step", FollowUp(rid, step)))
        elif kind == "repair":
            _repair(world, item)
        else:
            nxt = engine.run(item.remediation_id, item.step)
            if nxt is not None:
                heapq.heappush(queue, (at + timedelta(seconds=nxt.countdown), next(seq), "step", nxt))
    report = _report(sessions, len(faults), clock.now())
    db.dispose()
    if tmp:
        tmp.cleanup()
    return report


def _strike(world: MemoryWorld, fault: Fault) -> None:
    ev = fault.event
    with world.mutate() as st:
        node = st["nodes"].get(ev.node)
        if node is None:
            return
        if ev.source is Source.SLURM:
            s = node["slurm"]
            if ev.state_upper == "DOWN":
                s["state"], s["flags"] = "DOWN", sorted(set(s["flags"]) | {"NOT_RESPONDING"})
            elif ev.state_upper in ("FAIL", "DRAIN"):
                s["flags"] = sorted(set(s["flags"]) | {ev.state_upper})
            s["reason"], s["reason_user"] = ev.reason, ev.reason_user or "user"
        elif ev.state.startswith("Ready="):
            node["k8s"]["ready"] = ev.state.split("=", 1)[1]
        if not fault.fixed_by_restart:
            node["vm"]["broken"] = True


def _repair(world: MemoryWorld, name: str) -> None:
    with world.mutate() as st:
        node = st["nodes"][name]
        node["vm"]["broken"] = False
        node["k8s"]["ready"] = "True"
        s = node["slurm"]
        s["flags"] = [f for f in s["flags"] if f != "NOT_RESPONDING"]
        if s["state"] == "DOWN":
            s["state"] = "IDLE"


def _report(sessions: Any, faults: int, end: datetime) -> Report:
    r = Report(faults=faults)
    with sessions() as s:
        events = s.execute(select(Event.dedupe_key, Event.decision, Event.decision_reason).order_by(Event.id)).all()
        r.per_event = [(k, d, why) for k, d, why in events]
        r.decisions = dict(Counter(d for _, d, _ in events))
        r.ignored = dict(Counter(why.split(" (")[0].split(":")[0] for _, d, why in events if d == "record"))
        rems = s.scalars(select(Remediation)).all()
        r.outcomes = dict(Counter(x.status for x in rems))
        r.quarantined = [(x.node, (x.context or {}).get("quarantine_reason") or x.cause) for x in rems
                         if x.status == "quarantined"]
        recov = [(aware(x.closed_at) - aware(x.opened_at)).total_seconds() for x in rems  # type: ignore[operator]
                 if x.status == "succeeded" and x.closed_at]
        r.recovery_p50_s = statistics.median(recov) if recov else None
        vm_rows = s.scalars(select(RemediationStep).where(RemediationStep.step == "vm_restart")).all()
        r.vm_actions = dict(Counter((row.provider_op or {}).get("action", "?") for row in vm_rows))
        spans = [(aware(row.started_at), aware(row.finished_at) or end) for row in vm_rows]
        r.max_vm_in_flight = _max_overlap(spans)  # type: ignore[arg-type]
        audit = s.execute(select(AuditLog.action, AuditLog.at).where(
            AuditLog.action.in_(("breaker_open", "breaker_closed"))).order_by(AuditLog.id)).all()
    opened_at = None
    for action, at in audit:
        if action == "breaker_open":
            r.breaker_openings += 1
            opened_at = aware(at)
        elif opened_at is not None:
            r.breaker_open_s += (aware(at) - opened_at).total_seconds()  # type: ignore[operator]
            opened_at = None
    return r


def _max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, delta in points:
        cur += delta
        best = max(best, cur)
    return best
