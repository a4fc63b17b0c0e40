"""Domain repairs in the database: which NVLink domain a tray is in, opening or joining its repair at
the ingest, and the engine that walks a repair through its ladder in three phases (claim, act, record),
as the workflow does for one node.

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.models import DomainRepair, DomainRepairStep, Node, NodeDomain, Remediation
from remediation.db.queries import cluster_view, control_set, fleet_latched, lock_control
from remediation.domain.causes import Cause, FaultScope
from remediation.domain.events import NodeEvent, Source
from remediation.domain.nvlink import CLIQUE_LABEL, BlockHealth
from remediation.domain.outcomes import Adapters
from remediation.domain.ownership import Resumed, resume
from remediation.domain.policy import Clock, ClusterView
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import OPEN_STATUSES, NodeStatus
from remediation.domain.states import AuditAction, StepStatus
from remediation.domain.topology import BLOCK, domain_faults
from remediation.domain_repair import steps as bodies
from remediation.domain_repair.rules import (
    MACHINE_STEPS,
    DomainRepairStatus,
    DomainStep,
    admit_domain,
    after,
    joins,
    ladder,
)
from remediation.hostlist import compress
from remediation.incidents.settings import IncidentSettings
from remediation.ports.errors import RemediationError, Scope, TransientError
from remediation.profiles.rules import Governance
from remediation.services.audit import audit, would
from remediation.services.hardware import sightings
from remediation.services.holds import PagedError, pause
from remediation.services.nvlink import block_health
from remediation.services.readmodels import RecordNotFound
from remediation.settings import Settings

log = logging.getLogger(__name__)

_SOURCES = ((Source.SLURM.value, BLOCK), (Source.KUBERNETES.value, CLIQUE_LABEL))  # Slurm's word first
LEASE = timedelta(minutes=5)
ACTOR = "remediation"  # who opens and joins a repair at the ingest, as the ingest's own rows say
NVLINK = "nvlink"  # the class whose faults on many trays of one domain are the domain's


@dataclass(frozen=True)
class NvlinkDomain:
    """A tray's NVLink domain as the service acts on it: Slurm's block where Slurm names one (Slurm
    actions follow the block), else the Node's clique label; every tray in it, sorted."""

    kind: str
    name: str
    trays: tuple[str, ...]


def domains_of(s: Session, nodes: Collection[str]) -> dict[str, NvlinkDomain]:
    """Each of ``nodes``' NVLink domain (a node in none is left out)."""
    rows = s.execute(select(NodeDomain.node, NodeDomain.source, NodeDomain.kind, NodeDomain.name).where(
        NodeDomain.node.in_(list(nodes)),
        or_(*((NodeDomain.source == src) & (NodeDomain.kind == kind) for src, kind in _SOURCES))))
    named: dict[str, dict[tuple[str, str], str]] = {}
    for node, source, kind, name in rows:
        named.setdefault(node, {})[(source, kind)] = name
    out: dict[str, NvlinkDomain] = {}
    members: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for node, mine in named.items():
        source, kind = next(key for key in _SOURCES if key in mine)
        key = (source, kind, mine[(source, kind)])
        if key not in members:
            members[key] = tuple(sorted(s.scalars(select(NodeDomain.node).where(
                NodeDomain.source == source, NodeDomain.kind == kind, NodeDomain.name == key[2]))))
        out[node] = NvlinkDomain(kind, key[2], members[key])
    return out


@dataclass(frozen=True)
class Running:
    """A running repair as a tray sees it: its id and its domain."""

    id: int
    kind: str
    name: str

    @property
    def domain(self) -> str:
        return f"{self.kind} {self.name}"


def running_by_tray(s: Session) -> dict[str, Running]:
    """Every tray of a running domain repair, and that repair."""
    out: dict[str, Running] = {}
    for rid, kind, name, trays in s.execute(select(DomainRepair.id, DomainRepair.kind, DomainRepair.name,
                                                   DomainRepair.trays).where(
            DomainRepair.status == DomainRepairStatus.RUNNING)):
        for tray in trays:
            out[tray] = Running(rid, kind, name)
    return out


def open_or_join(s: Session, domain: NvlinkDomain, ev: NodeEvent, *, cause: Cause, now: datetime,
                 dry_run: bool) -> tuple[int, bool]:
    """The running repair of ``domain``, opened by ``ev`` (True) or joined by it (False). The partial
    unique index (one running per domain) settles a race with another ingest."""
    found = s.scalar(select(DomainRepair).where(DomainRepair.status == DomainRepairStatus.RUNNING,
                                                DomainRepair.kind == domain.kind, DomainRepair.name == domain.name))
    if found is None:
        rep = DomainRepair(kind=domain.kind, name=domain.name, trays=list(domain.trays), size=len(domain.trays),
                           reporters=[ev.node], cause=_text(ev), source=ev.source, fault_class=cause.fault_class,
                           fault_evidence=cause.evidence, status=DomainRepairStatus.RUNNING, step=DomainStep.DRAIN,
                           rung=0, rungs=[], ours=[], opened_at=now, updated_at=now, next_run_at=now,
                           dry_run=dry_run)
        try:
            with s.begin_nested():
                s.add(rep)
                s.flush()
        except Exception:  # noqa: BLE001 - the unique index: another ingest opened it first
            found = s.scalar(select(DomainRepair).where(
                DomainRepair.status == DomainRepairStatus.RUNNING, DomainRepair.kind == domain.kind,
                DomainRepair.name == domain.name))
            if found is None:
                raise
        else:
            reason = (f"NVLink domain {domain.kind} {domain.name} ({len(domain.trays)} trays): {cause.evidence}; "
                      f"one repair for the domain, none per tray")
            audit(s, now, ACTOR, action=AuditAction.DOMAIN_REPAIR_OPENED, target=f"{domain.kind}/{domain.name}",
                  reason=would(reason) if dry_run else reason,
                  detail={"domain_repair": rep.id, "trays": list(domain.trays), "node": ev.node,
                          "fault_class": cause.fault_class}, dry_run=dry_run)
            _mark(s, domain.trays, status=NodeStatus.REMEDIATING, reason=f"domain repair #{rep.id}", now=now)
            return rep.id, True
    join(s, found, ev.node, now=now, actor=ACTOR)
    return found.id, False


def hand_over(s: Session, rem: Remediation, *, now: datetime) -> int | None:
    """``validation.domain_check_on_return``: the tray of a remediation about to return is handed to a
    repair of its NVLink domain that proves the domain first (its ladder starts with the domain check),
    or joins the one running. None: the tray is in no multi-node domain, and returns on its own."""
    domain = domains_of(s, [rem.node]).get(rem.node)
    if domain is None or len(domain.trays) < 2:
        return None
    found = s.scalar(select(DomainRepair).where(DomainRepair.status == DomainRepairStatus.RUNNING,
                                                DomainRepair.kind == domain.kind, DomainRepair.name == domain.name))
    if found is not None:
        join(s, found, rem.node, now=now, actor=ACTOR)
        return found.id
    # Due at once for the sweep (which sends each repair whose look is overdue): the step's follow-up
    # carries the remediation, not the repair.
    due = now - timedelta(days=1)
    rep = DomainRepair(kind=domain.kind, name=domain.name, trays=list(domain.trays), size=len(domain.trays),
                       reporters=[rem.node], cause=f"remediation #{rem.id} of {rem.node} ended: {rem.cause}",
                       source=Source(rem.source),
                       fault_class=rem.fault_class or "unknown", fault_evidence=(
                           "validation.domain_check_on_return: the tray returns only with its domain proven"),
                       status=DomainRepairStatus.RUNNING, step=DomainStep.DRAIN, rung=0,
                       rungs=[DomainStep.DOMAIN_CHECK.value], ours=[], opened_at=now, updated_at=now,
                       next_run_at=due, dry_run=bool(rem.dry_run))
    s.add(rep)
    s.flush()
    reason = (f"remediation #{rem.id} of {rem.node} passed its own check; the domain check over {domain.kind} "
              f"{domain.name} ({len(domain.trays)} trays) decides its return")
    audit(s, now, ACTOR, action=AuditAction.DOMAIN_REPAIR_OPENED, target=f"{domain.kind}/{domain.name}",
          reason=would(reason) if rep.dry_run else reason,
          detail={"domain_repair": rep.id, "trays": list(domain.trays), "node": rem.node, "remediation": rem.id},
          dry_run=rep.dry_run)
    return rep.id


def join(s: Session, rep: DomainRepair, node: str, *, now: datetime, actor: str) -> None:
    """A tray's signal joins its domain's running repair: it opens nothing, and is named among the
    repair's reporters once."""
    if node not in rep.reporters:
        rep.reporters = [*rep.reporters, node]
        rep.updated_at = now
        audit(s, now, actor, action=AuditAction.DOMAIN_REPAIR_JOINED, target=node,
              reason=joins(rep.kind, rep.name, rep.id), detail={"domain_repair": rep.id}, dry_run=rep.dry_run)


def _text(ev: NodeEvent) -> str:
    return f"{ev.source} {ev.state}: {ev.reason}" if ev.reason else f"{ev.source} {ev.state}"


def _mark(s: Session, trays: Collection[str], *, status: NodeStatus, reason: str, now: datetime) -> None:
    s.execute(update(Node).where(Node.name.in_(list(trays))).values(status=status, status_reason=reason,
                                                                     updated_at=now))


# -------------------------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class Claimed:
    """What the act phase needs of a claimed repair: a snapshot, never the row."""

    repair: bodies.Repair
    step: DomainStep
    row_id: int
    detail: dict[str, Any]


class DomainRepairs:
    """Walks running domain repairs through their ladder, one look at a time: :meth:`advance` claims a
    repair (lease, step row written before anything acts), acts through the adapters, records what
    happened; :meth:`due` lists the repairs nobody is working on (the sweeper's)."""

    def __init__(self, sessions: sessionmaker[Session], adapters: Adapters, settings: Settings, *,
                 clock: Clock, worker: str = "worker") -> None:
        self.sessions = sessions
        self.adapters = adapters
        self.settings = settings
        self.clock = clock
        self.worker = worker

    @property
    def poll_s(self) -> float:
        return self.settings.validation.poll_interval_s

    def advance(self, repair_id: int) -> float | None:
        """One look at repair ``repair_id``: seconds until the next one, or None when it is closed (or
        not found, or another worker holds it)."""
        token = f"{self.worker}:{uuid.uuid4().hex[:12]}"
        claimed = self._claim(repair_id, token)
        if not isinstance(claimed, Claimed):
            return claimed
        try:
            result = bodies.STEPS[claimed.step](claimed.repair, self.adapters, self.settings)
            # An answer ends any streak of errors: only errors in a row pause.
            result = replace(result, detail={k: v for k, v in result.detail.items() if k not in ("error", "errors")})
        except TransientError as exc:
            result = self._transient(claimed, exc)
        except RemediationError as exc:
            said = f"{exc.kind}: {exc.message}"
            if exc.scope is Scope.SYSTEM:  # our plumbing: pause automation (one page), look again after
                self._pause(claimed, PagedError.of(exc))
                result = bodies.Result(done=False, detail={**claimed.detail, "error": said}, outcome=said)
            else:  # about a tray: this rung cannot do its work, so the ladder climbs
                result = bodies.Result(done=True, ok=False, detail={**claimed.detail, "error": said}, outcome=said)
        except Exception as exc:  # noqa: BLE001 - nobody mapped it: pause with a page, never a verdict
            log.exception("domain repair %s: %s raised an error no adapter mapped", repair_id, claimed.step)
            self._pause(claimed, PagedError.of(exc))
            result = bodies.Result(done=False, detail=claimed.detail, outcome=f"unmapped {type(exc).__name__}")
        return self._record(claimed, token, result)

    def _transient(self, claimed: Claimed, exc: TransientError) -> bodies.Result:
        """Look again; once errors have come ``workflow.transient_retries`` times in a row over
        ``workflow.transient_budget_s``, a dependency is down, not the domain: pause (self-healing: the
        probe lifts it), never a verdict on the trays."""
        wf, now = self.settings.workflow, self.clock.now()
        streak = dict(claimed.detail.get("errors") or {"count": 0, "since": now.isoformat()})
        streak["count"] = int(streak["count"]) + 1
        failing = (now - datetime.fromisoformat(str(streak["since"]))).total_seconds()
        log.warning("domain repair %s: %s: %s (%d in a row); looking again", claimed.repair.id, claimed.step,
                    exc.message, streak["count"])
        if streak["count"] > wf.transient_retries and failing >= wf.transient_budget_s:
            self._pause(claimed, PagedError("TransientErrorsPersisted", f"domain repair #{claimed.repair.id} at "
                                            f"{claimed.step}: {exc.message}", True, True, "slurm"))
        return bodies.Result(done=False, detail={**claimed.detail, "error": exc.message, "errors": streak},
                             outcome=exc.message)

    def _pause(self, claimed: Claimed, fault: PagedError) -> None:
        with self.sessions() as s, s.begin():
            pause(s, self.clock.now(), fault, node=claimed.repair.trays[0], rid=None)

    def take_down(self) -> list[str]:
        """Finish what a cancelled repair's step had started (its jobs, their reservations), once: the
        trays are not left in a reservation nobody waits on. Returns what was done."""
        with self.sessions() as s:
            rows = s.execute(select(DomainRepairStep.id, DomainRepairStep.detail).join(DomainRepair).where(
                DomainRepair.status == DomainRepairStatus.CANCELLED,
                DomainRepairStep.status.in_([StepStatus.STARTED, StepStatus.WAITING]))).all()
        done = []
        for row_id, detail in rows:
            said = bodies.take_down(dict(detail or {}), self.adapters)
            with self.sessions() as s, s.begin():
                row = s.get(DomainRepairStep, row_id, with_for_update=True)
                if row is not None and row.status in (StepStatus.STARTED, StepStatus.WAITING):
                    row.status, row.finished_at = StepStatus.FAILED, self.clock.now()
                    row.outcome = f"cancelled; {said}"
                    done.append(said)
        return done

    def due(self) -> list[int]:
        """Running repairs whose next look is overdue and that no live lease holds (a dead worker, a
        lost message): the sweeper sends each again."""
        now = self.clock.now()
        grace = timedelta(seconds=self.settings.workflow.sweep_interval_s)
        with self.sessions() as s, s.begin():
            rows = s.scalars(select(DomainRepair).where(
                DomainRepair.status == DomainRepairStatus.RUNNING, DomainRepair.next_run_at < now - grace,
                or_(DomainRepair.lease_until.is_(None), DomainRepair.lease_until < now),
            ).with_for_update(skip_locked=True)).all()
            for rep in rows:
                rep.lease_owner = rep.lease_until = None
                rep.next_run_at = now + grace
            return [rep.id for rep in rows]

    # ------------------------------------------------------------------------------- phases

    def _claim(self, repair_id: int, token: str) -> Claimed | float | None:
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rep = s.scalar(select(DomainRepair).where(DomainRepair.id == repair_id).with_for_update(skip_locked=True))
            if rep is None or rep.status is not DomainRepairStatus.RUNNING:
                return None
            if rep.lease_until is not None and aware(rep.lease_until) > now:
                return None  # another worker is on it; it sends the next look itself
            row = _live_row(s, rep)
            if row is None:
                if (refused := self._refused(s, rep, now)) is not None:
                    rep.next_run_at, rep.wait_reason = now + timedelta(seconds=self.poll_s), refused
                    return self.poll_s
                row = _new_row(s, rep, now)
            elif self._paused(s, now):
                return self.poll_s  # a pause stops every clock: a running step is not looked at either
            rep.lease_owner, rep.lease_until = token, now + LEASE
            snap = bodies.Repair(rep.id, rep.kind, rep.name, tuple(rep.trays), rep.fault_class,
                                 tuple(rep.ours), rep.rung, tuple(rep.rungs), rep.dry_run, row.idempotency_key,
                                 rep.cause, tuple(rep.reporters), dict(row.detail or {}), now,
                                 aware(row.started_at), rep.source)
            return Claimed(snap, rep.step, row.id, snap.detail)

    def _view(self, s: Session, now: datetime) -> ClusterView:
        """This cluster's view; held as well by every other cluster's pause and storm breaker only where
        ``cluster.fleet_latch`` asks for it, as a node's remediation is."""
        view = cluster_view(s, now, self.settings.policy.breaker_window, exclude=None)
        return fleet_latched(s, view) if self.settings.cluster.fleet_latch else view

    def _paused(self, s: Session, now: datetime) -> bool:
        return self._view(s, now).paused

    def _refused(self, s: Session, rep: DomainRepair, now: datetime) -> str | None:
        """Why the repair's next step may not start now (None: it may)."""
        policy = self.settings.policy
        view = self._view(s, now)
        if rep.step in MACHINE_STEPS:
            if not rep.dry_run:  # the view counts this repair's own trays already (it is at the step)
                view = replace(view, machine_active=max(0, view.machine_active - rep.size))
            admitted = admit_domain(view, policy, trays=rep.size, now=now)
            return None if admitted.ok else admitted.reason
        if view.paused:
            return f"automation is paused: {view.pause_reason}" if view.pause_reason else "automation is paused"
        return None

    def _record(self, claimed: Claimed, token: str, result: bodies.Result) -> float | None:
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rep = s.get(DomainRepair, claimed.repair.id, with_for_update=True)
            row = s.get(DomainRepairStep, claimed.row_id)
            if rep is None or row is None or rep.lease_owner != token:
                return None  # the lease was taken from us: the other worker's record stands
            rep.lease_owner = rep.lease_until = None
            rep.updated_at = now
            row.detail = result.detail
            if result.ours is not None:
                rep.ours = list(result.ours)
            if not result.done:
                row.status, rep.wait_reason = StepStatus.WAITING, result.outcome or None
                wait = result.wait_s if result.wait_s is not None else self.poll_s
                rep.next_run_at = now + timedelta(seconds=wait)
                return wait
            row.status = StepStatus.DONE if result.ok else StepStatus.FAILED
            row.finished_at, row.outcome, rep.wait_reason = now, result.outcome, None
            self._move(s, rep, result, now=now)
            if rep.status is not DomainRepairStatus.RUNNING:
                return None
            rep.next_run_at = now
            return 0.0

    def _move(self, s: Session, rep: DomainRepair, result: bodies.Result, *, now: datetime) -> None:
        step = rep.step
        if step is DomainStep.DRAIN and not result.ok:  # the signal is not confirmed: nothing was done
            self._close(s, rep, DomainRepairStatus.CANCELLED, result=result, now=now)
            return
        if step is DomainStep.JOBS:
            proof = [DomainStep.DOMAIN_CHECK.value] if rep.rungs[:1] == [DomainStep.DOMAIN_CHECK.value] else []
            rep.rungs = proof + list(ladder(runs_jobs=self.adapters.validator is not None,
                                            chassis=bodies.has_chassis(self.adapters, rep.name)))
        rungs = tuple(DomainStep(r) for r in rep.rungs) or (DomainStep.QUARANTINE,)
        nxt = after(step, ok=result.ok, rung=rep.rung, rungs=rungs)
        if step is DomainStep.DOMAIN_CHECK and not result.ok:
            log.warning("domain repair %s: the domain check failed (%s); next: %s", rep.id, result.outcome, nxt.step)
        rep.step, rep.rung = nxt.step, nxt.rung
        if step is DomainStep.RETURN:
            self._close(s, rep, DomainRepairStatus.RETURNED, result=result, now=now)
        elif step is DomainStep.QUARANTINE:
            self._close(s, rep, DomainRepairStatus.QUARANTINED, result=result, now=now)

    def _close(self, s: Session, rep: DomainRepair, status: DomainRepairStatus, *, result: bodies.Result,
               now: datetime) -> None:
        reason, detail = result.outcome, result.page
        if status is DomainRepairStatus.QUARANTINED:
            serials = _serials(s, rep.trays)
            detail = {**(detail or {}), "serials": serials}
            reason += "; serials: " + ("; ".join(f"{t} {', '.join(v)}" for t, v in serials.items()) if serials
                                       else "none recorded yet (no GPU check or BMC read of these trays)")
        rep.status, rep.closed_at, rep.close_reason = status, now, reason
        rep.step = DomainStep.DONE
        if status is DomainRepairStatus.RETURNED:
            _mark(s, rep.ours, status=NodeStatus.HEALTHY, reason=f"domain repair #{rep.id} proved the domain", now=now)
            action = AuditAction.DOMAIN_REPAIR_RETURNED
        elif status is DomainRepairStatus.CANCELLED:
            _mark(s, rep.trays, status=NodeStatus.HEALTHY, reason=f"domain repair #{rep.id}: {reason}", now=now)
            action = AuditAction.DOMAIN_REPAIR_CANCELLED
        else:
            _mark(s, rep.trays, status=NodeStatus.QUARANTINED, reason=f"domain repair #{rep.id}: {reason}", now=now)
            s.execute(update(Node).where(Node.name.in_(list(rep.trays))).values(
                quarantine_reason=f"NVLink domain {rep.kind} {rep.name}, domain repair #{rep.id}", quarantined_at=now))
            action = AuditAction.DOMAIN_REPAIR_QUARANTINED
        released = _release(s, rep, now)
        audit(s, now, self.settings.actor, action=action, target=f"{rep.kind}/{rep.name}",
              reason=would(reason) if rep.dry_run else reason,
              detail={"domain_repair": rep.id, "trays": list(rep.trays), "released": released, **(detail or {})},
              dry_run=rep.dry_run)


def _release(s: Session, rep: DomainRepair, now: datetime) -> list[int]:
    """A tray's own remediation the repair held re-checks its own signal before its next disruptive step
    (the sweeper resumes it): healthy again, it is given back; still bad, it goes on alone."""
    out = []
    for rem in s.scalars(select(Remediation).where(Remediation.node.in_(list(rep.trays)),
                                                   Remediation.status.in_(OPEN_STATUSES)).with_for_update()):
        rem.ctx = replace(rem.ctx, reconfirm=True)
        rem.next_run_at, rem.wait_reason, rem.updated_at = now, None, now
        out.append(rem.id)
    return out


def _live_row(s: Session, rep: DomainRepair) -> DomainRepairStep | None:
    return s.scalar(select(DomainRepairStep).where(
        DomainRepairStep.repair_id == rep.id, DomainRepairStep.step == rep.step,
        DomainRepairStep.status.in_([StepStatus.STARTED, StepStatus.WAITING])).order_by(DomainRepairStep.id.desc()))


def _new_row(s: Session, rep: DomainRepair, now: datetime) -> DomainRepairStep:
    """The step's row, written (and committed with the lease) before the step acts: its key names
    whatever it starts (a job, a reset), so a worker killed after acting finds it and starts nothing twice."""
    attempt = 1 + len(s.scalars(select(DomainRepairStep.id).where(
        DomainRepairStep.repair_id == rep.id, DomainRepairStep.step == rep.step)).all())
    row = DomainRepairStep(repair_id=rep.id, step=rep.step, attempt=attempt,
                           idempotency_key=f"dr{rep.id}-{rep.step.value}-{attempt}", status=StepStatus.STARTED,
                           started_at=now, detail={"nonce": secrets.token_hex(4), "rung": rep.rung},
                           dry_run=rep.dry_run)
    s.add(row)
    s.flush()
    return row



# ------------------------------------------------------------------------------------- the ingest


@dataclass
class Routes:
    """What a batch's deciding needs of domain repairs: each node's NVLink domain and the running
    repairs, read once; :meth:`route` opens or joins a repair for a ``domain`` decision."""

    session: Session
    domains: dict[str, NvlinkDomain]
    running: dict[str, Running]
    opened: list[int]
    _nvlink: dict[str, dict[str, datetime]] = field(default_factory=dict)  # per domain: tray -> its NVLink fault

    @classmethod
    def load(cls, s: Session, names: Collection[str]) -> Routes:
        return cls(s, domains_of(s, names), running_by_tray(s), [])

    def size(self, node: str) -> int:
        """The trays of ``node``'s NVLink domain (1: it is in none)."""
        found = self.domains.get(node)
        return len(found.trays) if found is not None else 1

    def trays_of(self, node: str) -> tuple[str, ...]:
        found = self.domains.get(node)
        return found.trays if found is not None else (node,)

    def under_repair(self, node: str) -> str | None:
        """Why ``node``'s signal joins a running repair of its domain (None: none runs)."""
        if (found := self.running.get(node)) is None:
            return None
        return joins(found.kind, found.name, found.id)

    def nvlink_domain_fault(self, ev: NodeEvent, cause: Cause | None, cfg: IncidentSettings) -> Cause | None:
        """``ev``'s NVLink fault made a domain fault by the faults of its domain's other trays (at least
        ``nvlink_domain_min_trays`` within ``nvlink_domain_window_s``), or None: it stays the tray's."""
        domain = self.domains.get(ev.node)
        if cause is None or cause.fault_class != NVLINK or domain is None or len(domain.trays) < 2:
            return None
        since = ev.observed_at - timedelta(seconds=cfg.nvlink_domain_window_s)
        seen = self._nvlink.setdefault(domain.name, _nvlink_faults(self.session, domain.trays, since))
        seen[ev.node] = ev.observed_at
        found = domain_faults(seen, {domain.name: domain.trays}, k=cfg.nvlink_domain_min_trays,
                              window_s=cfg.nvlink_domain_window_s, now=ev.observed_at)
        if not found:
            return None
        trays = compress(list(found[0].trays))
        return replace(cause, scope=FaultScope.DOMAIN, evidence=(
            f"{cause.evidence}: NVLink faults on {len(found[0].trays)} trays of {domain.kind} {domain.name} "
            f"({trays}) within {cfg.nvlink_domain_window_s:g} s, a fault of the domain"))

    def route(self, ev: NodeEvent, cause: Cause | None, *, now: datetime, dry_run: bool) -> str:
        """Open the repair of ``ev``'s domain, or join the one running; returns the event's decision reason."""
        if (found := self.running.get(ev.node)) is not None:
            rep = self.session.get(DomainRepair, found.id)
            if rep is not None:
                join(self.session, rep, ev.node, now=now, actor=ACTOR)
            return self.under_repair(ev.node) or ""
        domain = self.domains[ev.node]
        assert cause is not None, "a domain fault has a cause"
        rid, opened = open_or_join(self.session, domain, ev, cause=cause, now=now, dry_run=dry_run)
        for tray in domain.trays:
            self.running[tray] = Running(rid, domain.kind, domain.name)
        if opened:
            self.opened.append(rid)
            return (f"opened domain repair #{rid} ({domain.kind} {domain.name}, {len(domain.trays)} trays): "
                    f"{cause.evidence}")
        return self.under_repair(ev.node) or ""


def _nvlink_faults(s: Session, trays: Collection[str], since: datetime) -> dict[str, datetime]:
    """When each of ``trays`` last had an NVLink fault remediated since ``since`` (dry-run counts none)."""
    rows = s.execute(select(Remediation.node, Remediation.opened_at).where(
        Remediation.node.in_(list(trays)), Remediation.fault_class == NVLINK, Remediation.opened_at > since,
        Remediation.dry_run.is_(False)))
    out: dict[str, datetime] = {}
    for node, at in rows:
        out[node] = max(out.get(node, aware(at)), aware(at))
    return out


def _serials(s: Session, trays: Collection[str]) -> dict[str, list[str]]:
    """Each tray's serials as last seen (its BMC's, its GPUs'), for the RMA note; a tray never read is left out."""
    out: dict[str, list[str]] = {}
    for sighting in sightings(s, trays):  # oldest first: the latest read of each tray wins
        found = [x for x in (sighting.bmc_serial, *(g.serial for g in sighting.gpus)) if x]
        if found:
            out[sighting.node] = sorted(set(found))
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------------- the lever


def cancel_repair(s: Session, repair_id: int, actor: str, *, reason: str, now: datetime) -> list[int]:
    """A human stops a running repair where it stands: its trays are left as they are (drained by us,
    if it got that far) and marked unhealthy for a human to decide; a job it started is taken down by
    the next sweep; a tray's own remediation it held re-checks its signal. Returns those remediations."""
    rep = s.get(DomainRepair, repair_id, with_for_update=True)
    if rep is None:
        raise RepairNotFound(f"no domain repair #{repair_id}")
    if rep.status is not DomainRepairStatus.RUNNING:
        raise ValueError(f"domain repair #{repair_id} is already {rep.status.value}")
    rep.status, rep.closed_at, rep.updated_at = DomainRepairStatus.CANCELLED, now, now
    rep.close_reason, rep.lease_owner, rep.lease_until = f"cancelled by {actor}: {reason}", None, None
    _mark(s, rep.trays, status=NodeStatus.UNHEALTHY, reason=rep.close_reason, now=now)
    released = _release(s, rep, now)
    audit(s, now, actor, action=AuditAction.DOMAIN_REPAIR_CANCELLED, target=f"{rep.kind}/{rep.name}", reason=reason,
          detail={"domain_repair": rep.id, "step": rep.step.value, "trays": list(rep.trays), "released": released})
    return released


def cancelled_text(repair_id: int, held: list[int]) -> str:
    """What the cancel lever answers, by the CLI and the API alike."""
    return (f"domain repair #{repair_id} cancelled; its trays are left as they are for a human; "
            f"{len(held)} tray remediation(s) it held re-check their trigger now")


# ------------------------------------------------------------------------------------- reading


class RepairNotFound(RecordNotFound):
    """No domain repair has this id (a 404 in the API, like any record not found)."""


def as_dict(rep: DomainRepair, steps: list[DomainRepairStep] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rep.id, "domain": f"{rep.kind} {rep.name}", "kind": rep.kind, "name": rep.name,
        "trays": list(rep.trays), "size": rep.size, "reporters": list(rep.reporters), "cause": rep.cause,
        "fault_class": rep.fault_class, "fault_evidence": rep.fault_evidence, "status": rep.status.value,
        "step": rep.step.value, "rungs": list(rep.rungs), "ours": list(rep.ours), "wait_reason": rep.wait_reason,
        "opened_at": aware(rep.opened_at), "updated_at": aware(rep.updated_at), "closed_at": aware(rep.closed_at),
        "close_reason": rep.close_reason, "dry_run": bool(rep.dry_run), "cluster": rep.cluster,
    }
    if steps is not None:
        out["steps"] = [{"step": r.step.value, "attempt": r.attempt, "status": r.status.value,
                         "started_at": aware(r.started_at), "finished_at": aware(r.finished_at),
                         "outcome": r.outcome} for r in steps]
    return out


def list_repairs(s: Session, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Domain repairs, newest first (``status``: one of :class:`DomainRepairStatus`, or all)."""
    query = select(DomainRepair).order_by(DomainRepair.id.desc()).limit(limit)
    if status is not None:
        if status not in frozenset(DomainRepairStatus):
            raise ValueError(f"unknown status {status!r} ({', '.join(DomainRepairStatus)})")
        query = query.where(DomainRepair.status == status)
    return [as_dict(r) for r in s.scalars(query)]


def show_repair(s: Session, repair_id: int) -> dict[str, Any]:
    """One domain repair with its steps."""
    rep = s.get(DomainRepair, repair_id)
    if rep is None:
        raise RepairNotFound(f"no domain repair #{repair_id}")
    return as_dict(rep, list(rep.steps))


# ------------------------------------------------------------------------------ partial domains

PARTIAL = "partial_domains"  # control row: block -> the trays we drained because it is partial


def partial_reason(prefix: str, block: BlockHealth) -> str:
    """Our Slurm reason on a healthy tray drained because its block is partial."""
    return (f"{prefix} partial domain: block {block.name} has {block.healthy} healthy trays, fewer than its "
            f"smallest block ({block.size}); drained until it is whole (incidents.drain_partial_domains)")


class PartialDomains:
    """``incidents.drain_partial_domains``: each sweep drains the healthy rest of a partial block whose
    trays' profiles ask for it, and gives them back once the block is whole again (only the drains it
    recorded, and only while their reason is still ours)."""

    def __init__(self, repairs: DomainRepairs, governance: Governance) -> None:
        self.repairs, self.governance = repairs, governance

    def sweep(self) -> dict[str, list[str]]:
        """One pass; returns what it drained and gave back, by block."""
        cfg, ad, now = self.repairs.settings, self.repairs.adapters, self.repairs.clock.now()
        prefix = cfg.policy.our_reason_prefix
        with self.repairs.sessions() as s, s.begin():
            kept: dict[str, list[str]] = dict(lock_control(s, PARTIAL, now).get("blocks", {}))
            running = {name for kind, name in s.execute(select(DomainRepair.kind, DomainRepair.name).where(
                DomainRepair.status == DomainRepairStatus.RUNNING)) if kind == BLOCK}
            changed: dict[str, list[str]] = {}
            for block in block_health(s):
                if block.name in running:
                    continue
                if block.partial:
                    fresh = self._drain(s, block, kept=kept.get(block.name, []), prefix=prefix)
                    if fresh:
                        kept[block.name] = sorted({*kept.get(block.name, []), *fresh})
                        changed[f"drained {block.name}"] = fresh
                elif block.name in kept:
                    changed[f"gave back {block.name}"] = [
                        t for t in kept.pop(block.name) if resume(ad.slurm, t, prefix)[0] is Resumed.RESUMED]
            control_set(s, PARTIAL, {"blocks": kept}, now=now)
            for what, trays in changed.items():
                audit(s, now, cfg.actor, action=AuditAction.PARTIAL_DOMAIN, target=what.split()[-1],
                      reason=f"{what}: {compress(trays) if trays else 'nothing of ours to give back'}",
                      detail={"trays": trays}, dry_run=cfg.dry_run)
        return changed

    def _drain(self, s: Session, block: BlockHealth, *, kept: list[str], prefix: str) -> list[str]:
        """Drain the block's healthy trays whose profile asks for it and nobody holds; returns them."""
        rows = s.execute(select(Node.name, Node.status, Node.profile).join(
            NodeDomain, (NodeDomain.node == Node.name) & (NodeDomain.cluster == Node.cluster)).where(
            NodeDomain.source == Source.SLURM.value, NodeDomain.kind == BLOCK, NodeDomain.name == block.name))
        out = []
        for name, status, profile in rows:
            if (status != NodeStatus.HEALTHY or name in kept
                    or not self.governance.named(profile).incidents.drain_partial_domains):
                continue
            node = self.repairs.adapters.slurm.get_node(name)
            if node.flags & {SlurmState.DRAIN, SlurmState.FAIL} or node.state == SlurmState.DOWN:
                continue  # held already (by a human, or by us for another reason): not ours to give back
            self.repairs.adapters.slurm.drain(name, partial_reason(prefix, block))
            out.append(name)
        return sorted(out)
