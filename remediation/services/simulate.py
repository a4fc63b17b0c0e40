"""Rehearse a policy: replay a failure trace through the real ingest and workflow, on a simulated clock.

Nothing here is a model of the service: the trace's events go through the same ``ingest`` and the same
``Workflow`` as live processing, against a throw-away in-memory SQLite database and the in-memory world,
with a fake clock that jumps from one due task to the next, skipping the polls that cannot decide
anything (:mod:`remediation.services.sim_loop`). The decisions are therefore exactly the ones the
service would take for the same events under the same settings (a test holds the two side by side).

The world reacts as a cluster would: a fault makes its node bad in Slurm or Kubernetes; a VM action
takes ``reboot_s``. Whether it fixes the node is the world's business, never the policy's: with an
outcome model (:mod:`remediation.domain.truth`) each fault knows which action kinds fix it (restart,
move to other hardware, reimage); without one, the mix's ``remediable_by_vm_restart`` column decides
and a fault a restart cannot fix stays until ``repair_s`` after it struck. A node the service hands to
a human (quarantined, or held with a page) is repaired by hand ``repair_s`` later and released; a
fabric fault is repaired ``repair_s`` after it struck, for every node of its leaf at once, and an
incident over those nodes closes as the sweeper would close it.

The report says what was decided, how many VM actions were taken, who was quarantined, how long the
storm breaker was open, and what the policy cost as the world saw it: VM actions that fixed nothing,
faults fixed automatically, VM actions on fabric faults, node-hours out of service, incidents, pages.
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

from sqlalchemy import func, insert, select

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.migrate import upgrade
from remediation.db.models import AuditLog, Event, Incident, Node, Remediation, RemediationStep
from remediation.db.session import make_session_factory, memory_engine
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.domain.trace import Fault, leaf_of
from remediation.services.ingest import ingest
from remediation.services.notify import NOTIFIABLE
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
    # What the policy cost, judged by the world (the outcome model), never by the policy's own records:
    wasted_vm_actions: int = 0  # completed VM actions that left the node broken
    auto_fixed: int = 0  # faults ended by one of our VM actions
    fabric_vm_actions: int = 0  # VM actions on a node whose fault was the fabric's
    node_hours_out: float = 0.0  # sum over nodes of the time out of service (faulted, drained, quarantined)
    hand_repairs: int = 0  # nodes handed to a human (a quarantine, a hold with a page) and repaired by hand
    pages: int = 0  # audit rows that page on-call
    incidents: int = 0  # correlated-fault incidents opened
    fabric_quarantines: int = 0  # quarantines of remediations a fabric fault opened

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("per_event", "history")}
        d["vm_actions_total"] = sum(self.vm_actions.values())
        d["node_hours_out"] = round(self.node_hours_out, 1)
        return d


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
             progress: Callable[[datetime, Tally], None] | None = None, leaf_size: int | None = None) -> Report:
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
    if leaf_size:
        # The Slurm watcher's first topology publish: every node's leaf switch, before any fault.
        with sessions() as s, s.begin():
            ingest(s, [_domains_event(name, leaf_size, clock.now()).to_json() for name in nodes],
                   settings.policy, clock, incidents=settings.incidents)
    rehearsal = Rehearsal(sessions, engine, world, settings, clock, loop=loop, strike=_strike, repair=_repair,
                          repair_s=repair_s)
    # Long enough after the last fault for its repair and the remediations after it to finish.
    until = (faults[-1].at if faults else start) + timedelta(seconds=repair_s) + settle
    rehearsal.run(faults, until, progress)
    report = _report(sessions, len(faults), clock.now())
    report.runs = rehearsal.tally.runs
    report.fabric_quarantines = _fabric_quarantines(sessions, faults)
    report.node_hours_out = rehearsal.fleet.close(clock.now())
    report.hand_repairs = rehearsal.tally.hand_repairs
    _world_figures(world, report)
    db.dispose()
    return report


def _inventory(sessions: Any, nodes: list[str], at: datetime) -> None:
    """The whole fleet is known before the first fault, as the watchers' first resync makes it live: the
    storm breaker's pool is the cluster, not the few nodes that have failed so far."""
    with sessions() as s, s.begin():
        s.execute(insert(Node), [{"name": n, "status": "healthy", "status_reason": "", "first_seen_at": at,
                                  "updated_at": at} for n in nodes])


def _domains_event(name: str, leaf_size: int, now: datetime) -> NodeEvent:
    """What the Slurm watcher publishes for a node cabled to a synthesised leaf switch."""
    leaf = leaf_of(int(name.rsplit("-", 1)[1]), leaf_size)
    return NodeEvent(source=Source.SLURM, node=name, kind=EventKind.DOMAINS, state="topology",
                     domains={"leaf-switch": leaf}, reason=f"leaf-switch={leaf}", observed_at=now,
                     dedupe_key=f"rehearsal:{name}:domains")


def _fabric_quarantines(sessions: Any, faults: list[Fault]) -> int:
    keys = {f.event.dedupe_key for f in faults if f.outcome is not None and f.outcome.fabric}
    if not keys:
        return 0
    with sessions() as s:
        rows = s.execute(select(Event.dedupe_key).join(Remediation, Remediation.event_id == Event.id)
                         .where(Remediation.status == "quarantined")).scalars().all()
    return sum(1 for k in rows if k in keys)


def _world_figures(world: MemoryWorld, r: Report) -> None:
    ops = world.snapshot()["ops"].values()
    done = [o["data"] for o in ops if o["data"].get("done")]
    r.wasted_vm_actions = sum(1 for d in done if d.get("fixed") is False)
    r.auto_fixed = sum(1 for d in done if d.get("fixed") is True)
    r.fabric_vm_actions = sum(1 for o in ops if o["data"].get("fabric"))


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
        if fault.outcome is not None:
            # The outcome model decides what fixes it: the actions in fixed_by, else hands.
            o = fault.outcome
            node["vm"]["broken"] = True
            node["vm"]["fault"] = {"category": o.category, "fixed_by": sorted(o.fixed_by), "fabric": o.fabric}
        elif not fault.fixed_by_restart:
            node["vm"]["broken"] = True


def _repair(world: MemoryWorld, name: str, fabric_only: bool = False) -> None:
    """The hand repair of ``name`` (``fabric_only``: the fabric's repair, which fixes a node only if
    the fabric was what it was waiting for)."""
    with world.mutate() as st:
        node = st["nodes"][name]
        fault = node["vm"].get("fault") or {}
        if fabric_only and not fault.get("fabric"):
            return
        node["vm"]["broken"] = False
        node["vm"]["fault"] = None
        node["k8s"]["ready"] = "True"
        node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
        s = node["slurm"]
        s["flags"] = [f for f in s["flags"] if f != "NOT_RESPONDING"]
        if s["state"] == "DOWN":
            s["state"] = "IDLE"
        if s["reason"].startswith("maintenance"):  # the human who drained it for maintenance resumes it
            s["flags"] = [f for f in s["flags"] if f != "DRAIN"]
            s["reason"] = ""


def _report(sessions: Any, faults: int, end: datetime) -> Report:
    r = Report(faults=faults)
    with sessions() as s:
        events = s.execute(select(Event.dedupe_key, Event.decision, Event.decision_reason)
                           .where(Event.kind != EventKind.DOMAINS.value).order_by(Event.id)).all()
        r.per_event = [(k, d, why) for k, d, why in events]
        r.decisions = dict(Counter(d for _, d, _ in events))
        r.ignored = dict(Counter(why.split(" (")[0].split(":")[0] for _, d, why in events if d == "record"))
        rems = s.scalars(select(Remediation).order_by(Remediation.id)).all()
        r.history = [(x.node, x.cause, x.status, x.outcome, _iso(x.opened_at), _iso(x.closed_at), x.ladder,
                      [(st.step, st.attempt, st.status, _iso(st.started_at), _iso(st.finished_at), st.outcome,
                        st.error) for st in x.steps]) for x in rems]
        r.outcomes = dict(Counter(x.status for x in rems))
        r.quarantined = [(x.node, x.ctx.quarantine_reason or x.cause) for x in rems
                         if x.status == "quarantined"]
        recov = [(aware(x.closed_at) - aware(x.opened_at)).total_seconds() for x in rems  # type: ignore[operator]
                 if x.status == "succeeded" and x.closed_at]
        r.recovery_p50_s = statistics.median(recov) if recov else None
        vm_rows = s.scalars(select(RemediationStep).where(RemediationStep.step == "vm_restart")).all()
        r.vm_actions = dict(Counter((row.provider_op or {}).get("action", "?") for row in vm_rows))
        spans = [(aware(row.started_at), aware(row.finished_at) or end) for row in vm_rows]
        r.max_vm_in_flight = _max_overlap(spans)  # type: ignore[arg-type]
        r.incidents = s.scalar(select(func.count()).select_from(Incident)) or 0
        r.pages = s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action.in_(NOTIFIABLE))) or 0
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
