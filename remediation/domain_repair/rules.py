"""The domain ladder: what one repair of a whole NVLink domain does next, and when it may act. Pure.

A domain fault (an SXID, an NVSwitch or fabric manager error, IMEX down, NVLink faults on many trays)
opens one repair of the domain, never one remediation per tray: drain every tray, wait for their jobs,
restart the fabric software on every tray, prove the domain with one check over all trays, power-cycle
the rack, prove it again, and quarantine it as one.

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from remediation.domain.policy import Admission, ClusterView, breaker_holds, breaker_text
from remediation.settings import PolicySettings


class DomainRepairStatus(StrEnum):
    """A domain repair (``domain_repairs.status``): running until its trays return or it quarantines."""

    RUNNING = "running"
    RETURNED = "returned"  # the domain check passed: every tray we drained is back in service
    QUARANTINED = "quarantined"  # the ladder ran out: every tray held, one page, an RMA note
    CANCELLED = "cancelled"  # a human stopped it: our drains given back


class DomainStep(StrEnum):
    """Where a domain repair is (``domain_repairs.step``, ``domain_repair_steps.step``)."""

    DRAIN = "drain"  # drain every tray in Slurm (and cordon its Node)
    JOBS = "jobs"  # wait until no job holds any tray, asking them to checkpoint first
    FABRIC_RESTART = "fabric_restart"  # restart IMEX (and the fabric manager) on every tray: a job per tray
    DOMAIN_CHECK = "domain_check"  # one check job over every tray of the domain
    CHASSIS_RESET = "chassis_reset"  # power-cycle the rack through its BMC's Chassis
    QUARANTINE = "quarantine"  # the domain is held for a human and an RMA
    RETURN = "return"  # give every tray we drained back
    DONE = "done"


#: The rungs of the ladder, in order; each is followed by the domain check but the last.
RUNGS = (DomainStep.FABRIC_RESTART, DomainStep.CHASSIS_RESET, DomainStep.QUARANTINE)
#: The steps that act on the trays' machines: a domain there counts as all its trays for max_concurrent.
MACHINE_STEPS = frozenset({DomainStep.FABRIC_RESTART, DomainStep.CHASSIS_RESET})


def ladder(*, runs_jobs: bool, chassis: bool) -> tuple[DomainStep, ...]:
    """The rungs this site can climb: the fabric restart and the domain check need a job on the trays
    (``validation.backend``); the power cycle needs the rack's chassis in the inventory and a check to
    prove it worked. Without a job nothing can prove a domain: it is quarantined for a human at once."""
    if not runs_jobs:
        return (DomainStep.QUARANTINE,)
    rungs = [DomainStep.FABRIC_RESTART]
    if chassis:
        rungs.append(DomainStep.CHASSIS_RESET)
    return (*rungs, DomainStep.QUARANTINE)


@dataclass(frozen=True)
class Next:
    """The step a repair goes to, and the rung of its ladder it is on."""

    step: DomainStep
    rung: int


def after(step: DomainStep, *, ok: bool, rung: int, rungs: tuple[DomainStep, ...]) -> Next:
    """The step after ``step`` ended (``ok``: it did what it was for: the trays drained, the jobs gone,
    every restart job passed, the chassis came back, the domain check passed)."""
    if step is DomainStep.DRAIN:
        return Next(DomainStep.JOBS, rung)
    if step is DomainStep.JOBS:  # not ok: nobody can tell whether a job still runs there, so nothing acts
        return Next(rungs[0], 0) if ok else Next(DomainStep.QUARANTINE, len(rungs) - 1)
    if step in MACHINE_STEPS:
        return Next(DomainStep.DOMAIN_CHECK, rung) if ok else _climb(rung, rungs)
    if step is DomainStep.DOMAIN_CHECK:
        return Next(DomainStep.RETURN, rung) if ok else _climb(rung, rungs)
    return Next(DomainStep.DONE, rung)


def _climb(rung: int, rungs: tuple[DomainStep, ...]) -> Next:
    up = min(rung + 1, len(rungs) - 1)
    return Next(rungs[up], up)


def admit_domain(view: ClusterView, policy: PolicySettings, *, trays: int, now: datetime) -> Admission:
    """May a domain start a machine action on its ``trays`` now? It counts as all of them: with other
    machine actions in flight it waits until they and it fit in ``max_concurrent``; alone it may go even
    when it is larger (an NVL72 rack has 18 trays), or it could never be repaired. The storm breaker,
    the pause and the minimum gap hold it as they hold a node."""
    if view.paused:
        return Admission(False, f"automation is paused: {view.pause_reason}" if view.pause_reason
                         else "automation is paused")
    if breaker_holds(view, policy):
        return Admission(False, breaker_text(view, policy))
    active, limit = view.machine_active, policy.max_concurrent
    if active and active + trays > limit:
        return Admission(False, f"max_concurrent reached ({active}/{limit} machine actions; the domain's "
                         f"action counts as its {trays} trays)")
    if view.last_machine_action_at is not None:
        due = view.last_machine_action_at + timedelta(seconds=policy.min_restart_gap_s)
        if now < due:
            return Admission(False, f"minimum gap between machine actions ({policy.min_restart_gap_s:g}s)")
    return Admission(True)


def joins(kind: str, name: str, repair: int) -> str:
    """The decision a tray's signal gets when its domain is being repaired: it opens nothing."""
    return f"joined domain repair #{repair} ({kind} {name}): the domain's ladder runs for every tray"


def drain_reason(prefix: str, repair: int, *, kind: str, name: str) -> str:
    """Our Slurm reason on every tray of a domain under repair."""
    return f"{prefix} domain repair #{repair} ({kind} {name})"


def quarantine_reason(prefix: str, repair: int, *, kind: str, name: str, cause: str) -> str:
    """The Slurm reason on every tray of a quarantined domain: hold for a human, and the RMA."""
    return f"{prefix} quarantined: NVLink domain {kind} {name} (repair #{repair}, {cause}); RMA the domain"
