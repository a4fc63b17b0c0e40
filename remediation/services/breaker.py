"""The latching storm breaker: once open, it stays open until a human closes it.

Opening is latched in the ``breaker`` control row. Only a human (``remediation breaker close -r
REASON``, the API or the dashboard, audited) or, opt-in, ``policy.breaker_auto_close_s`` closes it. On
close, every remediation that has not started a machine action re-confirms its trigger before its next
disruptive step. Each profile has its own latch (row ``breaker:NAME``) over its pool.

Why: docs/policy.md#storm-breaker-more-than-10-of-the-pool-within-10-minutes-at-least-3-nodes
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from remediation.db.models import Control, Remediation
from remediation.db.queries import BREAKER, breaker_key, cluster_view, control_get, control_set, lock_control
from remediation.domain.controls import BreakerLatch
from remediation.domain.policy import Clock, ClusterView, breaker_may_auto_close, breaker_open
from remediation.domain.statemachine import OPEN_STATUSES, Step
from remediation.domain.states import AuditAction
from remediation.services.audit import audit
from remediation.settings import PolicySettings

# Steps at which a remediation has not yet acted disruptively (vm_restart only until its action starts,
# which healthy_again checks by itself).
HELD_STEPS = (Step.SLURM_DRAIN, Step.K8S_CORDON, Step.K8S_EVICT, Step.VM_RESTART)


def state(s: Session, profile: str | None = None) -> dict[str, Any]:
    """The latch as stored: {} or {"open": bool, "reason", "at", "closed_at", "closed_by", ...}."""
    return control_get(s, breaker_key(profile))


def latches(s: Session) -> dict[str | None, dict[str, Any]]:
    """Every latch ever stored: the fleet's (None) and each profile's."""
    rows = s.execute(select(Control.key, Control.value).where(
        or_(Control.key == BREAKER, Control.key.startswith(f"{BREAKER}:")))).all()
    return {(None if key == BREAKER else key.split(":", 1)[1]): value for key, value in rows}


def open_latch(s: Session, now: datetime, actor: str, *, view: ClusterView, reason: str,
               profile: str | None = None) -> bool:
    """Latch the breaker open on what ``view`` counts; False when it already was (recorded once however
    many workers see it)."""
    failed, pool = view.failed_in_window, view.pool_size
    current = BreakerLatch.load(lock_control(s, breaker_key(profile), now))
    if current.open:
        return False
    value = replace(current, open=True, reason=reason, at=now.isoformat(), failed=failed, pool=pool)
    control_set(s, breaker_key(profile), value.dump(), now=now)
    whose = {"profile": profile} if profile is not None else {}
    audit(s, now, actor, action=AuditAction.BREAKER_OPEN, target="", reason=reason, detail={"failed": failed,
        "pool": pool, "open": True, **whose})
    return True


def close_latch(s: Session, now: datetime, actor: str, *, reason: str,
                profile: str | None = None) -> list[int] | None:
    """Close the breaker (the fleet's, or ``profile``'s) and mark the remediations it held to re-confirm;
    None when it was not open."""
    current = BreakerLatch.load(lock_control(s, breaker_key(profile), now))
    if not current.open:
        return None
    mine = [Remediation.profile == profile] if profile is not None else []
    held = list(s.scalars(
        select(Remediation).where(Remediation.status.in_(OPEN_STATUSES), Remediation.step.in_(HELD_STEPS), *mine)
        .with_for_update()
    ))
    for rem in held:
        rem.ctx = replace(rem.ctx, reconfirm=True)
        rem.next_run_at, rem.updated_at = now, now
    value = BreakerLatch(open=False, closed_at=now.isoformat(), closed_by=actor, close_reason=reason,
                         opened_at=current.at, open_reason=current.reason)
    control_set(s, breaker_key(profile), value.dump(), now=now)
    whose = {"profile": profile} if profile is not None else {}
    audit(s, now, actor, action=AuditAction.BREAKER_CLOSED, target="", reason=reason,
          detail={"open": False, "was": current.reason, "reconfirm": [r.id for r in held], **whose})
    return [r.id for r in held]


def closed_at(value: dict[str, Any]) -> datetime | None:
    return BreakerLatch.load(value).closed


@dataclass(frozen=True)
class BreakerScope:
    """Which latch a view is noted on: the fleet's (``profile`` None) or a profile's pool's, under
    ``policy``; the view leaves out the claiming remediation (``exclude``)."""

    policy: PolicySettings
    exclude: int | None = None
    profile: str | None = None


def note(s: Session, view: ClusterView, now: datetime, *, scope: BreakerScope, actor: str,
         clock: Clock) -> ClusterView:
    """Latch the breaker open when the window trips it, and (opt-in) close it after a quiet period.
    Exactly once however many workers notice: the common case (no change) costs no lock; a change
    queues the claims on the breaker row, and only the first records it (one audit row, so on-call is
    paged once). Returns the view to admit on; a claim leaves its own remediation out (``exclude``).
    ``scope.profile``: the view is that profile's pool, and so is the latch."""
    policy, exclude, profile = scope.policy, scope.exclude, scope.profile
    if not view.breaker_latched and breaker_open(view, policy):
        lock_control(s, breaker_key(profile), now)
        now = clock.now()
        view = cluster_view(s, now, policy.breaker_window, exclude=exclude, profile=profile,
                            pool_stale=policy.pool_stale)
        if not view.breaker_latched and breaker_open(view, policy):
            whose = f"profile {profile}: " if profile is not None else ""
            reason = (f"{whose}{view.failed_in_window}/{view.pool_size} nodes failed within "
                      f"{policy.breaker_window_s}s (limit {policy.breaker_max_fraction:.0%})")
            open_latch(s, now, actor, view=view, reason=reason, profile=profile)
            view = cluster_view(s, now, policy.breaker_window, exclude=exclude, profile=profile,
                                pool_stale=policy.pool_stale)
    elif breaker_may_auto_close(view, policy, now):
        quiet = f"no node failed for {policy.breaker_auto_close_s:g}s (policy.breaker_auto_close_s)"
        close_latch(s, now, actor, reason=f"auto-close: {quiet}", profile=profile)
        view = cluster_view(s, now, policy.breaker_window, exclude=exclude, profile=profile,
                            pool_stale=policy.pool_stale)
    return view
