"""Repair requests: opened with a hardware quarantine, delivered with retries, and closed by the repair
system's callback or on-call (done: a re-check; abandon: the node stays quarantined).

:func:`open_on_quarantine` runs in the transaction that closes the remediation as quarantined;
:func:`deliver_due` is the outbox pass (plan, send with no transaction open, record);
:func:`answer` is the one door for "done" and "abandoned"; :func:`recheck_closed` ends the request
when its re-check ends. Each node has one open request at most.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.fault_history import failure_history
from remediation.db.models import EvidenceItem, Node, RepairRequest
from remediation.db.models import Remediation as RemediationRow
from remediation.db.scope import cluster_of, narrowed
from remediation.domain.context import RemediationContext
from remediation.domain.events import Source
from remediation.domain.hardware import eras
from remediation.domain.policy import Clock
from remediation.domain.statemachine import OPEN_STATUSES, NodeStatus, RemediationStatus, Step
from remediation.domain.states import AuditAction
from remediation.domain.trends import Repaired
from remediation.ports.dispatch import FollowUp
from remediation.repair_requests import rules
from remediation.repair_requests.port import DeliveryFailed, RepairSystem
from remediation.repair_requests.rules import CallbackStatus, DeliveryStatus, RepairStatus
from remediation.repair_requests.settings import RepairSettings
from remediation.services.audit import audit
from remediation.services.hardware import sightings
from remediation.services.lemons import lemon_scores
from remediation.settings import LemonSettings

log = logging.getLogger(__name__)

LEASE_MARGIN_S = 30.0  # beyond a delivery's own timeout, before a crashed pass's request is tried again


class RepairRefused(ValueError):
    """A callback or lever the request's state refuses (409); the message says why."""


class RepairNotFound(LookupError):
    """No such repair request (404)."""


# ------------------------------------------------------------------------------------------- open


def open_on_quarantine(s: Session, rem: RemediationRow, *, cfg: RepairSettings, lemon: LemonSettings,
                       now: datetime, actor: str) -> RepairRequest | None:
    """Open the node's repair request as ``rem`` closes quarantined, when the quarantine is for hardware
    (its reason says RMA) or ends a failed re-check; the node is then ``with-repair``. None: off, or not
    a hardware quarantine."""
    earlier = rem.ctx.repair_request
    if not cfg.enabled or not (rem.ctx.rma or earlier is not None):
        return None
    req = RepairRequest(node=rem.node, remediation_id=rem.id, follows_id=earlier, status=RepairStatus.OPEN,
                        delivery=DeliveryStatus.PENDING, attempts=0, next_attempt_at=now, opened_at=now,
                        payload={}, dry_run=bool(rem.dry_run))
    s.add(req)
    s.flush()
    req.payload = rules.payload(_facts(s, rem, req, lemon=lemon, now=now))
    node = s.get(Node, (rem.cluster, rem.node), with_for_update=True)
    if node is not None:
        node.status, node.updated_at = NodeStatus.WITH_REPAIR, now
        node.status_reason = f"{node.status_reason or 'quarantined'} (repair request #{req.id})"[:2000]
    audit(s, now, actor, action=AuditAction.REPAIR_REQUESTED, target=rem.node, reason=rem.outcome or "",
          detail={"remediation": rem.id, "repair_request": req.id, "follows": earlier}, dry_run=req.dry_run)
    return req


def _facts(s: Session, rem: RemediationRow, req: RepairRequest, *, lemon: LemonSettings,
           now: datetime) -> rules.Facts:
    """What the request says, read from the database as the quarantine closes."""
    horizon = timedelta(seconds=lemon.horizon_s)
    history = failure_history(s, [rem.node], now, horizon=horizon).get(rem.node, [])
    sc = lemon_scores(s, now, lemon, nodes=[rem.node]).get(rem.node)
    return rules.Facts(
        request_id=req.id, cluster=rem.cluster, node=rem.node, remediation_id=rem.id, opened_at=now,
        fault_class=rem.fault_class or rem.ctx.fault_class, cause=rem.cause,
        reason=rem.ctx.quarantine_reason or rem.outcome or "", hardware=hardware_of(s, rem.node),
        lemon=rules.Lemon(sc.score, sc.failures, sc.over(lemon), sc.explanation) if sc else
        rules.Lemon(0.0, 0, False, "no failures counted"),
        follows=req.follows_id, fault_evidence=rem.fault_evidence, evidence=evidence_of(s, rem.id),
        history=tuple(rules.PastFault(f.at, f.fault_class) for f in history), dry_run=req.dry_run)


def hardware_of(s: Session, node: str, since: datetime | None = None) -> rules.Hardware:
    """The node's hardware as its real sightings (from ``since``, when given) name it: the machine as
    its latest era has it, the GPUs of the latest sighting that named any."""
    seen = [sg for sg in sightings(s, [node]) if since is None or sg.at >= since]
    if not seen:
        return rules.Hardware()
    era = eras(seen)[-1]
    gpus = next((sg.gpus for sg in reversed(seen) if sg.gpus), ())
    return rules.Hardware(provider=era.provider, instance_id=era.instance_id, host=era.host,
                          bmc_uuid=era.bmc_uuid, bmc_serial=era.bmc_serial, sku=era.sku,
                          gpus=tuple(rules.Gpu(g.uuid, g.serial) for g in gpus))


def evidence_of(s: Session, remediation_id: int) -> tuple[rules.EvidenceItem, ...]:
    """The evidence collected during ``remediation_id``, as the request names it (content inline ≤ 8 KiB)."""
    rows = s.scalars(select(EvidenceItem).where(EvidenceItem.remediation_id == remediation_id)
                     .order_by(EvidenceItem.id))
    return tuple(rules.EvidenceItem(r.name, str(r.status), r.exit_code, r.size_bytes, r.truncated, r.sha256,
                                    r.location, rules.inline(r.content, r.size_bytes)) for r in rows)


# --------------------------------------------------------------------------------------- delivery


@dataclass
class DeliveryPass:
    """One outbox pass: the requests it delivered and those that failed (retried later)."""

    delivered: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Due:
    id: int
    key: str
    body: dict[str, Any]
    dry_run: bool


def key_of(req: RepairRequest) -> str:
    """The request's name outside: the same for every attempt (an idempotency key, a file's name)."""
    return f"repair-request-{req.cluster}-{req.id}"


def deliver_due(sessions: sessionmaker[Session], system: RepairSystem, cfg: RepairSettings, *, clock: Clock,
                noop: RepairSystem | None = None, batch: int = 20) -> DeliveryPass:
    """Send every request whose attempt is due. A dry-run request goes to ``noop`` (the dry-run twin).
    A failure is recorded with its backoff and never touches the quarantine, long committed."""
    due = _plan(sessions, cfg, now=clock.now(), batch=batch)
    out = DeliveryPass()
    for item in due:
        target = noop if item.dry_run and noop is not None else system
        try:
            said, error = target.send(item.key, item.body), None
        except DeliveryFailed as exc:
            said, error = None, str(exc)
        except Exception as exc:  # noqa: BLE001 - an unmapped error's text may carry the URL: its type only
            said, error = None, f"delivery failed ({type(exc).__name__})"
        _record(sessions, item.id, cfg, said=said, error=error, now=clock.now())
        (out.delivered if error is None else out.failed).append(item.id)
        if error is not None:
            log.warning("repair request #%d: %s; retried later", item.id, error)
    return out


def _plan(sessions: sessionmaker[Session], cfg: RepairSettings, *, now: datetime, batch: int) -> list[_Due]:
    """Take the due requests' lease (their next attempt pushed past this pass) and read what to send."""
    with sessions() as s, s.begin():
        rows = s.scalars(select(RepairRequest).where(
            RepairRequest.delivery == DeliveryStatus.PENDING, RepairRequest.next_attempt_at <= now,
        ).order_by(RepairRequest.next_attempt_at).with_for_update(skip_locked=True).limit(batch)).all()
        for r in rows:
            r.next_attempt_at = now + timedelta(seconds=cfg.timeout_s + LEASE_MARGIN_S)
        return [_Due(r.id, key_of(r), dict(r.payload), bool(r.dry_run)) for r in rows]


def _record(sessions: sessionmaker[Session], rid: int, cfg: RepairSettings, *, said: str | None,
            error: str | None, now: datetime) -> None:
    with sessions() as s, s.begin():
        req = s.get(RepairRequest, rid, with_for_update=True)
        if req is None or req.delivery is not DeliveryStatus.PENDING:
            return
        if error is None:
            req.delivery, req.delivered_at, req.next_attempt_at = DeliveryStatus.DELIVERED, now, None
            req.note = _noted(req.note, f"delivered: {said}")
            return
        req.attempts += 1
        req.last_error = error[:2000]
        req.next_attempt_at = now + timedelta(seconds=rules.backoff(req.attempts, base_s=cfg.backoff_base_s,
                                                                    max_s=cfg.backoff_max_s))
        if req.attempts == 1:  # once per request: the page says deliveries fail, the dashboard how often
            with narrowed(s, req.cluster):
                audit(s, now, "remediation", action=AuditAction.REPAIR_DELIVERY_FAILED, target=req.node,
                      reason=error[:2000], detail={"repair_request": req.id}, dry_run=bool(req.dry_run))


def _noted(before: str | None, line: str) -> str:
    return f"{before}; {line}" if before else line


# ----------------------------------------------------------------------------------- the callback


@dataclass(frozen=True)
class Answer:
    """What the repair system or on-call says of a request: done or abandoned, under which ticket."""

    status: CallbackStatus
    ticket: str
    actor: str
    note: str | None = None


def answer(s: Session, request_id: int, said: Answer, *, now: datetime) -> FollowUp | None:
    """Close an open request as ``said``: done opens the re-check (returned: its first step to run after
    the commit); abandoned leaves the node quarantined. Unknown: :class:`RepairNotFound`; not open:
    :class:`RepairRefused`."""
    req = s.get(RepairRequest, request_id, with_for_update=True)
    if req is None:
        raise RepairNotFound(f"no repair request #{request_id}")
    if req.status not in rules.OPEN_REPAIRS:
        raise RepairRefused(f"repair request #{request_id} is already {req.status} "
                            f"(by {req.closed_by or 'nobody'}); nothing to do")
    req.ticket, req.closed_by = said.ticket, said.actor
    if req.delivery is DeliveryStatus.PENDING:
        req.delivery, req.next_attempt_at = DeliveryStatus.STOPPED, None
    with narrowed(s, req.cluster):
        if said.status is CallbackStatus.ABANDONED:
            _abandon(s, req, said, now=now)
            return None
        return _recheck(s, req, said, now=now)


def _abandon(s: Session, req: RepairRequest, said: Answer, *, now: datetime) -> None:
    req.status, req.closed_at = RepairStatus.ABANDONED, now
    req.note = _noted(req.note, f"abandoned by {said.actor}: {said.note or 'no repair'}")
    node = s.get(Node, (req.cluster, req.node), with_for_update=True)
    if node is not None and node.status is NodeStatus.WITH_REPAIR:
        node.status, node.updated_at = NodeStatus.QUARANTINED, now
        node.status_reason = f"repair request #{req.id} abandoned (ticket {req.ticket}): {node.quarantine_reason}"
    audit(s, now, said.actor, action=AuditAction.REPAIR_ABANDONED, target=req.node, reason=said.note or "",
          detail={"repair_request": req.id, "ticket": req.ticket}, dry_run=bool(req.dry_run))


def _recheck(s: Session, req: RepairRequest, said: Answer, *, now: datetime) -> FollowUp:
    """Open the re-check: a remediation that starts at the GPU check and returns the node (or
    quarantines it again, with a new request that follows this one)."""
    busy = s.scalar(select(RemediationRow.id).where(RemediationRow.cluster == req.cluster,
                                                    RemediationRow.node == req.node,
                                                    RemediationRow.status.in_(OPEN_STATUSES)))
    if busy is not None:
        raise RepairRefused(f"{req.node} is under remediation #{busy}; the re-check waits until it ends")
    first = s.get(RemediationRow, req.remediation_id)
    if first is None:  # pragma: no cover - the foreign key keeps it
        raise RepairNotFound(f"repair request #{req.id}: its remediation is gone")
    rem = _recheck_row(req, first, said, now=now)
    s.add(rem)
    s.flush()
    req.status, req.done_at, req.recheck_id = RepairStatus.RECHECKING, now, rem.id
    req.note = _noted(req.note, f"done by {said.actor}" + (f": {said.note}" if said.note else ""))
    node = s.get(Node, (req.cluster, req.node), with_for_update=True)
    if node is not None:
        node.status, node.updated_at = NodeStatus.REMEDIATING, now
        node.status_reason = f"re-check #{rem.id} after repair request #{req.id} (ticket {req.ticket})"
    audit(s, now, said.actor, action=AuditAction.REPAIR_DONE, target=req.node, reason=said.note or "",
          detail={"repair_request": req.id, "ticket": req.ticket, "remediation": rem.id}, dry_run=bool(req.dry_run))
    return FollowUp(rem.id, Step.VALIDATE.value)


def _recheck_row(req: RepairRequest, first: RemediationRow, said: Answer, *, now: datetime) -> RemediationRow:
    was = first.ctx
    ctx = RemediationContext(fault_class=was.fault_class, cause_class=was.cause_class, k8s_node=was.k8s_node,
                             provider_id=was.provider_id, we_cordoned=was.we_cordoned, repair_request=req.id,
                             reason=f"repaired under ticket {said.ticket}")
    return RemediationRow(
        cluster=req.cluster, node=req.node, source=Source.MANUAL, status=RemediationStatus.RUNNING,
        step=Step.VALIDATE, ladder=0, opened_at=now, updated_at=now, next_run_at=now,
        cause=f"re-check after repair request #{req.id} (ticket {said.ticket}, done by {said.actor})",
        fault_class=first.fault_class, fault_evidence=first.fault_evidence, action=first.action,
        profile=first.profile, policy=first.policy, dry_run=bool(first.dry_run), context=ctx.dump())


# --------------------------------------------------------------------------------- the re-check end


def recheck_closed(s: Session, rem: RemediationRow, *, now: datetime, actor: str) -> None:
    """End the request whose re-check ``rem`` just closed: returned on a pass; failed-check on a
    quarantine (the new request, opened beside, follows it); abandoned otherwise. Hardware the
    re-check saw that differs from the request's is recorded as new hardware."""
    req = s.get(RepairRequest, rem.ctx.repair_request, with_for_update=True) if rem.ctx.repair_request else None
    if req is None or req.status is not RepairStatus.RECHECKING:
        return
    ended = {RemediationStatus.SUCCEEDED: RepairStatus.RETURNED,
             RemediationStatus.QUARANTINED: RepairStatus.FAILED_CHECK}.get(rem.status, RepairStatus.ABANDONED)
    req.status, req.closed_at = ended, now
    said = f"re-check #{rem.id} {rem.status}: {rem.outcome or ''}"
    if rem.ctx.domain_repair is not None:  # validation.domain_check_on_return: the domain check decides
        said = f"re-check #{rem.id} passed; handed to domain repair #{rem.ctx.domain_repair}, whose check decides"
    req.note = _noted(req.note, said[:2000])
    s.flush()  # closed before a failed re-check's new request is written (one open per node)
    if ended is RepairStatus.RETURNED:
        audit(s, now, actor, action=AuditAction.REPAIR_RETURNED, target=rem.node, reason=rem.outcome or "",
              detail={"repair_request": req.id, "remediation": rem.id}, dry_run=bool(rem.dry_run))
    _new_hardware(s, req, rem, now=now, actor=actor)


def _new_hardware(s: Session, req: RepairRequest, rem: RemediationRow, *, now: datetime, actor: str) -> None:
    """Compare what the re-check saw (its sightings) with what the request named; a change is new
    hardware: said on the request, on the re-check's outcome and in the audit log."""
    asked = _hardware(req.payload.get("hardware") or {})
    seen = hardware_of(s, req.node, since=aware(req.done_at) or now)
    why = rules.changed(asked, seen)
    if why is None:
        return
    req.new_hardware = why
    rem.outcome = _noted(rem.outcome, f"new hardware after repair request #{req.id}: {why}")
    audit(s, now, actor, action=AuditAction.REPAIR_NEW_HARDWARE, target=rem.node, reason=why,
          detail={"repair_request": req.id, "remediation": rem.id}, dry_run=bool(rem.dry_run))


def _hardware(raw: dict[str, Any]) -> rules.Hardware:
    gpus = tuple(rules.Gpu(str(g.get("uuid")), g.get("serial")) for g in raw.get("gpus") or ())
    return rules.Hardware(**{k: raw.get(k) for k in ("provider", "instance_id", "host", "bmc_uuid",
                                                     "bmc_serial", "sku")}, gpus=gpus)


def released(s: Session, node: str, *, actor: str, now: datetime) -> int | None:
    """A human released ``node``: its open request ends (no more deliveries); returns its id."""
    req = s.scalars(select(RepairRequest).where(
        RepairRequest.cluster == cluster_of(s), RepairRequest.node == node,
        RepairRequest.status == RepairStatus.OPEN).with_for_update()).first()
    if req is None:
        return None
    req.status, req.closed_at, req.closed_by = RepairStatus.RELEASED, now, actor
    if req.delivery is DeliveryStatus.PENDING:
        req.delivery, req.next_attempt_at = DeliveryStatus.STOPPED, None
    return req.id


def open_request_of(s: Session, node: str) -> int:
    """The id of ``node``'s open request (of the session's cluster); :class:`RepairNotFound` if none."""
    rid = s.scalar(select(func.max(RepairRequest.id)).where(
        RepairRequest.cluster == cluster_of(s), RepairRequest.node == node, RepairRequest.status == RepairStatus.OPEN))
    if rid is None:
        raise RepairNotFound(f"{node} has no open repair request (see `remediation repair list`)")
    return int(rid)


# ------------------------------------------------------------------------------------------ reads


def row_of(req: RepairRequest) -> dict[str, Any]:
    """One request as the CLI, the API and the dashboard show it (the payload only in :func:`detail`)."""
    return {
        "id": req.id, "cluster": req.cluster, "node": req.node, "remediation_id": req.remediation_id,
        "follows_id": req.follows_id, "status": str(req.status), "ticket": req.ticket,
        "delivery": str(req.delivery), "attempts": req.attempts, "next_attempt_at": aware(req.next_attempt_at),
        "last_error": req.last_error, "opened_at": aware(req.opened_at), "delivered_at": aware(req.delivered_at),
        "done_at": aware(req.done_at), "closed_at": aware(req.closed_at), "closed_by": req.closed_by,
        "note": req.note, "recheck_id": req.recheck_id, "new_hardware": req.new_hardware,
        "dry_run": bool(req.dry_run),
    }


def list_requests(s: Session, *, status: RepairStatus | None = None, node: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
    """Requests, newest first (of ``status``, of ``node``)."""
    q = select(RepairRequest).order_by(RepairRequest.id.desc()).limit(limit)
    if status is not None:
        q = q.where(RepairRequest.status == status)
    if node is not None:
        q = q.where(RepairRequest.node == node)
    return [row_of(r) for r in s.scalars(q)]


def detail(s: Session, request_id: int) -> dict[str, Any]:
    """One request with what it sent; :class:`RepairNotFound` when there is none."""
    req = s.get(RepairRequest, request_id)
    if req is None:
        raise RepairNotFound(f"no repair request #{request_id} (see `remediation repair list`)")
    return {**row_of(req), "payload": dict(req.payload)}


def failing(s: Session) -> list[dict[str, Any]]:
    """Requests whose delivery has failed and is being retried, for the dashboard."""
    q = select(RepairRequest).where(RepairRequest.delivery == DeliveryStatus.PENDING,
                                    RepairRequest.attempts > 0).order_by(RepairRequest.opened_at)
    return [row_of(r) for r in s.scalars(q)]


def repaired(s: Session, until: datetime, *, cluster: str | None,
             label: Callable[[str, str], str]) -> list[Repaired]:
    """Every real request the repair system finished (done) before ``until`` (of ``cluster``, when
    given), with the hardware items it named; ``label(cluster, node)`` names the node."""
    q = select(RepairRequest).where(RepairRequest.done_at.is_not(None), RepairRequest.done_at < until,
                                    RepairRequest.dry_run.is_(False))
    if cluster is not None:
        q = q.where(RepairRequest.cluster == cluster)
    out = []
    for req in s.scalars(q.order_by(RepairRequest.id)):
        items = rules.items(_hardware(req.payload.get("hardware") or {}))
        opened, done = aware(req.opened_at), aware(req.done_at)
        if items and opened is not None and done is not None:
            out.append(Repaired(label(req.cluster, req.node), items, opened, done))
    return out
