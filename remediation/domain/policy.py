"""Policy: pure decisions, with the clock and every fact passed in.

``decide``: what one event means for its node (record only, attributed, superseded, open a
remediation, quarantine a repeat offender, or recovered); every unhealthy signal is explained before
it is counted. ``admit``: may a step act *now*, given pause, the storm breaker, ``max_concurrent``
and the minimum gap. Nothing here touches a database or a network; the rehearsal runs the same
functions.

Why: docs/architecture.md#admission
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

from remediation.domain import slurm_states
from remediation.domain.attribution import Condition, Window, own_cause, superseded
from remediation.domain.causes import Cause, FaultScope, classify, table
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.lemon import Failure, score
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import QUARANTINE_STATUSES, NodeStatus, Step
from remediation.settings import PolicySettings


class Clock(Protocol):
    def now(self) -> datetime: ...


class DecisionKind(StrEnum):
    RECORD = "record"  # keep the event, do nothing
    OPEN = "open"  # open a remediation
    QUARANTINE = "quarantine"  # repeat offender: open straight into quarantine
    RECOVERED = "recovered"  # an unhealthy (not remediating) node is healthy again
    ATTRIBUTED = "attributed"  # caused by our own remediation: recorded, never opens, never counts
    SUPERSEDED = "superseded"  # a newer healthy observation of the same condition: acts on nothing
    APP_XID = "app_xid"  # an application-level XID, not (yet) a node fault: recorded, counted for repeats
    DOMAIN = "domain"  # a fault of the node's NVLink domain, or its domain is under repair: the domain's repair has it


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    reason: str
    remediation: int | None = None  # the remediation the event is evidence of (attributed, or under it)
    cause: Cause | None = None  # the fault's class and why (open, quarantine, app_xid)
    # The echo of our own drain (a reason carrying our prefix): recorded, and never changes what we
    # think of the node.
    our_own: bool = False


@dataclass(frozen=True)
class NodeView:
    """What ``decide`` needs to know about the event's node."""

    status: NodeStatus = NodeStatus.HEALTHY
    open_remediation: int | None = None
    # Fault episodes of this node since max(now - W, last human release), this failure excluded.
    recent_failures: int = 0
    # The node's latest remediation (open, or closed): what its own actions may explain.
    window: Window | None = None
    # The latest healthy observation of each condition (source, type) the node has reported.
    healthy: Mapping[Condition, datetime] = field(default_factory=dict)
    # Application-level XIDs recorded on this node within policy.faults.app_xid_repeat_window_s.
    app_xids: int = 0
    # Real failures since the last human release, for the lemon score (remediation.domain.lemon).
    history: Sequence[Failure] = ()
    # The trays of the node's NVLink domain (1: it is in none), and why its signals join the running
    # repair of that domain (None: none runs).
    domain_size: int = 1
    domain_repair: str | None = None




def slurm_bad_states(policy: PolicySettings) -> frozenset[str]:
    """A Slurm state holding any of these is not a healthy observation (see attribution)."""
    return slurm_states.BAD | {s.upper() for s in policy.slurm_states}
OUR_OWN = "our own drain"  # the reason recorded for the echo of our own action (Decision.our_own)


@lru_cache(maxsize=64)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


def ignored_reason(reason: str, policy: PolicySettings) -> str | None:
    """The ignore-list pattern a human's reason matches, if any."""
    for pattern in _compiled(tuple(policy.ignore_reasons)):
        if pattern.search(reason):
            return pattern.pattern
    return None


def decide(event: NodeEvent, node: NodeView, policy: PolicySettings) -> Decision:
    if event.kind is EventKind.INVENTORY:
        return Decision(DecisionKind.RECORD, "inventory")
    if event.kind is EventKind.DOMAINS:
        return Decision(DecisionKind.RECORD, "failure domains learnt")
    if event.kind is EventKind.LABELS:
        return Decision(DecisionKind.RECORD, "labels learnt")
    if event.kind is EventKind.HEALTHY:
        return _decide_healthy(node)
    if node.status in QUARANTINE_STATUSES:
        return Decision(DecisionKind.RECORD, "node is quarantined until a human releases it")
    ours = own_cause(event, node.window, policy.our_reason_prefix, settle=timedelta(seconds=policy.settle_s))
    if ours is not None:
        return Decision(DecisionKind.ATTRIBUTED, ours, node.window.id if node.window else None)
    if node.open_remediation is not None:
        return Decision(DecisionKind.RECORD, f"already under remediation #{node.open_remediation}",
                        node.open_remediation)
    if event.reason.startswith(policy.our_reason_prefix):
        return Decision(DecisionKind.RECORD, OUR_OWN, our_own=True)
    if not _remediable_state(event, policy):
        return Decision(DecisionKind.RECORD, f"{event.source} state {event.state} is not remediated")
    if event.source is not Source.MANUAL and (pattern := ignored_reason(event.reason, policy)):
        return Decision(DecisionKind.RECORD, f"human reason matches ignore list ({pattern}); left alone")
    if (why := superseded(event, node.healthy)) is not None:
        return Decision(DecisionKind.SUPERSEDED, why)
    if node.domain_repair is not None:  # the domain's ladder acts for every tray: this signal opens nothing
        return Decision(DecisionKind.DOMAIN, node.domain_repair)
    cause = classify(event.source, event.state, event.reason, tbl=table(policy.faults),
                     domain_size=node.domain_size) if policy.faults.classify else None
    if cause is not None and cause.scope is FaultScope.DOMAIN:  # not the tray's: it counts against no tray
        return Decision(DecisionKind.DOMAIN, f"a fault of its NVLink domain: {cause.evidence}", cause=cause)
    if cause is not None and cause.app_level and event.source is not Source.MANUAL:
        seen, limit = node.app_xids + 1, policy.faults.app_xid_repeat_count
        within = _human(timedelta(seconds=policy.faults.app_xid_repeat_window_s))
        if seen < limit:
            return Decision(DecisionKind.APP_XID, f"not a node fault: {cause.evidence} ({seen} of {limit} within "
                            f"{within} before it is remediated)", cause=cause)
        cause = replace(cause, evidence=f"{cause.evidence}, {seen} times within {within}")
    failures = node.recent_failures + 1
    if failures >= policy.repeat_offender_count:
        return Decision(
            DecisionKind.QUARANTINE,
            f"repeat offender: {failures} failures within "
            f"{_human(policy.repeat_offender_window)} (limit {policy.repeat_offender_count})", cause=cause,
        )
    if policy.lemon.enabled:
        mine = Failure(event.observed_at, cause.fault_class if cause else None)
        lemon = score([*node.history, mine], event.observed_at, policy.lemon)
        if lemon.over(policy.lemon):
            return Decision(DecisionKind.QUARANTINE, f"lemon: {lemon.explanation}", cause=cause)
    return Decision(DecisionKind.OPEN, _cause(event), cause=cause)


def _decide_healthy(node: NodeView) -> Decision:
    if node.status in QUARANTINE_STATUSES:
        return Decision(DecisionKind.RECORD, "node is quarantined until a human releases it")
    if node.open_remediation is not None:
        return Decision(DecisionKind.RECORD, "under remediation; verify decides when it is healthy",
                        node.open_remediation)
    if node.status is NodeStatus.UNHEALTHY:
        return Decision(DecisionKind.RECOVERED, "node reported healthy")
    return Decision(DecisionKind.RECORD, "healthy")


def _remediable_state(event: NodeEvent, policy: PolicySettings) -> bool:
    if event.source is Source.MANUAL:
        return True
    if event.source is Source.SLURM:
        wanted = {s.upper() for s in policy.slurm_states}
        states = slurm_states.named(event.state)
        if SlurmState.DRAIN in wanted:
            wanted |= slurm_states.DRAINED
        if SlurmState.FAIL in wanted:
            wanted |= slurm_states.FAILED
        return bool(states & wanted)
    return event.state in policy.kube_conditions


def _cause(event: NodeEvent) -> str:
    text = f"{event.source} {event.state}"
    return f"{text}: {event.reason}" if event.reason else text


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds}s"


# ---------------------------------------------------------------------------------------- admission


@dataclass(frozen=True)
class ClusterView:
    """Cluster-wide facts for admission, read in the same transaction as the step."""

    paused: bool
    pool_size: int
    failed_in_window: int  # distinct nodes with a remediation opened within the breaker window
    machine_active: int  # remediations (other than this one) with a machine action in flight or verifying
    last_machine_action_at: datetime | None
    pause_reason: str = ""  # who paused automation and why (a human, or the system on a fault of ours)
    breaker_latched: bool = False  # the storm breaker is open until a human closes it (remediation.services.breaker)
    breaker_reason: str = ""  # why it opened
    last_failure_at: datetime | None = None  # the latest real (not dry-run) remediation opened


@dataclass(frozen=True)
class Admission:
    ok: bool
    reason: str = ""


def breaker_open(view: ClusterView, policy: PolicySettings) -> bool:
    """Does the window trip the breaker now? (Once tripped it latches; see :func:`breaker_holds`.)"""
    if view.failed_in_window < policy.breaker_min_failures or view.pool_size <= 0:
        return False
    return view.failed_in_window / view.pool_size > policy.breaker_max_fraction


def breaker_holds(view: ClusterView, policy: PolicySettings) -> bool:
    """Latched open, or tripped by the window right now."""
    return view.breaker_latched or breaker_open(view, policy)


def breaker_may_auto_close(view: ClusterView, policy: PolicySettings, now: datetime) -> bool:
    """Opt-in (``policy.breaker_auto_close_s``): the window no longer trips it and no node has failed
    for that long. Off by default: only a human can tell a storm that is over from a quiet fault."""
    quiet = policy.breaker_auto_close_s
    if quiet is None or not view.breaker_latched or breaker_open(view, policy):
        return False
    return view.last_failure_at is None or (now - view.last_failure_at).total_seconds() >= quiet


def breaker_text(view: ClusterView, policy: PolicySettings, profile: str | None = None) -> str:
    whose, flag = ("", "") if profile is None else (f"profile {profile}'s ", f" --profile {profile}")
    if view.breaker_latched:
        return (f"{whose}storm breaker open ({view.breaker_reason}); it stays open until a human closes it: "
                f"remediation breaker close{flag} -r REASON")
    return (f"{whose}storm breaker open: {view.failed_in_window}/{view.pool_size} nodes failed within "
            f"{_human(policy.breaker_window)} (limit {policy.breaker_max_fraction:.0%})")


@dataclass(frozen=True)
class Pool:
    """A profile's own share of admission: the view of the nodes it governs and its policy. Its storm
    breaker holds its pool's disruptive steps beside the fleet's, and its max_concurrent counts its
    own machine actions; the fleet's latch and the minimum gap stay above every pool."""

    profile: str
    view: ClusterView
    policy: PolicySettings


# Disruptive steps: stopped by the breaker. Draining in Slurm and cordoning stay allowed (safe).
BREAKER_STEPS = frozenset({Step.K8S_EVICT, Step.COLLECT_EVIDENCE, Step.VM_RESTART})


def admit(step: Step, view: ClusterView, policy: PolicySettings, *, now: datetime, new_machine_action: bool,
          pool: Pool | None = None) -> Admission:
    """May ``step`` act now? ``new_machine_action`` is true only when vm_restart would start an action
    (polling an operation already started is always allowed, or a restart could never finish).
    ``pool``: the step's remediation belongs to a profile (see :class:`Pool`)."""
    if view.paused:
        return Admission(False, f"automation is paused: {view.pause_reason}" if view.pause_reason else "automation is paused")
    if step in BREAKER_STEPS and (step is not Step.VM_RESTART or new_machine_action):
        if breaker_holds(view, policy):
            return Admission(False, breaker_text(view, policy))
        if pool is not None and breaker_holds(pool.view, pool.policy):
            return Admission(False, breaker_text(pool.view, pool.policy, pool.profile))
    if step is Step.VM_RESTART and new_machine_action:
        active, limit = ((pool.view.machine_active, pool.policy.max_concurrent) if pool
                         else (view.machine_active, policy.max_concurrent))
        if active >= limit:
            whose = f" in profile {pool.profile}" if pool else ""
            return Admission(False, f"max_concurrent reached{whose} ({active}/{limit} machine actions)")
        if view.last_machine_action_at is not None:
            due = view.last_machine_action_at + timedelta(seconds=policy.min_restart_gap_s)
            if now < due:
                return Admission(False, f"minimum gap between machine actions ({policy.min_restart_gap_s:g}s)")
    return Admission(True)


def count_in_window(times: Sequence[datetime], now: datetime, window: timedelta) -> int:
    """How many of ``times`` fall within (now - window, now]."""
    start = now - window
    return sum(1 for t in times if start < t <= now)
