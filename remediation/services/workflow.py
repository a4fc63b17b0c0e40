"""The workflow engine: runs one step of one remediation, crash-safely, in three phases.

**Claim** (lock the row, check the step, admission, lease, step row ``started`` with its idempotency
key; commit), **act** (the step function, no transaction), **record** (if the lease is still ours: the
outcome, the operation, the next step; commit; then return the follow-up). Transient errors raise
:class:`RetryLater` with the backoff; the step row's failure streak is the one retry counter
(:mod:`remediation.services.retries`).

Why: docs/architecture.md#a-step-runs-in-three-phases
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.factory import AdaptersByPolicy, evidence_storage
from remediation.clock import aware
from remediation.db.models import Remediation, RemediationStep
from remediation.db.queries import (
    LAST_MACHINE_ACTION,
    cluster_view,
    control_set,
    fleet_latched,
    lock_control,
    remediation_locked,
    step_row,
)
from remediation.domain.causes import action_at, action_rungs, needs_rma
from remediation.domain.controls import LastMachineAction
from remediation.domain.evidence import action_here, lacks
from remediation.domain.outcomes import Hold
from remediation.domain.policy import Admission, Clock, Pool, admit
from remediation.domain.statemachine import OPEN_STATUSES, RemediationStatus, Site, Step, next_on_success
from remediation.domain.states import AuditAction, StepStatus
from remediation.domain.step_bodies import (
    STEPS,
    Adapters,
    Cancel,
    Done,
    Escalate,
    Outcome,
    Quarantine,
    StepInput,
    Wait,
)
from remediation.domain.step_records import EvidenceDetail, dumped
from remediation.domain.stepdetail import HeldTime, RetryState
from remediation.domain_repair import service as repairs
from remediation.evidence_collection import service as evidence
from remediation.evidence_collection.rules import Item, Occasion
from remediation.evidence_collection.rules import plan as evidence_plan
from remediation.incidents import service as incidents
from remediation.ports.dispatch import FollowUp, Hint
from remediation.ports.errors import RemediationError, Scope, TransientError
from remediation.ports.evidence import EvidenceStorage
from remediation.profiles.recorded import Governed, RecordedPolicies
from remediation.profiles.service import governance, refresh_pools
from remediation.repair_requests import service as repair_requests
from remediation.services import breaker, step_rows, steplog, takedown
from remediation.services.audit import audit, would
from remediation.services.hardware import record_findings
from remediation.services.holds import PagedError, held_reason, hold, probe
from remediation.services.retries import Attempt, RetryLater, gave_up, record_transient, too_early
from remediation.services.step_rows import (
    Ending,
    as_dry_run,
    close,
    current_row,
    move,
    new_row,
    next_attempt,
    record_wait,
)
from remediation.settings import Settings
from remediation.validation.service import hold_for_human
from remediation.vocabulary import GPU_RESET

log = logging.getLogger(__name__)
#: Two schedules closer than this are one: the database keeps microseconds, and a lossy store may round.
SAME_DUE_S = 0.001
#: What a remediation records where its node's state would be kept but no job can run on the node.
NO_JOBS = "this site has no validation backend to run a job on the node (validation.backend none)"


class Workflow:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        adapters: Adapters | AdaptersByPolicy,
        settings: Settings,
        *,
        clock: Clock,
        worker: str = "worker",
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.governance = governance(settings)
        self._use(adapters)
        self.clock = clock
        self.worker = worker
        self.evidence_store = evidence_storage(settings)  # where large collected evidence is kept

    def _use(self, adapters: Adapters | AdaptersByPolicy) -> None:
        self.by_policy = adapters if isinstance(adapters, AdaptersByPolicy) else AdaptersByPolicy(
            self.settings, adapters, base=adapters)
        self.policies = RecordedPolicies(self.settings, self.by_policy)  # each remediation's recorded policy

    @property
    def adapters(self) -> Adapters:
        """The configuration's own adapters (the sweeper's and the probe's; a step's are its policy's)."""
        return self.by_policy.base

    @adapters.setter
    def adapters(self, value: Adapters) -> None:
        self._use(value)

    # ---------------------------------------------------------------------------------- public API

    def run(self, remediation_id: int, step: str, *, due: datetime | None = None) -> FollowUp | None:
        """Run one delivery of ``step``; ``due``: the schedule it was sent for (see :class:`FollowUp`)."""
        token = f"{self.worker}:{uuid.uuid4().hex[:12]}"
        claimed = self._claim(remediation_id, Step(step), token, due=due)
        if isinstance(claimed, FollowUp) or claimed is None:
            return claimed
        inp, row_id, g = claimed

        def said(outcome: str, why: str) -> None:
            steplog.decided(inp.remediation_id, inp.node, step, attempt=inp.attempt, outcome=outcome, why=why)

        try:
            outcome: Outcome = STEPS[Step(step)](inp, g.adapters, g.steps, now=self.clock.now())
        except TransientError as exc:
            retry = self._transient(remediation_id, row_id, token, exc=exc)
            if isinstance(retry, RetryLater):
                said("retry", str(retry))
                raise retry from exc
            if Step(step) is not Step.VM_RESTART:
                said("held", retry.reason)
                # Minutes of errors from Slurm or the Kubernetes API say the dependency is down, not
                # that this node is bad: pause (lifted by the health probe), never quarantine.
                return self._hold(remediation_id, row_id, token, fault=PagedError(
                    "TransientErrorsPersisted", retry.reason, True, True,
                    "kubernetes" if Step(step) in (Step.K8S_CORDON, Step.K8S_EVICT) else "slurm"))
            said("escalate", retry.reason)
            return self._record(remediation_id, row_id, token, outcome=retry)
        except RemediationError as exc:
            if exc.scope is Scope.SYSTEM:
                said("held", f"{exc.kind}: {exc.message}")
                return self._hold(remediation_id, row_id, token, fault=PagedError.of(exc))
            # A permanent error about this node: retrying or climbing the ladder cannot fix it.
            outcome = Quarantine(f"{exc.kind}: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - nobody mapped it: hold with a page, never a verdict
            log.exception("remediation %s: %s raised an error no adapter mapped", remediation_id, step)
            said("held", f"unmapped {type(exc).__name__}")
            return self._hold(remediation_id, row_id, token, fault=PagedError.of(exc))
        said(steplog.name(outcome), steplog.why(outcome))
        return self._record(remediation_id, row_id, token, outcome=outcome)

    def sweep(self) -> list[FollowUp]:
        """Find open remediations nobody is working on (a dead worker, a lost message) and resume
        them, and take down the checks nobody waits for. Also notices the storm breaker closing when
        no step is running to notice it."""
        now = self.clock.now()
        grace = timedelta(seconds=self.settings.workflow.sweep_interval_s)
        out: list[FollowUp] = []
        with self.sessions() as s, s.begin():
            stuck = s.scalars(select(Remediation).where(
                Remediation.status.in_(OPEN_STATUSES), Remediation.next_run_at < now - grace,
                or_(Remediation.lease_until.is_(None), Remediation.lease_until < now),
            ).with_for_update(skip_locked=True).limit(1000)).all()
            for rem in stuck:
                rem.lease_owner = rem.lease_until = None
                rem.next_run_at = now + grace
                out.append(FollowUp(rem.id, rem.step, due=rem.next_run_at))  # what was sent before is superseded
            refresh_pools(s, self.governance)  # a new configuration's pools, before any event arrives
            for name in (None, *(p.name for p in self.settings.profiles)):  # latches that may auto-close
                policy = self.governance.named(name).policy
                view = cluster_view(s, now, policy.breaker_window, exclude=None, profile=name,
                                    pool_stale=policy.pool_stale)
                breaker.note(s, view, now, scope=breaker.BreakerScope(policy, profile=name),
                             actor=self.settings.actor, clock=self.clock)
        out += incidents.check_recovery(self.sessions, self.adapters, self.settings, clock=self.clock)
        # A check whose remediation was cancelled or held: finished, so the node is not left in its reservation.
        takedown.take_down(self.sessions, lambda rem: self.policies.of(rem).adapters,
                           self.settings.policy.our_reason_prefix, now=self.clock.now)
        if out:
            log.info("sweeper resumed %d remediation(s)", len(out))
        return out

    # ------------------------------------------------------------------------------------- phases

    def _claim(self, rid: int, step: Step, token: str, *,
               due: datetime | None = None) -> tuple[StepInput, int, Governed] | FollowUp | None:
        """Phase 1: check that the remediation is still open at ``step`` and nobody holds its lease,
        pass admission, choose the rung's action, take the lease and write the step row as started."""
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.status not in OPEN_STATUSES or rem.step != step:
                return None  # closed, or a stale/duplicate delivery for a step already passed
            if superseded(rem, due):
                log.debug("remediation %s: a delivery of %s due %s was superseded; dropped", rid, step, due)
                return None
            lease_until = aware(rem.lease_until)
            if lease_until is not None and lease_until > now:
                return None  # another worker is on it; it enqueues what comes next
            if self.settings.dry_run and not rem.dry_run:
                rem.dry_run = True  # however it was opened, a remediation run in dry-run is one
            g = self.policies.of(rem)  # the policy it opened with, never today's
            wf = g.settings.workflow
            if held := held_reason(rem):
                # Held by an error nobody mapped: only a human lifts it (resume or cancel).
                rem.status, rem.wait_reason = RemediationStatus.WAITING, held[:2000]
                rem.next_run_at = now + timedelta(seconds=wf.max_wait_s)
                return FollowUp(rid, step, wf.max_wait_s, due=rem.next_run_at)
            row = current_row(s, rem)
            if row is not None and too_early(row, now):
                # A second delivery (the sweeper's, say, for a task that sat in a busy queue) must
                # not retry before the Retry-After the provider asked for; the retry scheduled for
                # then (or the sweeper after it) runs the step.
                return None
            if step is Step.VM_RESTART and row is None:
                # A new machine action is admitted by counting the ones in flight and checking the gap. Two
                # claims counting at once would both see room for one more, so admissions queue on the
                # last-machine-action row: each counts only after the one before it has committed.
                lock_control(s, LAST_MACHINE_ACTION, now)
                now = self.clock.now()
            if (deferred := self._defer(s, rem, step, g=g, row=row, now=now)) is not None:
                return deferred
            _choose_action(rem, step, g, starting=row is None)
            if step is Step.RETURN and row is None and g.settings.validation.domain_check_on_return \
                    and g.settings.validation.runs_jobs:
                if (repair := repairs.hand_over(s, rem, now=now)) is not None:
                    rem.ctx = replace(rem.ctx, domain_repair=repair)
            if row is None:
                row = _start_row(s, rem, step, now=now)
            return _take_lease(rem, row, g, token=token, now=now), row.id, g

    def _defer(
        self, s: Session, rem: Remediation, step: Step, *, g: Governed, row: RemediationStep | None, now: datetime
    ) -> FollowUp | None:
        """Admission's verdict and, when it admits, an incident's hold: the follow-up to look again
        when either holds the step (logged once per hold), None when the step may run."""
        cfg, wf = g.settings, g.settings.workflow
        verdict = self._admit(s, rem, step, cfg=cfg, now=now, new_machine_action=row is None)
        held_by_incident, not_before = False, None
        if verdict.ok and (waits := incidents.hold_reason(s, rem, step, now=now, cfg=cfg.incidents,
                                                          new_machine_action=row is None)):
            verdict = replace(verdict, ok=False, reason=waits.reason)
            held_by_incident, not_before = waits.by_incident, waits.until
        if verdict.ok:
            return None
        countdown = min(wf.poll_interval_s, wf.max_wait_s)
        new_machine = row is None and step is Step.VM_RESTART
        # The hint is for the rehearsal's event loop (Celery ignores it): admission's verdict may
        # change with the cluster view; an incident's hold only when the incident closes.
        hint = Hint.INCIDENT if held_by_incident else Hint.ADMISSION_NEW_MACHINE if new_machine else Hint.ADMISSION
        attempt = row.attempt if row is not None else next_attempt(s, rem.id, step)
        if step_rows.record_gate(rem, row, verdict.reason, now=now, countdown=countdown):  # once per hold
            steplog.decided(rem.id, rem.node, step.value, attempt=attempt, outcome="gated", why=verdict.reason)
        return FollowUp(rem.id, step, countdown, hint, due=rem.next_run_at, not_before=not_before)

    def _admit(self, s: Session, rem: Remediation, step: Step, *, cfg: Settings, now: datetime,
               new_machine_action: bool) -> Admission:
        """Admission under the fleet's latch and, for a profile's remediation, its pool's latch and
        max_concurrent (its recorded policy); a remediation without a profile is admitted on the fleet
        under its recorded policy, as before profiles."""
        fleet = self.settings.policy if rem.profile is not None else cfg.policy
        view = cluster_view(s, now, fleet.breaker_window, exclude=rem.id, pool_stale=fleet.pool_stale)
        view = breaker.note(s, view, now, scope=breaker.BreakerScope(fleet, exclude=rem.id),
                            actor=self.settings.actor, clock=self.clock)
        if self.settings.cluster.fleet_latch:
            view = fleet_latched(s, view)
        pool = None
        if rem.profile is not None:
            mine = cluster_view(s, now, cfg.policy.breaker_window, exclude=rem.id, profile=rem.profile,
                                pool_stale=cfg.policy.pool_stale)
            mine = breaker.note(s, mine, now, scope=breaker.BreakerScope(cfg.policy, rem.id, rem.profile),
                                actor=self.settings.actor, clock=self.clock)
            pool = Pool(rem.profile, mine, cfg.policy)
        return admit(step, view, fleet, now=now, new_machine_action=new_machine_action, pool=pool)

    def _transient(self, rid: int, row_id: int, token: str, *, exc: TransientError) -> RetryLater | Escalate:
        return record_transient(self.sessions, self.clock.now(), self.settings.workflow,
                                attempt=Attempt(rid, row_id, token), exc=exc)

    def _record(self, rid: int, row_id: int | None, token: str, *, outcome: Outcome) -> FollowUp | None:
        """Phase 3: if the lease is still ours, release it, record the outcome's note and findings,
        and write the outcome (:meth:`_settle`)."""
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.lease_owner != token or rem.status not in OPEN_STATUSES:
                log.warning("remediation %s: lease lost before recording %s; leaving it", rid, outcome)
                return None
            row = step_row(s, row_id) if row_id is not None else None
            if row is not None and RetryState.load(row.detail).streak and not gave_up(outcome):
                # The step's call answered: a failure streak ends with any success.
                row.detail = RetryState.cleared(row.detail, keep_retry_record=True)
            rem.lease_owner = rem.lease_until = None
            rem.updated_at = now
            step = Step(rem.step)
            g = self.policies.of(rem)
            dry = bool(rem.dry_run)
            if isinstance(outcome, (Wait, Done)) and outcome.note is not None:
                note = outcome.note
                audit(s, now, self.settings.actor, action=note.action, target=rem.node, reason=note.reason,
                      detail={**note.detail, "remediation": rid, "step": step.value}, dry_run=dry)
            record_findings(s, rem, step, outcome=outcome, now=now, actor=self.settings.actor)  # its check, its hardware
            if isinstance(outcome, Done) and isinstance(outcome.detail, EvidenceDetail) and row is not None:
                self._keep(s, rem, row, items=outcome.detail.items, now=now)
            if dry:
                outcome = replace(outcome, reason=would(outcome.reason)) if isinstance(outcome, Wait) else (
                    as_dry_run(outcome))
                if row is not None:
                    row.dry_run = True
            return self._settle(s, rem, row, outcome=outcome, g=g, now=now)

    def _settle(
        self, s: Session, rem: Remediation, row: RemediationStep | None, *, outcome: Outcome, g: Governed,
        now: datetime,
    ) -> FollowUp | None:
        """Write the outcome: a wait, a hold for a human, a cancel, or a finished attempt that moves on."""
        if isinstance(outcome, Wait):
            return record_wait(rem, row, outcome, now=now)
        if isinstance(outcome, Hold):
            return hold_for_human(s, rem, row, outcome=outcome, now=now, settings=g.settings)
        if isinstance(outcome, Cancel):
            if row is not None:
                row.status, row.finished_at, row.outcome = StepStatus.DONE, now, outcome.reason[:4000]
            self._close(s, rem, Ending(RemediationStatus.CANCELLED, outcome.reason,
                                       node_healthy=outcome.node_healthy), g=g, now=now)
            return None
        if row is not None:
            _finish_row(row, outcome, now)
        if isinstance(outcome, Done):
            return self._succeeded(s, rem, outcome, g=g, now=now)
        return self._failed(s, rem, outcome, g=g, now=now)

    def _succeeded(self, s: Session, rem: Remediation, outcome: Done, *, g: Governed, now: datetime) -> FollowUp | None:
        """The step did its work: merge what it learned, then the next step on the happy path, or close."""
        step, cfg = Step(rem.step), g.settings
        rem.ctx = rem.ctx.merged(outcome.context)
        if step is Step.QUARANTINE:
            self._close(s, rem, Ending(RemediationStatus.QUARANTINED), g=g, now=now)
            return None
        if step is Step.COLLECT_EVIDENCE and rem.ctx.quarantine_reason is not None:
            return move(rem, step, Step.QUARANTINE, now=now)  # it ran before the quarantine
        site, faults, wf = g.adapters.site, cfg.policy.faults, cfg.workflow
        cls, jobs = rem.ctx.fault_class, site.validation
        action = action_at(cls, faults, wf, rung=rem.ladder, gpu_reset=jobs)
        collects = bool(evidence_plan(Occasion(cls, action, rem.id, rem.cause), cfg.evidence))
        nxt = next_on_success(step, site, acts=bool(action_rungs(cls, faults, wf, gpu_reset=jobs)),
                              resets=action == GPU_RESET, collects=collects)
        if collects and not jobs and nxt is Step.VM_RESTART:
            rem.ctx = replace(rem.ctx, no_evidence=NO_JOBS)
        if nxt is Step.DONE:
            self._close(s, rem, Ending(RemediationStatus.SUCCEEDED), g=g, now=now)
            return None
        return move(rem, step, nxt, now=now)

    def _failed(
        self, s: Session, rem: Remediation, outcome: Escalate | Quarantine, *, g: Governed, now: datetime
    ) -> FollowUp | None:
        """The step failed: climb the ladder's next rung when there is one, else quarantine."""
        step, cfg, rid, dry = Step(rem.step), g.settings, rem.id, bool(rem.dry_run)
        if step is Step.QUARANTINE:
            self._close(s, rem, Ending(RemediationStatus.FAILED, outcome.reason), g=g, now=now)
            return None
        reason = outcome.reason
        cls = rem.ctx.fault_class
        faults, wf, jobs = cfg.policy.faults, cfg.workflow, g.adapters.site.validation
        if rem.ctx.repair_request is not None:  # a re-check after a repair climbs no ladder
            reason = f"re-check after repair request #{rem.ctx.repair_request} failed: {reason}"
        elif isinstance(outcome, Escalate) and step in (Step.VM_RESTART, Step.VERIFY, Step.VALIDATE):
            if g.adapters.machine is None:
                reason = f"no machine action at this site: {reason}"
            elif rem.ladder + 1 < len(action_rungs(cls, faults, wf, gpu_reset=jobs)):
                rem.ladder += 1
                rem.action = action_at(cls, faults, wf, rung=rem.ladder, gpu_reset=jobs)
                audit(s, now, self.settings.actor, action=AuditAction.ESCALATE, target=rem.node, reason=reason,
                      detail={"remediation": rid}, dry_run=dry)
                return move(rem, step, Step.VM_RESTART, now=now)
            else:
                reason = f"ladder exhausted: {reason}"
        rem.action = "quarantine"
        rma = needs_rma(cls, cfg.policy.faults)
        if rma:  # the one place a quarantine's reason says RMA
            reason = f"{reason} (class {cls}: hardware to return, RMA)"
        rem.ctx = replace(rem.ctx, quarantine_reason=reason, rma=rma or None)
        audit(s, now, self.settings.actor, action=AuditAction.ESCALATE, target=rem.node, reason=reason,
              detail={"remediation": rid}, dry_run=dry)
        if step is not Step.COLLECT_EVIDENCE and _collects_before_quarantine(rem, cfg, g.adapters.site):
            return move(rem, step, Step.COLLECT_EVIDENCE, now=now)
        return move(rem, step, Step.QUARANTINE, now=now)

    def _keep(self, s: Session, rem: Remediation, row: RemediationStep, *, items: tuple[Item, ...],
              now: datetime) -> None:
        """Keep the evidence step's items with its row. A store that fails (a bucket unreachable) never
        loses them: each is kept in its row instead, cut at ``inline_bytes``, and the failure logged."""
        if not items:
            return
        try:
            with s.begin_nested():
                evidence.keep(s, rem, row, items=items, store=self.evidence_store, now=now)
        except RemediationError as exc:
            log.warning("remediation %s: evidence store failed (%s: %s); items kept cut in the database",
                        rem.id, exc.kind, exc.message)
            evidence.keep(s, rem, row, items=items, now=now,
                          store=EvidenceStorage(self.evidence_store.inline_bytes, None))

    def _close(self, s: Session, rem: Remediation, end: Ending, *, g: Governed, now: datetime) -> None:
        """End ``rem``; a hardware quarantine opens its repair request, and a re-check's end closes the
        request it re-checked (both in this transaction)."""
        close(s, rem, end, now=now, actor=self.settings.actor)
        if rem.ctx.repair_request is not None:
            repair_requests.recheck_closed(s, rem, now=now, actor=self.settings.actor)
        if end.status is RemediationStatus.QUARANTINED:
            repair_requests.open_on_quarantine(s, rem, cfg=self.settings.repair, lemon=g.settings.policy.lemon,
                                               now=now, actor=self.settings.actor)

    def _hold(self, rid: int, row_id: int, token: str, *, fault: PagedError) -> FollowUp | None:
        """The error is not the node's: record it on the step now, hold the remediation (and pause
        automation when it is the system's), and look again after a poll. See remediation.services.holds."""
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.lease_owner != token or rem.status not in OPEN_STATUSES:
                log.warning("remediation %s: lease lost before recording %s; leaving it", rid, fault.summary)
                return None
            row = step_row(s, row_id)
            countdown = hold(s, now, rem, row=row, fault=fault,
                             poll_s=min(self.settings.workflow.poll_interval_s,
                                                          self.settings.workflow.max_wait_s))
            return FollowUp(rid, rem.step, countdown)

    def probe(self) -> dict[str, Any]:
        """Health-probe a self-healing system pause (beat runs this); see :func:`remediation.services.holds.probe`."""

        def check(component: str, node: str) -> None:
            if component == "kubernetes":
                self.adapters.node_now(node)
            else:  # slurm, and anything that names no component: the controller answering is the test
                self.adapters.slurm.get_node(node)

        with self.sessions() as s, s.begin():
            return probe(s, self.clock.now(), check, needed=self.settings.policy.probe_successes)


def _collects_before_quarantine(rem: Remediation, cfg: Settings, site: Site) -> bool:
    """Whether the node's state is kept before its quarantine: its class is one the site chose, and
    nothing was kept since its last machine action (the state before the reboot is not the state now).
    A site that runs no job on the node keeps nothing: the remediation records why."""
    if not evidence_plan(Occasion(rem.ctx.fault_class, None, rem.id, rem.cause, quarantine=True), cfg.evidence):
        return False
    if not site.validation:
        rem.ctx = replace(rem.ctx, no_evidence=NO_JOBS)
        return False
    kept, acted = rem.ctx.evidence_at, rem.ctx.machine_action_at
    return kept is None or (acted is not None and datetime.fromisoformat(acted) >= datetime.fromisoformat(kept))


def _choose_action(rem: Remediation, step: Step, g: Governed, *, starting: bool) -> None:
    """The action the remediation's ladder takes at this site, and what the site lacks, on its record."""
    cfg, wf, site = g.settings, g.settings.workflow, g.adapters.site
    if rem.action is None or (step is Step.VM_RESTART and starting):
        # The ladder's action for its rung: class unknown (or opened by hand), or the rung now
        # starting (the action planned at open may be one this site skips: gpu-reset, no jobs).
        rem.action = "quarantine" if step is Step.QUARANTINE else action_at(
            rem.ctx.fault_class, cfg.policy.faults, wf, rung=rem.ladder,
            gpu_reset=site.validation)
    rem.action = action_here(rem.action, site, wf)
    rem.ctx = rem.ctx.merged(lacks(site))  # the record says what this site lacks


def _start_row(s: Session, rem: Remediation, step: Step, *, now: datetime) -> RemediationStep:
    """A new attempt's step row; a machine action's start is also the last machine action's time."""
    rid = rem.id
    attempt = next_attempt(s, rid, step)
    row = new_row(rid, step, attempt, now=now, dry_run=bool(rem.dry_run))
    s.add(row)
    if step is Step.VM_RESTART:
        control_set(s, LAST_MACHINE_ACTION, LastMachineAction(at=now.isoformat(), remediation=rid).dump(), now=now)
    s.flush()
    return row


def _take_lease(rem: Remediation, row: RemediationStep, g: Governed, *, token: str, now: datetime) -> StepInput:
    """Lease the remediation to ``token``, mark it running, and read what the step function gets."""
    held_time = HeldTime.load(row.detail).resumed(now)
    if held_time.held_s:
        row.detail = {**(row.detail or {}), **held_time.dump()}
    rem.lease_owner, rem.lease_until = token, now + timedelta(seconds=g.settings.workflow.lease_s)
    rem.next_run_at = rem.lease_until
    rem.status, rem.wait_reason, rem.updated_at = RemediationStatus.RUNNING, None, now
    return StepInput(
        remediation_id=rem.id, node=rem.node, cause=rem.cause, ladder=rem.ladder,
        context=rem.ctx, key=row.idempotency_key, attempt=row.attempt,
        started_at=aware(row.started_at) or now, checks=row.checks,
        provider_op=dict(row.provider_op) if row.provider_op else None, detail=dict(row.detail or {}),
        source=rem.source, held_s=held_time.held_s,
    )


def _finish_row(row: RemediationStep, outcome: Done | Escalate | Quarantine, now: datetime) -> None:
    """Close the attempt's step row: done with its outcome and detail, or failed with its error."""
    row.finished_at = now
    row.status = StepStatus.DONE if isinstance(outcome, Done) else StepStatus.FAILED
    if isinstance(outcome, Done):
        row.outcome = outcome.outcome[:4000]
    else:
        row.error, row.error_kind = outcome.reason[:4000], type(outcome).__name__
    if isinstance(outcome, Done | Escalate):
        row.detail = {**(row.detail or {}), **dumped(outcome.detail)}


def superseded(rem: Remediation, due: datetime | None) -> bool:
    """Was the remediation scheduled anew since this delivery was sent for ``due``? Then another
    delivery (a later poll, the sweeper's re-send) is the one that counts, and this one is dropped."""
    if due is None or rem.next_run_at is None:
        return False
    return abs((aware(rem.next_run_at) - aware(due)).total_seconds()) >= SAME_DUE_S
