"""The rehearsal's discrete-event loop: cost follows decisions, not waiting time.

Both loops run the real ``ingest`` and ``Workflow.run`` on a simulated clock. **polling** runs every
follow-up after its countdown, as Celery would; **events** runs only the polls that can see something
new (admission refusals are parked, waits sleep until their answer can differ), at the instants the
polling loop would, so every decision comes out the same. Ties at one instant are ordered by kind,
then remediation id.

Why: docs/rehearsal.md#the-event-loop-skips-the-polls-that-cannot-decide
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import select

from remediation.adapters.memory import MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.models import Node, Remediation
from remediation.db.queries import cluster_view
from remediation.db.scope import cluster_of
from remediation.domain.causes import classify, table
from remediation.domain.ownership import release_node
from remediation.domain.policy import ClusterView, admit, breaker_open
from remediation.domain.statemachine import MACHINE_STEPS, OPEN_STATUSES, NodeStatus, RemediationStatus, Step
from remediation.domain.stepdetail import HeldTime
from remediation.incidents import service as incidents
from remediation.ports.dispatch import FollowUp, Hint
from remediation.rehearsal.trace import Fault
from remediation.rehearsal.world import Fleet, WorldJobs, in_service, repair, strike
from remediation.services.ingest import IngestRules, ingest
from remediation.services.lever_rules import release
from remediation.services.step_rows import live_row
from remediation.services.workflow import Workflow
from remediation.vocabulary import HOLD

Loop = Literal["events", "polling"]
FAULT, REPAIR, STEP = 0, 1, 2
Key = tuple[datetime, int, int]


@dataclass
class Idle:
    """A remediation whose polls are skipped: its poll grid (last real poll, period) and why."""

    step: str
    last: datetime
    period: timedelta
    parked: bool  # True: parked by admission; False: asleep in a step's wait
    new_machine: bool = False  # admission would let through a new VM action
    node: str = ""
    not_before: datetime | None = None  # held until then by time alone (an incident's grace period)


@dataclass
class Tally:
    """What the loop did, for the progress bar and the benchmark."""

    faults_handled: int = 0
    runs: int = 0  # Workflow.run calls (each several transactions)
    hand_repairs: int = 0  # nodes a human repaired after the service handed them over


class Rehearsal:
    def __init__(self, engine: Workflow, world: MemoryWorld, *, clock: FakeClock, loop: Loop = "events",
                 repair_s: float) -> None:
        """Rehearse on ``engine``'s database under its settings; ``clock`` is the engine's own."""
        self.sessions, self.engine, self.world, self.settings, self.clock = (
            engine.sessions, engine, world, engine.settings, clock)
        self.skip = loop == "events"
        self.repair_td = timedelta(seconds=repair_s)
        self.queue: list[tuple[datetime, int, int, int, Any]] = []
        self.version: dict[int, int] = {}
        self.idle: dict[int, Idle] = {}
        self.nodes: dict[int, str] = {}
        self.view: tuple[Any, ...] | None = None
        self.tally = Tally()
        self.fleet = Fleet()
        self.handed: set[str] = set()
        self.groups: dict[int, list[str]] = {}  # a fabric fault's group -> the nodes it hit
        self.causes = table(self.settings.policy.faults)
        self._seq = 0

    # ------------------------------------------------------------------------------------------ queue

    def _push(self, at: datetime, kind: int, ident: int, *, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (at, kind, ident, self._seq, payload))

    def _step(self, rid: int, step: str, at: datetime) -> None:
        """Schedule ``rid``'s one outstanding step (replacing any earlier schedule of it)."""
        v = self.version[rid] = self.version.get(rid, 0) + 1
        self._push(at, STEP, rid, payload=(v, step))

    def _unschedule(self, rid: int) -> None:
        self.version[rid] = self.version.get(rid, 0) + 1

    def run(self, faults: list[Fault], until: datetime,
            progress: Callable[[datetime, Tally], None] | None = None) -> None:
        """Replay until nothing is left to do or the clock reaches ``until`` (a remediation held by a
        latched breaker would otherwise keep the polling loop going for ever); the clock ends at
        ``until`` either way, so both loops report on the same moment."""
        for i, f in enumerate(faults):
            self._push(f.at, FAULT, i, payload=f)
        while self.queue and self.queue[0][0] < until:
            at, kind, ident, _, payload = heapq.heappop(self.queue)
            self.clock.set(at)
            key = (at, kind, ident)
            if kind == FAULT:
                self._fault(key, payload)
                touched = [payload.event.node]
            elif kind == REPAIR:
                touched = self._repair(key, *payload)
            else:
                version, step = payload
                if version != self.version.get(ident):
                    continue  # superseded by a later schedule of the same remediation
                self.idle.pop(ident, None)
                self.tally.runs += 1
                self._after(key, ident, step, nxt=self.engine.run(ident, step))
                touched = [self._node(ident)]
            self.fleet.observe(self.world, touched, at)
            if progress is not None:
                progress(at, self.tally)
        self.clock.set(until)

    # ------------------------------------------------------------------------------------ handlers

    def _fault(self, key: Key, fault: Fault) -> None:
        at = key[0]
        strike(self.world, fault)
        self.tally.faults_handled += 1
        node = fault.event.node
        self.fleet.struck(node, classify(fault.event.source.value, fault.event.state, fault.event.reason,
                                         tbl=self.causes).fault_class, fault.event.source.value)
        if fault.outcome is not None and fault.outcome.fabric:
            # The fabric is repaired by hand, once for all the nodes it took down, whatever the policy did.
            if fault.group not in self.groups:
                self._push(at + self.repair_td, REPAIR, key[2], payload=("fabric", fault.group))
            self.groups.setdefault(fault.group, []).append(node)
        elif fault.event.state_upper == "DRAIN" or (fault.outcome is None and not fault.fixed_by_restart):
            self._push(at + self.repair_td, REPAIR, key[2], payload=("node",
                                                                     node))  # a human's own maintenance
        with self.sessions() as s, s.begin():
            opened = ingest(s, [fault.event.to_json()], self.settings.policy, clock=self.clock,
                            rules=IngestRules(incidents=self.settings.incidents,
                                              governance=self.engine.governance)).opened
        for rid, step in opened:
            self.nodes[rid] = fault.event.node
            self._step(rid, step, at)
        self._world_changed(key, fault.event.node)
        if opened:
            self._view_changed(key)

    def _repair(self, key: Key, what: str, arg: Any) -> list[str]:
        """A repair by hand lands: one node's, the fabric's (every node of its group), or a node the
        service handed over (repaired, then released if quarantined). Incidents whose nodes all answer
        again close, as the sweeper would close them."""
        if what == "fabric":
            names = list(self.groups.get(arg, ()))
            for name in names:
                repair(self.world, name, fabric_only=True)
        elif what == "hands":
            names = [arg]
            self._hand_repair(arg)
        else:
            names = [arg]
            repair(self.world, arg)
        for name in names:
            self._world_changed(key, name)
        if self.settings.incidents.enabled:
            for f in incidents.check_recovery(self.sessions, self.engine.adapters, self.settings,
                                              clock=self.clock):
                self.idle.pop(f.remediation_id, None)
                self._step(f.remediation_id, f.step, key[0])
        return names

    def _hand_repair(self, name: str) -> None:
        """A human replaced the part and let the node back in. A fabric fault is not the node's: the
        fabric's own repair brings it back, and only a quarantine still needs the human's release."""
        self.handed.discard(name)
        self.tally.hand_repairs += 1
        with self.world.mutate() as st:
            fault = st["nodes"][name]["vm"].get("fault") or {}
        if not fault.get("fabric"):
            repair(self.world, name)
        with self.sessions() as s, s.begin():
            node = s.get(Node, (cluster_of(s), name))
            if node is not None and node.status == NodeStatus.QUARANTINED:
                release(s, name, "rehearsal", reason="repaired by hand", now=self.clock.now())
        release_node(self.engine.adapters, name, self.settings.policy.our_reason_prefix)

    def _hand_over(self, key: Key, rid: int, step: str, *, nxt: FollowUp | None) -> None:
        """The service is done with the node (quarantined, failed, cancelled) or holds it for a human
        (class action ``hold``) while it is still broken: a human repairs it ``repair_s`` later."""
        name = self._node(rid)
        if name in self.handed or (nxt is not None and step != Step.K8S_EVICT):
            return
        with self.sessions() as s:
            rem = s.execute(select(Remediation.status, Remediation.action).where(Remediation.id == rid)).first()
            if rem is None or rem.status == RemediationStatus.SUCCEEDED:
                return
            if nxt is not None and not (rem.action == HOLD and rem.status in OPEN_STATUSES):
                return
        with self.world.mutate() as st:
            node = st["nodes"].get(name)
            if node is None or in_service(node):
                return
        self.handed.add(name)
        self._push(key[0] + self.repair_td, REPAIR, rid, payload=("hands", name))

    def _after(self, key: Key, rid: int, step: str, *, nxt: FollowUp | None) -> None:
        at = key[0]
        self._hand_over(key, rid, step, nxt=nxt)
        if nxt is None:
            if _left_vm_phase(step, None):
                self._view_changed(key)
            return
        period = timedelta(seconds=nxt.countdown)
        if not self.skip or nxt.countdown <= 0 or self._auto_close_pending():
            self._step(rid, nxt.step, at + period)
            if _left_vm_phase(step, nxt.step) or nxt.hint is Hint.NONE and nxt.countdown > 0:
                self._view_changed(key)  # a VM action slot freed, or a hold may have paused automation
            return
        if nxt.hint is Hint.INCIDENT:
            # Held until its incident closes: the repair that closes it wakes it (see _repair).
            self.idle[rid] = Idle(nxt.step, at, period, parked=False, node=self._node(rid))
            return
        if nxt.hint in (Hint.ADMISSION, Hint.ADMISSION_NEW_MACHINE):
            new_machine = nxt.hint is Hint.ADMISSION_NEW_MACHINE
            self.idle[rid] = Idle(nxt.step, at, period, parked=True, new_machine=new_machine,
                                  not_before=nxt.not_before)
            self._view_changed(key, rank=True)  # the claim may have latched the breaker
            return
        if nxt.hint is Hint.WAIT and (until := self._wait_until(rid, nxt.step)) is not None:
            if self.view is None:
                self._view_changed(key, force=True)  # know the view a sleeper went to sleep under
            idle = Idle(nxt.step, at, period, parked=False, node=self._node(rid))
            self.idle[rid] = idle
            self._step(rid, nxt.step, self._grid_at_or_after(idle, until, key, rid=rid))
            return
        self._step(rid, nxt.step, at + period)
        if _left_vm_phase(step, nxt.step) or nxt.hint is Hint.NONE:
            self._view_changed(key)

    # -------------------------------------------------------------------------------- wake rules

    def _wait_until(self, rid: int, step: str) -> datetime | None:
        """The first moment a waiting step's answer can change by time alone (its operation finishing,
        its timeout), or None when the loop cannot tell (then it is polled as before)."""
        wf = self.settings.workflow
        timeout = {Step.SLURM_DRAIN: wf.drain_timeout_s, Step.K8S_EVICT: wf.evict_timeout_s,
                   Step.VM_RESTART: wf.vm_operation_timeout_s, Step.VERIFY: wf.verify_timeout_s,
                   Step.VALIDATE: wf.verify_timeout_s}.get(Step(step))
        if timeout is None:
            return None
        with self.sessions() as s:
            row = live_row(s, rid, Step(step))
        if row is None or (started := aware(row.started_at)) is None:
            return None
        until = started + timedelta(seconds=timeout + HeldTime.load(row.detail).held_s)  # held time is not its own
        op = row.provider_op or {}
        if "job_ref" in op or Step(step) is Step.VALIDATE:  # a job on the node: a GPU reset, the GPU check
            jobs = self.engine.adapters.validator
            return jobs.ends_after(op, self.clock.now()) if isinstance(jobs, WorldJobs) else None
        if Step(step) is Step.VM_RESTART:
            ref = op.get("ref")
            done_at = self.world.op_done_at(ref) if ref else None
            if done_at is None:
                return None
            until = min(until, done_at)
        return until

    def _world_changed(self, key: Key, node: str) -> None:
        """A fault or a repair changed ``node``: a step asleep on it must look at its next poll."""
        for rid, idle in list(self.idle.items()):
            if not idle.parked and idle.node == node:
                self._step(rid, idle.step, self._next_grid(idle, key, rid))

    def _view_changed(self, key: Key, force: bool = False, rank: bool = False) -> None:
        """Something that may change admission happened: re-read the cluster view, and if it changed (or
        ``rank``: someone was just parked), tell every parked remediation (and, on a pause or breaker
        change, every sleeping one). With nobody idle there is nobody to tell: the view is read again
        when someone goes idle."""
        if not self.skip or not self.idle and not force:
            self.view = None
            return
        view = self._current_view()
        fp = (view.paused, view.pause_reason, view.breaker_latched, view.machine_active,
              view.last_machine_action_at, breaker_open(view, self.settings.policy))
        if fp == self.view and not rank:
            return
        global_change = self.view is not None and fp[:3] != self.view[:3]
        self.view = fp
        if global_change:
            for rid, idle in list(self.idle.items()):
                if not idle.parked:
                    self._step(rid, idle.step, self._next_grid(idle, key, rid))
        self._rank_parked(key, view)

    def _rank_parked(self, key: Key, view: ClusterView) -> None:
        """Schedule the parked remediations that can get through, and no more: when a VM action slot
        frees, every parked one would be admitted, but only the first ``max_concurrent - machine_active`` to
        poll (in the loop's order) can take a slot; the rest would be refused again. If one of
        the first is turned away after all (the gap, a newcomer took the slot), its claim ranks again."""
        slots = self.settings.policy.max_concurrent - view.machine_active
        contenders: list[tuple[datetime, int]] = []
        for rid, idle in self.idle.items():
            if not idle.parked:
                continue
            at, exact = self._admissible(key, rid, idle, view=view)
            if at is None:
                self._unschedule(rid)  # shut until the view changes
            elif idle.new_machine and exact:
                contenders.append((at, rid))
            else:
                self._step(rid, idle.step, at)
        contenders.sort()
        for i, (at, rid) in enumerate(contenders):
            if i < slots:
                self._step(rid, self.idle[rid].step, at)
            else:
                self._unschedule(rid)

    def _current_view(self) -> ClusterView:
        with self.sessions() as s:
            return cluster_view(s, self.clock.now(), self.settings.policy.breaker_window, exclude=None)

    def _admissible(self, key: Key, rid: int, idle: Idle, *, view: ClusterView) -> tuple[datetime | None,
        bool]:
        """The first grid point at which the parked remediation is admitted under ``view``
        (None: not before the view changes), and whether that is admission's verdict (False: its claim may
        change the breaker, so it runs whatever admission says)."""
        policy = self.settings.policy
        nxt = self._next_grid(idle, key, rid)
        step = Step(idle.step)
        if (view.breaker_latched and policy.breaker_auto_close_s is not None) or (
                not view.breaker_latched and breaker_open(view, policy)):
            return nxt, False
        if idle.not_before is not None and idle.not_before > nxt:
            # Held by time alone until then (an incident's grace): every look before it is refused again,
            # and changes nothing but the time of its next look.
            nxt = self._grid_at_or_after(idle, idle.not_before, key, rid=rid)
        if admit(step, view, policy, now=nxt, new_machine_action=idle.new_machine).ok:
            return nxt, True
        if view.last_machine_action_at is not None:
            due = view.last_machine_action_at + timedelta(seconds=policy.min_restart_gap_s)
            if due > nxt and admit(step, view, policy, now=due, new_machine_action=idle.new_machine).ok:
                return self._grid_at_or_after(idle, due, key, rid=rid), True  # only the gap holds it
        return None, True

    def _auto_close_pending(self) -> bool:
        """Opt-in auto-close: any claim may close a latched breaker once it has been quiet long enough,
        so while it is latched every poll runs, as in the polling loop."""
        if self.settings.policy.breaker_auto_close_s is None:
            return False
        return self._current_view().breaker_latched

    # ------------------------------------------------------------------------------------ the grid

    @staticmethod
    def _after_key(at: datetime, rid: int, key: Key) -> bool:
        return (at, STEP, rid) > key

    def _next_grid(self, idle: Idle, key: Key, rid: int) -> datetime:
        """The remediation's first poll-grid point later (in the loop's order) than ``key``."""
        return self._grid_at_or_after(idle, key[0], key, rid=rid)

    def _grid_at_or_after(self, idle: Idle, when: datetime, key: Key, *, rid: int) -> datetime:
        n = max(1, -((idle.last - when) // idle.period))  # ceil((when - last) / period), at least one
        at = idle.last + n * idle.period
        while not self._after_key(at, rid, key):
            at += idle.period
        return at

    def _node(self, rid: int) -> str:
        if rid not in self.nodes:
            with self.sessions() as s:
                self.nodes[rid] = s.scalar(select(Remediation.node).where(Remediation.id == rid)) or ""
        return self.nodes[rid]


def _left_vm_phase(step: str, nxt: str | None) -> bool:
    """Did a remediation leave its VM phase (the only way a slot under ``max_concurrent`` frees up)?
    Other changes admission depends on come from ingest (pool, breaker window) or close admission (a new VM
    action); a view read later than it could be only costs a poll that would have been skipped."""
    return step in MACHINE_STEPS and not (step == Step.VM_RESTART and nxt == Step.VERIFY)
