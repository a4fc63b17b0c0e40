"""Admission at a claim: may this remediation's step act now?

A step the storm breaker holds (an eviction, a new VM action) is admitted on the fleet's view and, for a
profile's remediation, on its pool's: the counts, the latches, max_concurrent, and the breaker noted
(latched when the window trips it) on the way. Any other step (a drain, a cordon, a check) waits only
for a pause, so its claim reads the pause alone: in a mass failure hundreds of drains and cordons are
claimed at once, and counting the fleet for each would change no answer. The breaker is still latched
by the first claim it holds, and by the sweeper, before anything it holds can act.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from remediation.db.models import Remediation
from remediation.db.queries import cluster_view, pause_view
from remediation.domain.policy import BREAKER_STEPS, Admission, Clock, Pool, admit
from remediation.domain.statemachine import Step
from remediation.services import breaker
from remediation.settings import Settings


def admission(s: Session, rem: Remediation, step: Step, cfg: Settings, fleet_settings: Settings, now: datetime,
              clock: Clock, *, new_vm_action: bool) -> Admission:
    """Admission under the fleet's latch and, for a profile's remediation, its pool's latch and
    max_concurrent (its recorded policy ``cfg``); a remediation without a profile is admitted on the
    fleet under its recorded policy, as before profiles."""
    fleet = fleet_settings.policy if rem.profile is not None else cfg.policy
    if step not in BREAKER_STEPS:
        return admit(step, pause_view(s), fleet, now, new_vm_action=new_vm_action)
    actor = fleet_settings.actor
    view = cluster_view(s, now, fleet.breaker_window, exclude=rem.id)
    view = breaker.note(s, view, now, rem.id, fleet, actor, clock)
    pool = None
    if rem.profile is not None:
        mine = cluster_view(s, now, cfg.policy.breaker_window, rem.id, rem.profile)
        mine = breaker.note(s, mine, now, rem.id, cfg.policy, actor, clock, rem.profile)
        pool = Pool(rem.profile, mine, cfg.policy)
    return admit(step, view, fleet, now, new_vm_action=new_vm_action, pool=pool)
