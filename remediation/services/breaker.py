"""The latching storm breaker: once open, it stays open until a human closes it.

A sliding window alone only delays: when the window slides past a correlated fault (a leaf switch, a
detector bug, an apiserver partition), every held remediation would go on to its VM action within
seconds, and the pool would be rebooted in batches of ``max_concurrent``. So opening is latched in the
``breaker`` control row ({"open": true, "reason", "at", "failed", "pool"}), and only these close it:

- a human, ``remediation breaker close -r REASON`` (or the API / dashboard button), audited;
- opt-in, ``policy.breaker_auto_close_s``: the window no longer trips it and no node has failed for
  that long (audited as the system's own action).

On close, every remediation that has not yet started a VM action is marked ``reconfirm``: before its
next disruptive step it checks its trigger against the live state (``steps.healthy_again``). Nodes that
are healthy again are cancelled with our drain and cordon given back; nodes still bad proceed. Failures
before the close no longer count toward the breaker (``closed_at`` bounds its window), so a human's close
is not undone by the very storm they just looked at.

While open, nodes are still drained and cordoned (safe steps); admission keeps eviction and VM actions waiting.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.models import Remediation
from remediation.db.queries import BREAKER, cluster_view, control_get, control_set, lock_control
from remediation.domain.controls import BreakerLatch
from remediation.domain.policy import Clock, ClusterView, breaker_may_auto_close, breaker_open
from remediation.domain.statemachine import OPEN_STATUSES, Step
from remediation.services.audit import audit
from remediation.settings import PolicySettings

# Steps at which a remediation has not yet acted disruptively (vm_restart only until its action starts,
# which healthy_again checks by itself).
HELD_STEPS = (Step.SLURM_DRAIN, Step.K8S_CORDON, Step.K8S_EVICT, Step.VM_RESTART)


def state(s: Session) -> dict[str, Any]:
    """The latch as stored: {} or {"open": bool, "reason", "at", "closed_at", "closed_by", ...}."""
    return control_get(s, BREAKER)


def open_latch(s: Session, now: datetime, actor: str, failed: int, pool: int, reason: str) -> bool:
    """Latch the breaker open; False when it already was (recorded once however many workers see it)."""
    current = BreakerLatch.load(lock_control(s, BREAKER, now))
    if current.open:
        return False
    value = replace(current, open=True, reason=reason, at=now.isoformat(), failed=failed, pool=pool)
    control_set(s, BREAKER, value.dump(), now)
    audit(s, now, actor, "breaker_open", "", reason, {"failed": failed, "pool": pool, "open": True})
    return True


def close_latch(s: Session, now: datetime, actor: str, reason: str) -> list[int] | None:
    """Close the breaker and mark the held remediations to re-confirm; None when it was not open."""
    current = BreakerLatch.load(lock_control(s, BREAKER, now))
    if not current.open:
        return None
    held = list(s.scalars(
        select(Remediation).where(Remediation.status.in_(OPEN_STATUSES), Remediation.step.in_(HELD_STEPS))
        .with_for_update()
    ))
    for rem in held:
        rem.ctx = replace(rem.ctx, reconfirm=True)
        rem.next_run_at, rem.updated_at = now, now
    value = BreakerLatch(open=False, closed_at=now.isoformat(), closed_by=actor, close_reason=reason,
                         opened_at=current.at, open_reason=current.reason)
    control_set(s, BREAKER, value.dump(), now)
    audit(s, now, actor, "breaker_closed", "", reason,
          {"open": False, "was": current.reason, "reconfirm": [r.id for r in held]})
    return [r.id for r in held]


def closed_at(value: dict[str, Any]) -> datetime | None:
    return BreakerLatch.load(value).closed


def note(s: Session, view: ClusterView, now: datetime, exclude: int | None, policy: PolicySettings, actor: str,
         clock: Clock) -> ClusterView:
    """Latch the breaker open when the window trips it, and (opt-in) close it after a quiet period.
    Exactly once however many workers notice: the common case (no change) costs no lock; a change
    queues the claims on the breaker row, and only the first records it (one audit row, so on-call is
    paged once). Returns the view to admit on; a claim leaves its own remediation out (``exclude``)."""
    if not view.breaker_latched and breaker_open(view, policy):
        lock_control(s, BREAKER, now)
        now = clock.now()
        view = cluster_view(s, now, policy.breaker_window, exclude)
        if not view.breaker_latched and breaker_open(view, policy):
            reason = (f"{view.failed_in_window}/{view.pool_size} nodes failed within "
                      f"{policy.breaker_window_s}s (limit {policy.breaker_max_fraction:.0%})")
            open_latch(s, now, actor, view.failed_in_window, view.pool_size, reason)
            view = cluster_view(s, now, policy.breaker_window, exclude)
    elif breaker_may_auto_close(view, policy, now):
        quiet = f"no node failed for {policy.breaker_auto_close_s:g}s (policy.breaker_auto_close_s)"
        close_latch(s, now, actor, f"auto-close: {quiet}")
        view = cluster_view(s, now, policy.breaker_window, exclude)
    return view
