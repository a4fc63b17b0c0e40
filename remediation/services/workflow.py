"""The workflow engine: runs one step of one remediation, crash-safely, in three phases.

1. **Claim** (transaction 1): lock the remediation row, check that it is still open and still at this
   step (a stale or duplicate delivery stops here), ask admission (pause, storm breaker, concurrency,
   gap), take a lease, and write the step row as ``started`` with its idempotency key. Commit.
2. **Act** (no transaction): call the step function, which calls an adapter at most once or twice.
3. **Record** (transaction 2): if the lease is still ours, write ``done``/``waiting``/``failed`` with
   the outcome, the provider operation and any error, move the state machine, and release the lease.
   Commit, and only then return the follow-up for the caller to enqueue.

A worker killed in phase 2 leaves a ``started`` row and a lease that expires; the sweeper (or the
redelivered task) runs the step again with the *same* idempotency key, and the adapters' contract
(idempotent writes; a VM start with a used key does not act again) makes the repeat harmless. For
vm_restart the provider operation is recorded before anyone waits on it, so a redelivered task resumes
polling that operation and never issues a second restart.

Transient errors are recorded on the step row (with the time the retry is due) and raised as
:class:`RetryLater` carrying the backoff (honouring Retry-After); the Celery task turns it into
``self.retry``. A delivery that claims the step before that time (a duplicate) is dropped. The step row
is the one retry counter: its failure streak (errors in a row since the last success) sets the backoff
and decides when to give up (:func:`failing_too_long`); Celery's own retry count plays no part.

Every step's decision is logged with its five fields (:mod:`remediation.services.steplog`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.models import Node, Remediation, RemediationStep
from remediation.db.queries import (
    BREAKER,
    LAST_VM_ACTION,
    cluster_view,
    control_set,
    lock_control,
    remediation_locked,
    step_row,
)
from remediation.domain.causes import action_at, needs_rma, vm_rungs
from remediation.domain.controls import LastVMAction
from remediation.domain.outcomes import Hold, StepSettings
from remediation.domain.policy import Clock, ClusterView, admit, breaker_may_auto_close, breaker_open
from remediation.domain.statemachine import (
    OPEN_STATUSES,
    NodeStatus,
    RemediationStatus,
    Step,
    check_transition,
    next_on_success,
)
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
from remediation.domain.stepdetail import RetryState
from remediation.ports.dispatch import FollowUp, Hint
from remediation.ports.errors import RemediationError, Scope, TransientError
from remediation.services import breaker, incidents, steplog
from remediation.services.audit import audit, would
from remediation.services.holds import PagedError, held_reason, hold, probe
from remediation.services.validation import hold_for_human, record_validation
from remediation.settings import Settings

log = logging.getLogger(__name__)


class RetryLater(Exception):
    """A transient error was recorded; retry the task after ``countdown`` seconds."""

    def __init__(self, cause: TransientError, countdown: float) -> None:
        super().__init__(f"{cause.message} (retry in {countdown:.1f}s)")
        self.cause = cause
        self.countdown = countdown


# A step locks and reads the remediation row only: its step history (a selectin relationship, for the
# read models) is not loaded with it.
_EARLY_SLACK = timedelta(milliseconds=20)  # a timer firing a hair before its ETA is on time


def _too_early(row: RemediationStep, now: datetime) -> bool:
    """The step's last transient error set a retry time that has not come yet."""
    retry_at = RetryState.load(row.detail).retry_at
    return retry_at is not None and retry_at - _EARLY_SLACK > now


def backoff(retries: int, retry_after: float | None, base: float, cap: float) -> float:
    """Exponential backoff, never shorter than the server's Retry-After."""
    delay: float = min(cap, base * float(2 ** max(retries, 0)))
    return max(delay, float(retry_after or 0.0))


def failing_too_long(streak: int, failing_s: float, max_retries: int, budget_s: float) -> bool:
    """Give up on transient errors only when they come back to back: more than ``max_retries`` in a
    row *and* ``budget_s`` seconds without a success. Counting every error a step ever met would make a
    long operation polled through a noisy API climb the ladder while it was going well; counting only
    errors in a row would let a quick burst (short Retry-After, several calls per attempt) end a step
    that a few more seconds would have finished."""
    return streak > max_retries and failing_s >= budget_s


def _gave_up(outcome: Outcome) -> bool:
    return isinstance(outcome, Escalate) and outcome.gave_up


# The open attempt of a remediation's current step; built once, as every claim reads it.
_CURRENT_ROW = (
    select(RemediationStep)
    .where(
        RemediationStep.remediation_id == bindparam("rid"),
        RemediationStep.step == bindparam("step"),
        RemediationStep.status.in_(("started", "waiting")),
    )
    .order_by(RemediationStep.id.desc())
    .limit(1)
)


class Workflow:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        adapters: Adapters,
        settings: Settings,
        clock: Clock,
        worker: str = "worker",
    ) -> None:
        self.sessions = sessions
        self.adapters = adapters
        self.settings = settings
        self.step_settings = StepSettings.of(settings)  # all a step body may read
        self.clock = clock
        self.worker = worker

    # ---------------------------------------------------------------------------------- public API

    def run(self, remediation_id: int, step: str) -> FollowUp | None:
        token = f"{self.worker}:{uuid.uuid4().hex[:12]}"
        claimed = self._claim(remediation_id, Step(step), token)
        if isinstance(claimed, FollowUp) or claimed is None:
            return claimed
        inp, row_id = claimed

        def said(outcome: str, why: str) -> None:
            steplog.decided(inp.remediation_id, inp.node, step, inp.attempt, outcome, why)

        try:
            outcome: Outcome = STEPS[Step(step)](inp, self.adapters, self.step_settings, self.clock.now())
        except TransientError as exc:
            retry = self._transient(remediation_id, row_id, token, exc)
            if isinstance(retry, RetryLater):
                said("retry", str(retry))
                raise retry from exc
            if Step(step) is not Step.VM_RESTART:
                said("held", retry.reason)
                # Minutes of errors from Slurm or the Kubernetes API say the dependency is down, not
                # that this node is bad: pause (lifted by the health probe), never quarantine.
                return self._hold(remediation_id, row_id, token, PagedError(
                    "TransientErrorsPersisted", retry.reason, True, True,
                    "kubernetes" if Step(step) in (Step.K8S_CORDON, Step.K8S_EVICT) else "slurm"))
            said("escalate", retry.reason)
            return self._record(remediation_id, row_id, token, retry)
        except RemediationError as exc:
            if exc.scope is Scope.SYSTEM:
                said("held", f"{exc.kind}: {exc.message}")
                return self._hold(remediation_id, row_id, token, PagedError.of(exc))
            # A permanent error about this node: retrying or climbing the ladder cannot fix it.
            outcome = Quarantine(f"{exc.kind}: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - nobody mapped it: hold with a page, never a verdict
            log.exception("remediation %s: %s raised an error no adapter mapped", remediation_id, step)
            said("held", f"unmapped {type(exc).__name__}")
            return self._hold(remediation_id, row_id, token, PagedError.of(exc))
        said(steplog.name(outcome), steplog.why(outcome))
        return self._record(remediation_id, row_id, token, outcome)

    def sweep(self) -> list[FollowUp]:
        """Find open remediations nobody is working on (a dead worker, a lost message) and resume
        them. Also notices the storm breaker closing when no step is running to notice it."""
        now = self.clock.now()
        grace = timedelta(seconds=self.settings.workflow.sweep_interval_s)
        out: list[FollowUp] = []
        with self.sessions() as s, s.begin():
            stuck = s.scalars(
                select(Remediation)
                .where(
                    Remediation.status.in_(OPEN_STATUSES),
                    Remediation.next_run_at < now - grace,
                    or_(Remediation.lease_until.is_(None), Remediation.lease_until < now),
                )
                .with_for_update(skip_locked=True)
                .limit(1000)
            ).all()
            for rem in stuck:
                rem.lease_owner = rem.lease_until = None
                rem.next_run_at = now + grace
                out.append(FollowUp(rem.id, rem.step))
            self._note_breaker(s, cluster_view(s, now, self.settings.policy.breaker_window, None), now, None)
        out += incidents.check_recovery(self.sessions, self.adapters, self.settings, self.clock)
        if out:
            log.info("sweeper resumed %d remediation(s)", len(out))
        return out

    # ------------------------------------------------------------------------------------- phases

    def _claim(self, rid: int, step: Step, token: str) -> tuple[StepInput, int] | FollowUp | None:
        now = self.clock.now()
        wf = self.settings.workflow
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.status not in OPEN_STATUSES or rem.step != step:
                return None  # closed, or a stale/duplicate delivery for a step already passed
            lease_until = aware(rem.lease_until)
            if lease_until is not None and lease_until > now:
                return None  # another worker is on it; it enqueues what comes next
            if self.settings.dry_run and not rem.dry_run:
                rem.dry_run = True  # however it was opened, a remediation run in dry-run is one
            if held := held_reason(rem):
                # Held by an error nobody mapped: only a human lifts it (resume or cancel).
                rem.status, rem.wait_reason = RemediationStatus.WAITING, held[:2000]
                rem.next_run_at = now + timedelta(seconds=wf.max_wait_s)
                return FollowUp(rid, step, wf.max_wait_s)
            row = self._current_row(s, rem)
            if row is not None and _too_early(row, now):
                # A second delivery (the sweeper's, say, for a task that sat in a busy queue) must
                # not retry before the Retry-After the provider asked for; the retry scheduled for
                # then (or the sweeper after it) runs the step.
                return None
            if step is Step.VM_RESTART and row is None:
                # A new VM action is admitted by counting the ones in flight and checking the gap. Two
                # claims counting at once would both see room for one more, so admissions queue on the
                # last-VM-action row: each counts only after the one before it has committed.
                lock_control(s, LAST_VM_ACTION, now)
                now = self.clock.now()
            view = cluster_view(s, now, self.settings.policy.breaker_window, exclude=rem.id)
            view = self._note_breaker(s, view, now, exclude=rem.id)
            verdict = admit(step, view, self.settings.policy, now, new_vm_action=row is None)
            held_by_incident = False
            if verdict.ok and (waits := incidents.hold_reason(s, rem, step, now, self.settings.incidents,
                                                              new_vm_action=row is None)):
                verdict = replace(verdict, ok=False, reason=waits.reason)
                held_by_incident = waits.by_incident
            if not verdict.ok:
                countdown = min(wf.poll_interval_s, wf.max_wait_s)
                rem.status, rem.wait_reason = RemediationStatus.WAITING, verdict.reason
                rem.next_run_at, rem.updated_at = now + timedelta(seconds=countdown), now
                new_vm = row is None and step is Step.VM_RESTART
                # The hint is for the rehearsal's event loop (Celery ignores it): admission's verdict may
                # change with the cluster view; an incident's hold only when the incident closes.
                hint = Hint.INCIDENT if held_by_incident else Hint.ADMISSION_NEW_VM if new_vm else Hint.ADMISSION
                attempt = row.attempt if row is not None else self._next_attempt(s, rid, step)
                steplog.decided(rid, rem.node, step.value, attempt, "gated", verdict.reason)
                return FollowUp(rid, step, countdown, hint)
            if rem.action is None:  # class unknown (or opened by hand): the ladder's action for its rung
                rem.action = "quarantine" if step is Step.QUARANTINE else action_at(
                    rem.ctx.fault_class, self.settings.policy.faults, self.settings.workflow, rem.ladder)
            if row is None:
                attempt = self._next_attempt(s, rid, step)
                row = RemediationStep(
                    remediation_id=rid, step=step, attempt=attempt,
                    idempotency_key=f"r{rid}:{step}:{attempt}", status="started", started_at=now,
                    checks=0, retries=0, detail={}, dry_run=self.settings.dry_run,
                )
                s.add(row)
                if step is Step.VM_RESTART:
                    control_set(s, LAST_VM_ACTION, LastVMAction(at=now.isoformat(), remediation=rid).dump(), now)
                s.flush()
            rem.lease_owner, rem.lease_until = token, now + timedelta(seconds=wf.lease_s)
            rem.next_run_at = rem.lease_until
            rem.status, rem.wait_reason, rem.updated_at = RemediationStatus.RUNNING, None, now
            inp = StepInput(
                remediation_id=rid, node=rem.node, cause=rem.cause, ladder=rem.ladder,
                context=rem.ctx, key=row.idempotency_key, attempt=row.attempt,
                started_at=aware(row.started_at) or now, checks=row.checks,
                provider_op=dict(row.provider_op) if row.provider_op else None, detail=dict(row.detail or {}),
                source=rem.source,
            )
            return inp, row.id

    def _transient(self, rid: int, row_id: int, token: str, exc: TransientError) -> RetryLater | Escalate:
        """Record a transient error; retry after a backoff, or give up once the step has been failing
        back to back for longer than the budget (see :func:`failing_too_long`)."""
        now = self.clock.now()
        wf = self.settings.workflow
        with self.sessions() as s, s.begin():
            row = step_row(s, row_id)
            detail = dict(row.detail or {}) if row is not None else {}
            prior = RetryState.load(detail)
            streak, since = prior.streak + 1, prior.failing_since or now
            countdown = min(backoff(streak - 1, exc.retry_after, wf.backoff_base_s, wf.backoff_max_s), wf.max_wait_s)
            if exc.retry_after:
                countdown = max(countdown, exc.retry_after)
            if row is not None:
                row.retries = (row.retries or 0) + 1  # history: every transient error this attempt met
                row.error, row.error_kind = exc.message[:4000], exc.kind
                retry = RetryState(streak, since, exc.retry_after, now + timedelta(seconds=countdown))
                row.detail = {**detail, **retry.dump()}
            if failing_too_long(streak, (now - since).total_seconds(), wf.transient_retries, wf.transient_budget_s):
                # The lease stays ours: the caller records the escalation at once.
                return Escalate(f"gave up after {streak} transient errors in a row over "
                                f"{(now - since).total_seconds():.0f}s: {exc.message}", gave_up=True)
            rem = remediation_locked(s, rid)
            if rem is not None and rem.lease_owner == token:
                rem.lease_owner = rem.lease_until = None
                rem.next_run_at = now + timedelta(seconds=countdown)
                rem.wait_reason = f"transient error, retrying: {exc.message}"[:2000]
        return RetryLater(exc, countdown)

    def _record(self, rid: int, row_id: int | None, token: str, outcome: Outcome) -> FollowUp | None:
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.lease_owner != token or rem.status not in OPEN_STATUSES:
                log.warning("remediation %s: lease lost before recording %s; leaving it", rid, outcome)
                return None
            row = step_row(s, row_id) if row_id is not None else None
            if row is not None and RetryState.load(row.detail).streak and not _gave_up(outcome):
                # The step's call answered: a failure streak ends with any success.
                row.detail = RetryState.cleared(row.detail, keep_retry_record=True)
            rem.lease_owner = rem.lease_until = None
            rem.updated_at = now
            step = Step(rem.step)
            dry = self.settings.dry_run
            if isinstance(outcome, (Wait, Done)) and outcome.note is not None:
                note = outcome.note
                audit(s, now, self.settings.actor, note.action, rem.node, note.reason,
                      {**note.detail, "remediation": rid, "step": step.value}, dry_run=dry)
            if isinstance(outcome, Wait):
                if dry:
                    outcome = replace(outcome, reason=would(outcome.reason))
                    if row is not None:
                        row.dry_run = True
                return self._record_wait(rem, row, outcome, now)
            if dry:
                outcome = self._dry(outcome)
                if row is not None:
                    row.dry_run = True
            if step is Step.VALIDATE:
                record_validation(s, rem, outcome, now, self.settings.actor, dry)
            if isinstance(outcome, Hold):
                return hold_for_human(s, rem, row, outcome, now, self.settings)
            if isinstance(outcome, Cancel):
                if row is not None:
                    row.status, row.finished_at, row.outcome = "done", now, outcome.reason[:4000]
                self._close(s, rem, RemediationStatus.CANCELLED, now, error=outcome.reason,
                            node_healthy=outcome.node_healthy)
                return None
            if row is not None:
                row.finished_at = now
                row.status = "done" if isinstance(outcome, Done) else "failed"
                if isinstance(outcome, Done):
                    row.outcome = outcome.outcome[:4000]
                    row.detail = {**(row.detail or {}), **outcome.detail}
                else:
                    row.error, row.error_kind = outcome.reason[:4000], type(outcome).__name__
                    if isinstance(outcome, Escalate) and outcome.detail:
                        row.detail = {**(row.detail or {}), **outcome.detail}
            if isinstance(outcome, Done):
                rem.ctx = rem.ctx.merged(outcome.context)
                if step is Step.QUARANTINE:
                    self._close(s, rem, RemediationStatus.QUARANTINED, now)
                    return None
                nxt = next_on_success(step, validation=self.settings.validation.backend != "none")
                if nxt is Step.DONE:
                    self._close(s, rem, RemediationStatus.SUCCEEDED, now)
                    return None
                return self._move(rem, step, nxt, now)
            if step is Step.QUARANTINE:
                self._close(s, rem, RemediationStatus.FAILED, now, error=outcome.reason)
                return None
            reason = outcome.reason
            cls = rem.ctx.fault_class
            if isinstance(outcome, Escalate) and step in (Step.VM_RESTART, Step.VERIFY, Step.VALIDATE):
                if rem.ladder + 1 < len(vm_rungs(cls, self.settings.policy.faults, self.settings.workflow)):
                    rem.ladder += 1
                    rem.action = action_at(cls, self.settings.policy.faults, self.settings.workflow, rem.ladder)
                    audit(s, now, self.settings.actor, "escalate", rem.node, reason, {"remediation": rid},
                          dry_run=dry)
                    return self._move(rem, step, Step.VM_RESTART, now)
                reason = f"VM ladder exhausted: {reason}"
            rem.action = "quarantine"
            if needs_rma(cls, self.settings.policy.faults):  # the one place a quarantine's reason says RMA
                reason = f"{reason} (class {cls}: hardware to return, RMA)"
            rem.ctx = replace(rem.ctx, quarantine_reason=reason)
            audit(s, now, self.settings.actor, "escalate", rem.node, reason, {"remediation": rid}, dry_run=dry)
            return self._move(rem, step, Step.QUARANTINE, now)

    def _hold(self, rid: int, row_id: int, token: str, fault: PagedError) -> FollowUp | None:
        """The error is not the node's: record it on the step now, park the remediation (and pause
        automation when it is the system's), and look again after a poll. See remediation.services.holds."""
        now = self.clock.now()
        with self.sessions() as s, s.begin():
            rem = remediation_locked(s, rid)
            if rem is None or rem.lease_owner != token or rem.status not in OPEN_STATUSES:
                log.warning("remediation %s: lease lost before recording %s; leaving it", rid, fault.summary)
                return None
            row = step_row(s, row_id)
            countdown = hold(s, now, rem, row, fault, min(self.settings.workflow.poll_interval_s,
                                                          self.settings.workflow.max_wait_s))
            return FollowUp(rid, rem.step, countdown)

    def probe(self) -> dict[str, Any]:
        """Health-probe a self-healing system pause (beat runs this); see :func:`remediation.services.holds.probe`."""

        def check(component: str, node: str) -> None:
            if component == "kubernetes":
                self.adapters.kube.get(self.adapters.kube.node_for(node))
            else:  # slurm, and anything that names no component: the controller answering is the test
                self.adapters.slurm.get_node(node)

        with self.sessions() as s, s.begin():
            return probe(s, self.clock.now(), check, self.settings.policy.probe_successes)

    # ------------------------------------------------------------------------------------ helpers

    @staticmethod
    def _next_attempt(s: Session, rid: int, step: Step) -> int:
        done = s.scalar(select(func.count()).where(RemediationStep.remediation_id == rid,
                                                   RemediationStep.step == step))
        return 1 + (done or 0)

    @staticmethod
    def _current_row(s: Session, rem: Remediation) -> RemediationStep | None:
        return s.scalars(_CURRENT_ROW, {"rid": rem.id, "step": rem.step}).first()

    @staticmethod
    def _dry(outcome: Outcome) -> Outcome:
        """Dry-run rows say "would ...": nothing outside was changed (see remediation.services.audit.would)."""
        if isinstance(outcome, Done):
            return replace(outcome, outcome=would(outcome.outcome))
        if isinstance(outcome, (Cancel, Escalate, Quarantine, Hold)):
            return replace(outcome, reason=would(outcome.reason))
        return outcome

    @staticmethod
    def _record_wait(rem: Remediation, row: RemediationStep | None, w: Wait, now: datetime) -> FollowUp:
        if row is not None:
            row.status = "waiting"
            row.checks += 1
            row.outcome = w.reason[:4000]
            if w.provider_op is not None:
                row.provider_op = w.provider_op
            row.detail = {**(row.detail or {}), **w.detail}
        rem.status, rem.wait_reason = RemediationStatus.WAITING, w.reason[:2000]
        rem.next_run_at = now + timedelta(seconds=w.countdown)
        return FollowUp(rem.id, rem.step, w.countdown, Hint.WAIT)

    @staticmethod
    def _move(rem: Remediation, step: Step, nxt: Step, now: datetime) -> FollowUp:
        check_transition(step, nxt)
        rem.step, rem.status, rem.wait_reason, rem.next_run_at = nxt, RemediationStatus.RUNNING, None, now
        return FollowUp(rem.id, nxt)

    def _close(
        self, s: Session, rem: Remediation, status: RemediationStatus, now: datetime, error: str | None = None,
        node_healthy: bool = False,
    ) -> None:
        rem.status, rem.closed_at, rem.next_run_at, rem.step = status, now, None, Step.DONE
        why = rem.ctx.quarantine_reason or rem.cause
        rem.outcome = error or (why if status is RemediationStatus.QUARANTINED else status.value)
        node = s.get(Node, rem.node, with_for_update=True)
        if node is not None:
            node.updated_at = now
            if status is RemediationStatus.SUCCEEDED:
                node.status, node.status_reason = NodeStatus.HEALTHY, f"remediation #{rem.id} succeeded"
            elif node_healthy:
                node.status, node.status_reason = NodeStatus.HEALTHY, error or "healthy"
            elif status is RemediationStatus.QUARANTINED:
                node.status, node.status_reason = NodeStatus.QUARANTINED, why
                node.quarantined_at, node.quarantine_reason = now, why
            else:
                node.status, node.status_reason = NodeStatus.UNHEALTHY, f"remediation #{rem.id} {status}: {error}"
        dry = bool(rem.dry_run)
        if dry:
            rem.outcome = would(rem.outcome or "")
        audit(s, now, self.settings.actor, f"remediation_{status.value}", rem.node, rem.outcome or "",
              {"remediation": rem.id}, dry_run=dry)

    def _note_breaker(self, s: Session, view: ClusterView, now: datetime, exclude: int | None) -> ClusterView:
        """Latch the breaker open when the window trips it, and (opt-in) close it after a quiet period;
        see :mod:`remediation.services.breaker`. Exactly once however many workers notice: the common case (no
        change) costs no lock; a change queues the claims on the breaker row, and only the first records
        it (one audit row, so on-call is paged once). Returns the view to admit on."""
        policy = self.settings.policy
        if not view.breaker_latched and breaker_open(view, policy):
            lock_control(s, BREAKER, now)
            now = self.clock.now()
            view = cluster_view(s, now, policy.breaker_window, exclude)
            if not view.breaker_latched and breaker_open(view, policy):
                reason = (f"{view.failed_in_window}/{view.pool_size} nodes failed within "
                          f"{policy.breaker_window_s}s (limit {policy.breaker_max_fraction:.0%})")
                breaker.open_latch(s, now, self.settings.actor, view.failed_in_window, view.pool_size, reason)
                view = cluster_view(s, now, policy.breaker_window, exclude)
        elif breaker_may_auto_close(view, policy, now):
            quiet = f"no node failed for {policy.breaker_auto_close_s:g}s (policy.breaker_auto_close_s)"
            breaker.close_latch(s, now, self.settings.actor, f"auto-close: {quiet}")
            view = cluster_view(s, now, policy.breaker_window, exclude)
        return view
