"""Errors that are not the node's fault: pause automation, hold the remediation, page, charge nothing.

A **systemic** error pauses all automation once, with one paging audit row, and leaves the step
``started`` to run again on resume. An **unmapped** exception holds its own remediation with a page;
the same on a second node pauses automation. Neither quarantines or counts. A human's ``remediation
resume`` lifts it all; :func:`probe`, run by beat, resumes after ``policy.probe_successes`` answers.

Why: docs/architecture.md#every-error-has-a-scope-the-nodes-the-systems-or-nobody-knows
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.models import Remediation, RemediationStep
from remediation.db.queries import PAUSED, control_set, lock_control
from remediation.domain.context import Held
from remediation.domain.controls import PauseState
from remediation.domain.statemachine import OPEN_STATUSES, RemediationStatus
from remediation.domain.states import AuditAction
from remediation.domain.stepdetail import ErrorHold, HeldTime, HoldScope, RetryState
from remediation.ports.errors import SystemicError
from remediation.services import breaker
from remediation.services.audit import audit
from remediation.services.pool import membership
from remediation.services.readmodels import overview
from remediation.settings import PolicySettings

UNMAPPED = "unmapped_errors"  # control row: error kind -> the nodes it held
SYSTEM_ACTOR = "system"


@dataclass(frozen=True)
class PagedError:
    """An error the engine will not hold against the node, as it is recorded and paged."""

    kind: str  # "CredentialError", or "unmapped ValueError"
    message: str
    systemic: bool
    self_healing: bool = False
    component: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> PagedError:
        if isinstance(exc, SystemicError):
            return cls(exc.kind, exc.message, True, exc.self_healing, exc.component)
        text = str(exc) or repr(exc)
        return cls(f"unmapped {type(exc).__module__}.{type(exc).__qualname__}", text[:2000], False)

    @property
    def summary(self) -> str:
        return f"{self.kind}: {self.message}"[:2000]


def pause(s: Session, now: datetime, fault: PagedError, *, node: str, rid: int | None) -> bool:
    """Pause automation for ``fault``; returns False when it was already paused (nothing recorded, so
    on-call is paged once per outage, not once per node)."""
    if PauseState.load(lock_control(s, PAUSED, now)).paused:
        return False
    value = PauseState(
        paused=True, by=SYSTEM_ACTOR, reason=fault.summary, at=now.isoformat(), error_kind=fault.kind,
        self_healing=fault.self_healing, component=fault.component, node=node, remediation=rid, probe_ok=0,
    )
    control_set(s, PAUSED, value.dump(), now=now)
    audit(s, now, SYSTEM_ACTOR, action=AuditAction.PAUSE, target="",
          reason=f"automation paused by a fault in our own plumbing: {fault.summary}",
          detail={"system": True, "error_kind": fault.kind, "node": node, "remediation": rid})
    return True


def hold(
    s: Session, now: datetime, rem: Remediation, *, row: RemediationStep | None, fault: PagedError,
    poll_s: float,
) -> float:
    """Record ``fault`` on the step at once and hold the remediation; returns the countdown to the next
    look (admission refuses it while a pause or a hold lasts)."""
    if row is not None:
        row.error, row.error_kind = fault.message[:4000], fault.kind[:64]
        detail = RetryState.cleared(row.detail)
        scope = HoldScope.SYSTEM if fault.systemic else HoldScope.UNMAPPED
        row.detail = {**detail, **ErrorHold(scope, now).dump(),
                      **HeldTime.load(detail).holding(now).dump()}  # the step's clock stops while held
    rem.lease_owner = rem.lease_until = None
    rem.status, rem.updated_at = RemediationStatus.WAITING, now
    rem.next_run_at = now + timedelta(seconds=poll_s)
    if fault.systemic:
        rem.wait_reason = f"automation paused: {fault.summary}"[:2000]
        pause(s, now, fault, node=rem.node, rid=rem.id)
        return poll_s
    rem.ctx = replace(rem.ctx, held=Held(fault.kind, fault.message[:1000], now.isoformat(), rem.step))
    rem.wait_reason = f"held: {fault.summary} (a human decides: resume, or cancel)"[:2000]
    audit(s, now, SYSTEM_ACTOR, action=AuditAction.HOLD, target=rem.node,
          reason=f"remediation #{rem.id} held at {rem.step}: {fault.summary}",
          detail={"remediation": rem.id, "error_kind": fault.kind})
    seen = lock_control(s, UNMAPPED, now)
    nodes = sorted(set(seen.get(fault.kind, [])) | {rem.node})
    control_set(s, UNMAPPED, {**seen, fault.kind: nodes}, now=now)
    if len(nodes) >= 2:
        pause(s, now, PagedError(fault.kind, f"the same error on {', '.join(nodes[:5])}: {fault.message}", True),
              node=rem.node, rid=rem.id)
    return poll_s


def held_reason(rem: Remediation) -> str | None:
    held = rem.ctx.held
    return f"held: {held.kind}: {held.error}" if held else None


def lift_holds(s: Session, now: datetime, actor: str, *, reason: str) -> list[int]:
    """A human resumed automation: every held remediation goes on at its next look."""
    lifted = []
    rows = s.scalars(select(Remediation).where(Remediation.status.in_(OPEN_STATUSES)).with_for_update()).all()
    for rem in rows:
        if rem.ctx.held:
            rem.ctx = replace(rem.ctx, held=None)
            rem.wait_reason, rem.next_run_at, rem.updated_at = None, now, now
            lifted.append(rem.id)
            audit(s, now, actor, action=AuditAction.UNHOLD, target=rem.node, reason=reason,
                  detail={"remediation": rem.id})
    control_set(s, UNMAPPED, {}, now=now)
    return lifted


def probe(s: Session, now: datetime, check: Callable[[str, str], None], *, needed: int) -> dict[str, Any]:
    """One health probe of a self-healing system pause. ``check(component, node)`` raises while the
    component still fails. Returns the pause state after the probe."""
    state = PauseState.load(lock_control(s, PAUSED, now))
    if not (state.paused and state.by == SYSTEM_ACTOR and state.self_healing):
        return state.dump()
    try:
        check(state.component or "", state.node or "")
    except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
        state = replace(state, probe_ok=0, probe_error=str(exc)[:500], probed_at=now.isoformat())
        control_set(s, PAUSED, state.dump(), now=now)
        return state.dump()
    ok = (state.probe_ok or 0) + 1
    if ok < needed:
        state = replace(state, probe_ok=ok, probed_at=now.isoformat())
        control_set(s, PAUSED, state.dump(), now=now)
        return state.dump()
    reason = f"health probe: {state.component} answered {ok} times in a row after: {state.reason}"
    resumed = PauseState(paused=False, by=SYSTEM_ACTOR, reason=reason[:2000], at=now.isoformat()).dump()
    control_set(s, PAUSED, resumed, now=now)
    audit(s, now, SYSTEM_ACTOR, action=AuditAction.RESUME, target="", reason=reason[:2000],
          detail={"system": True})
    return resumed


def automation_status(s: Session, pool_stale: timedelta | None = None) -> dict[str, Any]:
    """``remediation status`` (and ``GET /api/v1/status``): pause, breaker, counts, the breaker's pool
    (which nodes a resync confirmed), and the remediations held for a human, each with why."""
    ov = overview(s)
    pool = membership(s, pool_stale or PolicySettings().pool_stale)
    open_rems = s.scalars(select(Remediation).where(Remediation.status.in_(OPEN_STATUSES)).order_by(Remediation.id))
    held = [{"id": x.id, "node": x.node, "step": x.step, "reason": x.wait_reason or ""}
            for x in open_rems if x.ctx.held]
    pools = {name: latch for name, latch in breaker.latches(s).items() if name is not None and latch.get("open")}
    return {"automation": ov.paused_detail or {"paused": False}, "breaker": ov.breaker_detail,
            "profile_breakers": pools, "remediations": ov.remediations_by_status, "nodes": ov.nodes_by_status,
            "held": held, "pool": asdict(pool)}
