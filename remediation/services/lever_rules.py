"""On-call levers: pause/resume, quarantine, release, cancel and report. All audited with the actor.

Each runs inside the caller's transaction, returns the follow-ups to enqueue after the commit, and
raises :class:`LeverError` (one clear line) on a bad request. A release is the one way out of
quarantine: it forgives earlier failures for the repeat-offender rule and queues the undo of our Slurm
drain, taint and cordon.

Why: docs/architecture.md#one-lever-service-one-set-of-read-models
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.models import AuditLog, Node, Remediation
from remediation.db.queries import PAUSED, control_set, is_paused
from remediation.db.scope import cluster_of
from remediation.domain.context import RemediationContext
from remediation.domain.controls import PauseState
from remediation.domain.events import EventKind, InvalidEvent, NodeEvent, Source
from remediation.domain.statemachine import (
    OPEN_STATUSES,
    QUARANTINE_STATUSES,
    NodeStatus,
    RemediationStatus,
    Step,
)
from remediation.domain.states import AuditAction
from remediation.ports.dispatch import FollowUp
from remediation.profiles.rules import Governance
from remediation.profiles.service import governed
from remediation.repair_requests import service as repair_requests
from remediation.services import breaker
from remediation.services.audit import audit
from remediation.services.holds import lift_holds
from remediation.services.ingest import IngestRules, record
from remediation.settings import PolicySettings


class LeverError(ValueError):
    """A lever that cannot be pulled as asked; the message says why."""


@dataclass(frozen=True)
class ReleaseActions:
    """Follow-up for the workers: undo our quarantine on ``node`` in Slurm and Kubernetes, as the
    human release recorded in audit row ``audit_id`` asked (the release task re-reads that row)."""

    node: str
    audit_id: int


@dataclass(frozen=True)
class Cancel:
    """A cancelled remediation, and with ``give_back`` the release actions to queue after the commit."""

    remediation: Remediation
    give_back: ReleaseActions | None


def _node(session: Session, name: str, lock: bool = False) -> Node:
    node = session.get(Node, (cluster_of(session), name), with_for_update=lock)
    if node is None:
        raise LeverError(f"unknown node {name!r}: it is not in the inventory (has a watcher seen it?)")
    return node


def _reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise LeverError("a reason is required (it goes to the audit log)")
    if len(reason) > 1000 or any(c in reason for c in "\n\r\x00"):
        raise LeverError("the reason must be a single line of at most 1000 characters")
    return reason


checked_reason = _reason  # for the levers that live beside this module (incidents)


def set_paused(session: Session, paused: bool, actor: str, *, reason: str, now: datetime) -> bool:
    """Pause or resume all automation; returns the previous state."""
    reason = _reason(reason)
    before = is_paused(session)
    control_set(session, PAUSED, PauseState(paused=paused, by=actor, reason=reason,
                                            at=now.isoformat()).dump(), now=now)
    audit(session, now, actor, action=AuditAction.PAUSE if paused else AuditAction.RESUME, target="",
          reason=reason)
    if not paused:
        lift_holds(session, now, actor, reason=reason)  # a human looked: held remediations go on too
    return before


def quarantine(session: Session, name: str, actor: str, *, reason: str, now: datetime,
               governance: Governance | None = None) -> FollowUp:
    """Quarantine a node by hand: an open remediation jumps to its quarantine step, otherwise one is
    opened straight into it (recording the node's profile and policy, as every remediation does; a
    human's quarantine is real in a shadow profile too)."""
    reason = _reason(reason)
    node = _node(session, name, lock=True)
    if node.status in QUARANTINE_STATUSES:
        raise LeverError(f"{name} is already quarantined ({node.quarantine_reason})")
    why = f"manual quarantine by {actor}: {reason}"
    rem = session.scalars(
        select(Remediation).where(Remediation.node == name, Remediation.status.in_(OPEN_STATUSES)).with_for_update()
    ).first()
    if rem is None:
        rem = Remediation(node=name, cause=why, source=Source.MANUAL.value, status=RemediationStatus.RUNNING,
                          step=Step.QUARANTINE, ladder=0, opened_at=now, updated_at=now, next_run_at=now,
                          context=RemediationContext(quarantine_reason=why).dump())
        if governance is not None:
            found, policy = governed(session, governance, [name])[name]
            rem.profile, rem.policy = found.name, policy.dump()
        session.add(rem)
    else:
        rem.step, rem.status, rem.next_run_at, rem.updated_at = Step.QUARANTINE, RemediationStatus.RUNNING, now, now
        rem.lease_owner = rem.lease_until = None
        rem.ctx = replace(rem.ctx, quarantine_reason=why)
    node.status, node.status_reason, node.updated_at = NodeStatus.REMEDIATING, why, now
    session.flush()
    audit(session, now, actor, action=AuditAction.QUARANTINE, target=name, reason=reason,
          detail={"remediation": rem.id})
    return FollowUp(rem.id, Step.QUARANTINE.value)


def release(session: Session, name: str, actor: str, *, reason: str, now: datetime) -> ReleaseActions:
    reason = _reason(reason)
    node = _node(session, name, lock=True)
    if node.status not in QUARANTINE_STATUSES:
        raise LeverError(f"{name} is not quarantined (status: {node.status}); nothing to release")
    node.status, node.status_reason = NodeStatus.HEALTHY, f"released by {actor}: {reason}"
    node.released_at, node.updated_at = now, now
    node.quarantined_at = None
    row = audit(session, now, actor, action=AuditAction.RELEASE, target=name, reason=reason,
                detail={"was": node.quarantine_reason})
    node.quarantine_reason = None
    if (request := repair_requests.released(session, name, actor=actor, now=now)) is not None:
        row.detail = {**row.detail, "repair_request": request}  # released while with the repair system
    session.flush()
    return ReleaseActions(name, row.id)


def cancel(session: Session, remediation_id: int, actor: str, *, reason: str, now: datetime,
           give_back: bool = False) -> Cancel:
    """Stop one remediation where it stands. By default the node is left as it is (drained/cordoned
    by us, if we got that far) and marked unhealthy, so a human decides what comes next. With
    ``give_back`` the caller also queues ``ReleaseActions(node)``, which resumes our drain (only while
    the reason is still ours) and removes our cordon and taint; the node is then marked healthy."""
    reason = _reason(reason)
    rem = session.get(Remediation, remediation_id, with_for_update=True)
    if rem is None:
        raise LeverError(f"no remediation #{remediation_id}")
    if rem.status not in OPEN_STATUSES:
        raise LeverError(f"remediation #{remediation_id} is already {rem.status}")
    rem.status, rem.closed_at, rem.updated_at, rem.next_run_at = RemediationStatus.CANCELLED, now, now, None
    rem.outcome = f"cancelled by {actor}: {reason}"
    rem.lease_owner = rem.lease_until = None
    node = _node(session, rem.node, lock=True)
    if give_back:
        rem.outcome += " (our drain, cordon and taint given back)"
        node.status, node.status_reason, node.updated_at = NodeStatus.HEALTHY, rem.outcome, now
    else:
        node.status, node.status_reason, node.updated_at = NodeStatus.UNHEALTHY, rem.outcome, now
    row = audit(session, now, actor, action=AuditAction.CANCEL, target=rem.node, reason=reason,
                detail={"remediation": rem.id, "step": rem.step, "give_back": give_back})
    if rem.ctx.repair_request is not None:  # a repair's re-check: its request ends with it
        repair_requests.recheck_closed(session, rem, now=now, actor=actor)
    session.flush()
    return Cancel(rem, ReleaseActions(rem.node, row.id) if give_back else None)


def open_steps(session: Session, remediation_ids: Sequence[int]) -> list[FollowUp]:
    """The step the database has for each open remediation among ``remediation_ids``: what a worker
    runs for a lever's follow-ups, re-read rather than taken from the request that named them."""
    rows = session.execute(select(Remediation.id, Remediation.step).where(
        Remediation.id.in_(list(remediation_ids)), Remediation.status.in_(OPEN_STATUSES)).order_by(Remediation.id))
    return [FollowUp(rid, step) for rid, step in rows]


def committed_release(session: Session, audit_id: int) -> str | None:
    """The node a committed human release (``release``, or ``cancel`` with ``give_back``) in audit row
    ``audit_id`` hands back, while that still stands: None for any other row, a dry-run one, or a node
    quarantined or under remediation again since. The release task acts on this, never on a node name
    a message carried: whoever can write to its queue can name an audit row, not forge one."""
    row = session.get(AuditLog, audit_id)
    if row is None or row.dry_run or not (
            row.action == AuditAction.RELEASE or (row.action == AuditAction.CANCEL and row.detail.get("give_back") is True)):
        return None
    node = session.get(Node, (row.cluster, row.target))
    if node is None or node.status in QUARANTINE_STATUSES | {NodeStatus.REMEDIATING}:
        return None
    reopened = session.scalar(select(Remediation.id).where(
        Remediation.cluster == row.cluster, Remediation.node == row.target,
        Remediation.status.in_(OPEN_STATUSES)).limit(1))
    return None if reopened is not None else row.target


def breaker_status(session: Session, profile: str | None = None) -> dict[str, Any]:
    """The storm breaker's latch (the fleet's, or ``profile``'s): open or not, why, since when, and who
    closed it last."""
    return breaker.state(session, profile)


def close_breaker(session: Session, actor: str, reason: str, *, now: datetime,
                  profile: str | None = None) -> list[FollowUp]:
    """A human closes the latched storm breaker, the fleet's or ``profile``'s (audited). Every held
    remediation re-confirms its trigger before its next disruptive action; the follow-ups run them now."""
    reason = _reason(reason)
    held = breaker.close_latch(session, now, actor, reason=reason, profile=profile)
    if held is None:
        whose = f"profile {profile}'s storm breaker" if profile is not None else "the storm breaker"
        raise LeverError(f"{whose} is not open; nothing to close")
    rems = session.scalars(select(Remediation).where(Remediation.id.in_(held))).all()
    return [FollowUp(r.id, r.step) for r in rems]


@dataclass(frozen=True)
class HumanReport:
    """A human's word that ``node`` is unhealthy: who says so and why."""

    node: str
    actor: str
    reason: str


def report(session: Session, said: HumanReport, *, now: datetime, policy: PolicySettings,
           governance: Governance | None = None) -> list[FollowUp]:
    """A manual report (for researchers without scontrol rights): recorded as an event and decided
    exactly like a watcher's. It is recorded here, with its actor, and never goes through the stream,
    which refuses ``source: manual`` (remediation.domain.admission)."""
    name, actor, reason = said.node, said.actor, _reason(said.reason)
    _node(session, name)
    try:
        event = NodeEvent(source=Source.MANUAL, node=name, kind=EventKind.UNHEALTHY, state="REPORTED",
                          reason=f"{reason} (reported by {actor})", reason_user=actor[:128], observed_at=now)
    except Exception as exc:  # pragma: no cover - the checks above make this unreachable
        raise LeverError(str(exc)) from exc
    result = record(session, [event], policy, clock=_Fixed(now), rules=IngestRules(governance=governance))
    audit(session, now, actor, action=AuditAction.REPORT, target=name, reason=reason,
          detail={"opened": [rid for rid, _ in result.opened]})
    return [FollowUp(rid, step) for rid, step in result.opened]


class _Fixed:
    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now


__all__ = ["Cancel", "LeverError", "ReleaseActions", "committed_release", "open_steps", "breaker_status", "cancel", "close_breaker", "quarantine", "release",
           "report", "set_paused", "InvalidEvent"]
