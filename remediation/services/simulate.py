"""Rehearse a policy: replay a failure trace through the real ingest and workflow, on a simulated clock.

Nothing here is a model of the service: the trace's events go through the same ``ingest`` and the same
``Workflow`` as live processing, against a throw-away in-memory SQLite database and the in-memory world,
with a fake clock that jumps from one due task to the next, skipping the polls that cannot decide
anything (:mod:`remediation.services.sim_loop`). The decisions are therefore exactly the ones the
service would take for the same events under the same settings (a test holds the two side by side).

The world reacts as a cluster would: a fault makes its node bad in Slurm or Kubernetes; a VM action
takes ``reboot_s`` and fixes the node unless the fault is one a restart cannot fix, which stays until
``repair_s`` after it struck (a switch replaced, a part swapped). The report says what was decided, how
many VM actions were taken, who was quarantined, and how long the storm breaker was open.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.migrate import upgrade
from remediation.db.models import AuditLog, Event, Node, Remediation, RemediationStep
from remediation.db.session import make_session_factory, memory_engine
from remediation.domain.events import Source
from remediation.domain.step_bodies import Adapters
from remediation.domain.trace import Fault
from remediation.services.sim_loop import Loop, Rehearsal, Tally
from remediation.services.workflow import Workflow
from remediation.settings import Settings


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

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("per_event", "history")}


@functools.lru_cache(maxsize=1)
def _migrated_template() -> Path:
    """One migrated SQLite file per process: each rehearsal copies it into memory (a second policy or
    another seed costs no second migration)."""
    root = Path(tempfile.mkdtemp(prefix="remediation-simulate-"))
    atexit.register(shutil.rmtree, root, True)
    path = root / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


def simulate(faults: list[Fault], settings: Settings, nodes: list[str], *, reboot_s: float = 600.0,
             repair_s: float = 4 * 3600.0, loop: Loop = "events", settle: timedelta = timedelta(days=1),
             progress: Callable[[datetime, Tally], None] | None = None) -> Report:
    """Replay ``faults`` under ``settings``; a second policy is just a second call. ``loop`` picks the
    event loop (default) or the original polling loop (see :mod:`remediation.services.sim_loop`); the
    two decide the same. ``progress`` is called after each event with the simulated time and a tally.
    The rehearsal ends ``settle`` after the last fault's repair; what is still open then is reported so."""
    # A throw-away database in memory: durability buys nothing here.
    db = memory_engine(_migrated_template())
    sessions = make_session_factory(db)
    start = faults[0].at if faults else datetime.now().astimezone()
    clock = FakeClock(start - timedelta(seconds=1))
    _inventory(sessions, nodes, clock.now())
    world = MemoryWorld(nodes=nodes, clock=clock.now, op_seconds=reboot_s, restart_clears_conditions=True)
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock)
    rehearsal = Rehearsal(sessions, engine, world, settings, clock, loop=loop, strike=_strike, repair=_repair,
                          repair_s=repair_s)
    # Long enough after the last fault for its repair and the remediations after it to finish.
    until = (faults[-1].at if faults else start) + timedelta(seconds=repair_s) + settle
    rehearsal.run(faults, until, progress)
    report = _report(sessions, len(faults), clock.now())
    report.runs = rehearsal.tally.runs
    db.dispose()
    return report


def _inventory(sessions: Any, nodes: list[str], at: datetime) -> None:
    """The whole fleet is known before the first fault, as the watchers' first resync makes it live: the
    storm breaker's pool is the cluster, not the few nodes that have failed so far."""
    with sessions() as s, s.begin():
        s.execute(insert(Node), [{"name": n, "status": "healthy", "status_reason": "", "first_seen_at": at,
                                  "updated_at": at} for n in nodes])


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
        else:  # a problem condition (GpuXidError=True): the Node reports it until a restart or a repair
            cond, _, status = ev.state.partition("=")
            node["k8s"].setdefault("conditions", {})[cond] = status
        if not fault.fixed_by_restart:
            node["vm"]["broken"] = True


def _repair(world: MemoryWorld, name: str) -> None:
    with world.mutate() as st:
        node = st["nodes"][name]
        node["vm"]["broken"] = False
        node["k8s"]["ready"] = "True"
        node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
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
        rems = s.scalars(select(Remediation).order_by(Remediation.id)).all()
        r.history = [(x.node, x.cause, x.status, x.outcome, _iso(x.opened_at), _iso(x.closed_at), x.ladder,
                      [(st.step, st.attempt, st.status, _iso(st.started_at), _iso(st.finished_at), st.outcome,
                        st.error) for st in x.steps]) for x in rems]
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
    if opened_at is not None:  # still open at the end
        r.breaker_open_s += (aware(end) - opened_at).total_seconds()  # type: ignore[operator]
    return r


def _iso(at: datetime | None) -> str | None:
    return aware(at).isoformat() if at is not None else None  # type: ignore[union-attr]


def _max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, delta in points:
        cur += delta
        best = max(best, cur)
    return best
