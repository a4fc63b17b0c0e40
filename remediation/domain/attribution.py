"""Explain a signal before it is counted: our own echo, a superseded edge, or a fault.

:func:`own_cause`: did *our* action cause this signal? It is ours when the condition *began* inside
the remediation's disruption window (:class:`Window`, from its first machine action to its close) and
was *observed* no later than ``policy.settle_s`` after the close. :func:`superseded`: is this unhealthy
edge contradicted by a newer healthy observation of the same condition from the same source? Pure: the
ingest passes the facts in.

Why: docs/policy.md#every-signal-is-explained-before-it-is-counted-no-phantom-faults
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from remediation.domain import slurm_states
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import Step

# Timestamps come from several machines (watchers, workers, the kubelet). A signal we caused cannot
# begin before our action did, except by this much clock skew between those machines.
SKEW = timedelta(seconds=5)

# Slurm states our reboot produces; DOWN only with slurmctld's own reason (or none, or ours).
_REBOOT_SLURM = frozenset({SlurmState.NOT_RESPONDING, SlurmState.DOWN})
_SLURMCTLD_REASONS = frozenset({"", "not responding"})


@dataclass(frozen=True)
class Window:
    """The latest remediation of a node, as attribution needs it."""

    id: int
    opened_at: datetime
    closed_at: datetime | None = None  # None while it is open
    machine_action_at: datetime | None = None  # when its first machine action was started (None: none yet)
    machine_action: str = "vm_restart"  # the step (and action) that disturbed the node
    dry_run: bool = False  # a dry run acted on nothing, so nothing can be its echo
    quarantined: bool = False  # it reached its quarantine step: our drain reason on the node is that step's

    @property
    def open(self) -> bool:
        return self.closed_at is None


Condition = tuple[str, str]  # (source, condition): ("kubernetes", "Ready"), ("slurm", "node")


def condition_of(event: NodeEvent) -> Condition | None:
    """Which condition an event observes. Slurm reports one state per node, so the node is the
    condition; Kubernetes reports each Node condition type on its own. Manual reports are a human's
    verdict, never superseded."""
    if event.source is Source.KUBERNETES:
        return (event.source.value, event.state.partition("=")[0])
    if event.source is Source.SLURM:
        return (event.source.value, "node")
    return None


def healthy_observations(
    events: Iterable[tuple[str, str, str, str, datetime]], is_bad: Mapping[str, frozenset[str]] | None = None
) -> dict[tuple[str, Condition], datetime]:
    """``(node, source, kind, state, observed_at)`` rows -> the latest healthy observation per
    (node, condition). A HEALTHY event is one; so is a Slurm INVENTORY (a resync's level report)
    whose state is not bad (``is_bad["slurm"]``, the remediated Slurm states)."""
    slurm_bad = (is_bad or {}).get("slurm", frozenset())
    latest: dict[tuple[str, Condition], datetime] = {}
    for node, source, kind, state, observed in events:
        if kind == EventKind.INVENTORY.value:
            if source != Source.SLURM.value or slurm_states.named(state) & slurm_bad:
                continue
        elif kind != EventKind.HEALTHY.value:
            continue
        cond: Condition = (source, state.partition("=")[0]) if source == Source.KUBERNETES.value else (
            source, "node")
        key = (node, cond)
        if key not in latest or observed > latest[key]:
            latest[key] = observed
    return latest


def superseded(event: NodeEvent, healthy: Mapping[Condition, datetime]) -> str | None:
    """Why an unhealthy edge is superseded (the newer healthy observation), or None."""
    cond = condition_of(event)
    if cond is None or event.kind is not EventKind.UNHEALTHY:
        return None
    seen = healthy.get(cond)
    if seen is None or seen <= event.observed_at:
        return None  # a tie says nothing about which came last: the edge stands
    return f"superseded: {cond[0]} {cond[1]} was observed healthy at {seen.isoformat(timespec='seconds')}"


def own_cause(event: NodeEvent, window: Window | None, our_prefix: str, *, settle: timedelta) -> str | None:
    """``"caused by remediation #N: <step>"`` when our own action explains the signal, else None."""
    if window is None or window.dry_run or event.kind is not EventKind.UNHEALTHY:
        return None
    observed = event.observed_at
    if window.closed_at is not None and observed > window.closed_at + settle:
        return None
    if event.source is Source.SLURM and event.reason.startswith(our_prefix):
        # Our drain (or quarantine) reason on the node: our own action, whatever the state; which step
        # wrote it is the remediation's record, never the reason's wording.
        return _because(window, Step.QUARANTINE if window.quarantined else Step.SLURM_DRAIN)
    if window.machine_action_at is None or not _reboot_signal(event):
        return None
    began = event.since or observed
    if began < window.machine_action_at - SKEW:
        return None  # it was there before we touched the machine: the trigger, or a different fault
    if window.closed_at is not None and began > window.closed_at + SKEW:
        # It began after we proved the node healthy and closed: a new fault. The one exception is
        # Slurm's bare NOT_RESPONDING, which slurmctld keeps on a node we resumed until its next ping.
        if not (event.source is Source.SLURM and slurm_states.named(event.state) == {SlurmState.NOT_RESPONDING}):
            return None
    return _because(window, window.machine_action)


def _reboot_signal(event: NodeEvent) -> bool:
    """A kind of signal a machine restart, reimage or host move (a boot on new hardware) produces."""
    if event.source is Source.KUBERNETES:
        type_, _, status = event.state.partition("=")
        return type_ == "Ready" and status != "True"
    if event.source is Source.SLURM:
        states = slurm_states.named(event.state)
        return bool(states) and states <= _REBOOT_SLURM and (
            SlurmState.DOWN not in states or event.reason.strip().lower() in _SLURMCTLD_REASONS
        )
    return False


def _because(window: Window, step: str) -> str:
    return f"caused by remediation #{window.id}: {step}"
