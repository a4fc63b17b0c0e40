"""Topology-correlated incidents: many nodes of one failure domain failing at once are one incident.

In the ingest's transaction :func:`correlate_opened` reads the failing nodes' domains
(:func:`record_domains` keeps them), applies :func:`remediation.domain.topology.correlate`, and opens
one incident and one page per domain. Members drain and cordon, then :func:`hold_reason` holds them
before disruptive steps. :func:`check_recovery` (the sweeper) or :func:`resolve` (a human) closes it,
releasing members to re-confirm.

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import aware
from remediation.db.models import Incident, Node, NodeDomain, Remediation
from remediation.db.queries import among, lock_control
from remediation.db.scope import cluster_of
from remediation.domain import slurm_states
from remediation.domain.context import RemediationContext
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.policy import Clock
from remediation.domain.slurm_states import SlurmState
from remediation.domain.statemachine import OPEN_STATUSES, Step
from remediation.domain.states import INCIDENT_CLOSES, AuditAction, IncidentStatus
from remediation.domain.step_bodies import Adapters
from remediation.domain.topology import Correlated, Rule, correlate, domain_key, likely_cause
from remediation.domain_repair.service import running_by_tray
from remediation.hostlist import compress
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import RemediationError
from remediation.services.audit import audit
from remediation.services.readmodels import RecordNotFound
from remediation.settings import IncidentSettings, Settings

log = logging.getLogger(__name__)

#: The listing filter for every incident no longer open (recovered or resolved).
CLOSED = "closed"
HELD_STEPS = frozenset({Step.K8S_EVICT, Step.VM_RESTART, Step.QUARANTINE})
INCIDENTS_LOCK = "incidents"  # the control row correlations queue on


class IncidentError(ValueError):
    """An incident lever that cannot be pulled as asked (already closed) or a bad filter."""


class IncidentNotFound(RecordNotFound, IncidentError):
    """No incident has this id (a 404 in the API, like any record not found)."""


# ------------------------------------------------------------------------------------- domains


_DELETE_SLICE = 500  # names per statement: well under any driver's limit on parameters


def record_domains(session: Session, events: Iterable[NodeEvent], now: datetime) -> int:
    """Replace each (node, source)'s failure domains with the latest report in ``events``."""
    latest: dict[tuple[str, str], NodeEvent] = {}
    for ev in events:
        if ev.kind is EventKind.DOMAINS and ev.domains is not None:
            key = (ev.node, ev.source.value)
            if key not in latest or ev.observed_at >= latest[key].observed_at:
                latest[key] = ev
    by_source: dict[str, list[str]] = defaultdict(list)
    for node, source in latest:
        by_source[source].append(node)
    # A resync reports every node at once: one delete per source and slice, not one per node.
    for source, nodes in sorted(by_source.items()):
        for i in range(0, len(nodes), _DELETE_SLICE):
            session.execute(delete(NodeDomain).where(among(session, NodeDomain.node, nodes[i:i + _DELETE_SLICE]),
                                                     NodeDomain.source == source))
    rows = [{"node": node, "source": source, "kind": kind, "name": name,
             "size": (ev.domain_sizes or {}).get(kind), "updated_at": now}
            for (node, source), ev in latest.items() for kind, name in sorted((ev.domains or {}).items())]
    if rows:
        session.execute(insert(NodeDomain), rows)
    return len(latest)


def domains_of(session: Session, nodes: Collection[str]) -> dict[str, dict[str, str]]:
    """node -> {kind: name}, every source merged."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    if nodes:
        for node, kind, name in session.execute(
            select(NodeDomain.node, NodeDomain.kind, NodeDomain.name).where(among(session, NodeDomain.node, nodes))
        ):
            out[node][kind] = name
    return dict(out)


def _members(session: Session, domains: set[tuple[str, str]]) -> dict[tuple[str, str], set[str]]:
    if not domains:
        return {}
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    kinds = {k for k, _ in domains}
    names = {n for _, n in domains}
    for node, kind, name in session.execute(
        select(NodeDomain.node, NodeDomain.kind, NodeDomain.name).where(
            among(session, NodeDomain.kind, kinds), among(session, NodeDomain.name, names))
    ):
        if (kind, name) in domains:
            out[(kind, name)].add(node)
    return dict(out)


# ------------------------------------------------------------------------------------ detection


def rule_of(cfg: IncidentSettings) -> Rule:
    return Rule(cfg.min_nodes, cfg.min_fraction, cfg.window_s, dict(cfg.min_nodes_by_kind))


def correlate_opened(session: Session, nodes: Collection[str], cfg: IncidentSettings, *, actor: str,
                     now: datetime, dry_run: bool = False) -> list[int]:
    """Fold the remediations just opened on ``nodes`` (and their domain-mates') into incidents.
    Returns the ids of the incidents opened. Runs in the caller's (the ingest's) transaction."""
    if not cfg.enabled or not nodes:
        return []
    mine = domains_of(session, nodes)
    wanted = {(kind, name) for doms in mine.values() for kind, name in doms.items()}
    members = _members(session, wanted)
    if not members:
        return []
    # Two ingests correlating at once would each see no incident and open one each: take turns.
    lock_control(session, INCIDENTS_LOCK, now)
    everyone = set().union(*members.values())
    start = now - timedelta(seconds=cfg.window_s)
    open_rems = session.execute(
        select(Remediation.id, Remediation.node, Remediation.opened_at, Remediation.incident_id).where(
            among(session, Remediation.node, everyone), Remediation.status.in_(OPEN_STATUSES),
            Remediation.dry_run.is_(dry_run),
        ).add_columns(Remediation.step, Remediation.context)
    ).all()
    # A quarantine decided on this very failure (N-in-W, lemon) has not happened yet (held for the
    # grace): a failure the incident explains never counts, so it may be folded in and taken back.
    open_rems = [r for r in open_rems
                 if r.step != Step.QUARANTINE or RemediationContext.load(r.context).quarantine_decided]
    claimed = {r.node for r in open_rems if r.incident_id is not None}
    failed_at = {r.node: aware(r.opened_at) for r in open_rems
                 if r.incident_id is None and aware(r.opened_at) > start}
    rem_of = {r.node: r.id for r in open_rems if r.incident_id is None}
    # A domain whose incident is open takes its members' new failures without a second page.
    for inc in session.scalars(select(Incident).where(
            Incident.status == IncidentStatus.OPEN, Incident.dry_run.is_(dry_run),
            among(session, Incident.kind, {k for k, _ in members}),
            among(session, Incident.name, {n for _, n in members}))):
        joining = sorted((members.get((inc.kind, inc.name), set()) & set(failed_at)) - claimed)
        if joining:
            _link(session, inc, joining, rem_of=rem_of, now=now)
            inc.nodes = sorted(set(inc.nodes or []) | set(joining))
            inc.updated_at = now
            claimed.update(joining)
            audit(session, now, actor, action=AuditAction.INCIDENT_JOINED, target=domain_key(inc.kind,
                inc.name),
                  reason=f"{compress(joining)} joined incident #{inc.id} ({inc.cause} {inc.name})",
                  detail={"incident": inc.id, "nodes": joining}, dry_run=dry_run)
    opened = []
    for found in correlate(failed_at, members, claimed, now=now, rule=rule_of(cfg)):
        inc = _open(session, found, actor, now=now, dry_run=dry_run)
        _link(session, inc, list(found.nodes), rem_of=rem_of, now=now)
        opened.append(inc.id)
    return opened


def _open(session: Session, found: Correlated, actor: str, *, now: datetime, dry_run: bool) -> Incident:
    inc = Incident(kind=found.kind, name=found.name, cause=found.cause, status=IncidentStatus.OPEN,
                   nodes=list(found.nodes),
                   domain_size=found.size, opened_at=now, updated_at=now, dry_run=dry_run)
    session.add(inc)
    session.flush()
    page = (f"incident #{inc.id}: {len(found.nodes)} of {found.size} nodes of {found.kind} {found.name} failed "
            f"together; likely cause: {found.cause}; nodes: {compress(found.nodes)}. They are drained in Slurm "
            "and get no machine action; resolve with `remediation incidents resolve "
            f"{inc.id} -r REASON` once the {found.cause} is fixed")
    audit(session, now, actor, action=AuditAction.INCIDENT_OPENED, target=found.key, reason=page,
          detail={"incident": inc.id, "kind": found.kind, "name": found.name, "cause": found.cause,
           "nodes": list(found.nodes), "domain_size": found.size}, dry_run=dry_run)
    return inc


def _link(session: Session, inc: Incident, nodes: list[str], *, rem_of: dict[str, int],
          now: datetime) -> None:
    for node in nodes:
        rem = session.get(Remediation, rem_of[node])
        if rem is None:
            continue
        rem.incident_id = inc.id
        rem.ctx = replace(rem.ctx, incident=inc.id)
        if rem.step == Step.QUARANTINE and rem.ctx.quarantine_decided:
            # The failure that tipped the count is the domain's, not the node's: no quarantine for it.
            rem.ctx = replace(rem.ctx, quarantine_reason=None, quarantine_decided=None,
                              quarantine_taken_back=rem.cause)
            rem.step, rem.action, rem.next_run_at, rem.updated_at = Step.SLURM_DRAIN, None, now, now
            audit(session, now, "remediation", action=AuditAction.QUARANTINE_TAKEN_BACK, target=node,
                  reason=f"incident #{inc.id} ({inc.cause} {inc.name}) explains this failure: {rem.cause}",
                  detail={"incident": inc.id, "remediation": rem.id}, dry_run=bool(rem.dry_run))
        n = session.get(Node, (cluster_of(session), node))
        if n is not None:
            n.status_reason = f"incident #{inc.id}: {inc.cause} {inc.name}"
            n.updated_at = now


# ---------------------------------------------------------------------------- admission


@dataclass(frozen=True)
class IncidentHold:
    """Why a remediation may not take its next disruptive step yet."""

    reason: str  # for people: the wait reason and the step log
    # Held by an open incident (it lasts until the incident closes), not by the grace period that lets
    # an incident form (it ends at a known time).
    by_incident: bool
    until: datetime | None = None  # the grace period's end: then the hold ends by time alone


def hold_reason(session: Session, rem: Remediation, step: Step, *, now: datetime, cfg: IncidentSettings,
                new_machine_action: bool) -> IncidentHold | None:
    """Why this remediation may not take its next disruptive step yet, or None: its node is in an
    open incident, or (first machine action only) an incident of its domain may still form."""
    if step not in HELD_STEPS:
        return None
    if (repair := running_by_tray(session).get(rem.node)) is not None:
        return IncidentHold(f"held by domain repair #{repair.id} ({repair.domain}): its domain's ladder acts for every "
                            "tray; this remediation re-checks its own signal when the repair ends", True)
    if rem.incident_id is not None:
        inc = session.get(Incident, rem.incident_id)
        if inc is not None and inc.status == IncidentStatus.OPEN:
            return IncidentHold(f"held by incident #{inc.id} ({inc.cause} {inc.name}): no machine action while it "
                                "is open; it closes when its nodes recover or a human resolves it", True)
    decided = step is Step.QUARANTINE and bool(rem.ctx.quarantine_decided)
    if ((step is Step.VM_RESTART and new_machine_action) or decided) and cfg.enabled and cfg.vm_grace_s > 0:
        due = aware(rem.opened_at) + timedelta(seconds=cfg.vm_grace_s)
        if now < due and domains_of(session, [rem.node]):
            what = "quarantining" if decided else "the first machine action"
            return IncidentHold(f"waiting until {due:%H:%M:%S} before {what} (incidents.vm_grace_s): "
                                "other nodes of its failure domains may be failing too", False, until=due)
    return None


# ----------------------------------------------------------------------------- closing it


def _release(session: Session, inc: Incident, now: datetime) -> list[FollowUp]:
    """Each member still open re-confirms its trigger before its next disruptive step."""
    out = []
    for rem in session.scalars(select(Remediation).where(
            Remediation.incident_id == inc.id, Remediation.status.in_(OPEN_STATUSES)).with_for_update()):
        rem.ctx = replace(rem.ctx, reconfirm=True, incident_closed=inc.id)
        rem.next_run_at, rem.wait_reason, rem.updated_at = now, None, now
        out.append(FollowUp(rem.id, rem.step))
    return out


def _close(session: Session, inc: Incident, status: IncidentStatus, *, actor: str, reason: str,
           now: datetime) -> list[FollowUp]:
    inc.status, inc.closed_at, inc.closed_by, inc.close_reason, inc.updated_at = status, now, actor, reason, now
    followups = _release(session, inc, now)
    audit(session, now, actor, action=INCIDENT_CLOSES[status], target=domain_key(inc.kind, inc.name),
          reason=f"incident #{inc.id} ({inc.cause} {inc.name}) {status}: {reason}",
          detail={"incident": inc.id,
                  "released": [f.remediation_id for f in followups]}, dry_run=bool(inc.dry_run))
    return followups


def resolve(session: Session, incident_id: int, actor: str, *, reason: str, now: datetime) -> list[FollowUp]:
    """A human closes an open incident (audited); its members go on on their own."""
    inc = session.get(Incident, incident_id, with_for_update=True)
    if inc is None:
        raise IncidentNotFound(f"no incident #{incident_id}")
    if inc.status != IncidentStatus.OPEN:
        raise IncidentError(f"incident #{incident_id} is already {inc.status}")
    return _close(session, inc, IncidentStatus.RESOLVED, actor=actor, reason=reason, now=now)


UNREACHABLE = ("", "not responding")  # the Slurm reasons of a node that stopped answering


def member_recovered(states: frozenset[str], flags: frozenset[str], reason_ours: bool) -> bool:
    """A member node answers again: not NOT_RESPONDING, not FAIL, and DOWN or drained only by us."""
    if SlurmState.NOT_RESPONDING in flags or states & slurm_states.FAILED:
        return False
    return reason_ours or not states & (slurm_states.DRAINED | {SlurmState.DOWN})


def _recovered(rem: Remediation, ad: Adapters, prefix: str) -> bool:
    """Has the signal that made this member fail cleared? Slurm can show it for a node that stopped
    answering (it answers again); a Kubernetes condition is read again. A DOWN or FAIL a human set
    with a reason of their own is not something Slurm can show ended once our drain replaced that
    reason: such an incident waits for a human's resolve."""
    ctx = rem.ctx
    if rem.source == Source.KUBERNETES:
        cond_type, bad = ctx.condition
        knode = ad.node_now(rem.node, ctx.k8s_node)
        now_status = knode.condition(cond_type) if knode else None
        return now_status is not None and now_status != bad
    if rem.source != Source.SLURM or (ctx.reason or "").strip().lower() not in UNREACHABLE:
        return False
    node = ad.slurm.get_node(rem.node)
    return member_recovered(node.states, node.flags, node.reason_is_ours(prefix))


def check_recovery(sessions: sessionmaker[Session], adapters: Adapters, settings: Settings,
                   *, clock: Clock) -> list[FollowUp]:
    """Close each open incident whose members all answer again (the sweeper runs this). A read error
    skips the incident this pass: an unreachable controller is never a verdict on the nodes."""
    with sessions() as s:
        todo = [(i.id, list(i.nodes or []), [r for r in s.scalars(select(Remediation).where(
                    Remediation.incident_id == i.id, Remediation.status.in_(OPEN_STATUSES)))])
                for i in s.scalars(select(Incident).where(Incident.status == IncidentStatus.OPEN))]
    out: list[FollowUp] = []
    prefix = settings.policy.our_reason_prefix
    for iid, nodes, members in todo:
        try:
            if not all(_recovered(rem, adapters, prefix) for rem in members):
                continue
        except RemediationError as exc:
            log.warning("incident #%s: cannot read its nodes (%s); looking again next pass", iid, exc)
            continue
        with sessions() as s, s.begin():
            inc = s.get(Incident, iid, with_for_update=True)
            if inc is not None and inc.status == IncidentStatus.OPEN:
                out += _close(s, inc, IncidentStatus.RECOVERED, actor=settings.actor,
                              reason=f"all {len(nodes)} nodes ({compress(nodes)}) answer again", now=clock.now())
    return out


# ---------------------------------------------------------------------------------- reading


def as_dict(inc: Incident, members: list[Remediation] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": inc.id, "domain": domain_key(inc.kind, inc.name), "kind": inc.kind, "name": inc.name,
        "cause": inc.cause, "status": inc.status, "nodes": list(inc.nodes or []), "node_count": len(inc.nodes or []),
        "domain_size": inc.domain_size, "opened_at": aware(inc.opened_at), "closed_at": aware(inc.closed_at),
        "closed_by": inc.closed_by, "close_reason": inc.close_reason, "dry_run": bool(inc.dry_run),
        "cluster": inc.cluster,
    }
    if members is not None:
        out["remediations"] = [
            {"id": r.id, "node": r.node, "status": r.status, "step": r.step, "wait_reason": r.wait_reason,
             "opened_at": aware(r.opened_at), "dry_run": bool(r.dry_run)} for r in members]
    return out


def list_incidents(session: Session, status: str | None = None, limit: int = 200,
                   *, dry_run: bool | None = None) -> list[dict[str, Any]]:
    query = select(Incident).order_by(Incident.id.desc()).limit(limit)
    if status == CLOSED:
        query = query.where(Incident.status != IncidentStatus.OPEN)
    elif status is not None:
        if status not in frozenset(IncidentStatus):
            raise IncidentError(f"unknown status {status!r} (open, closed, recovered, resolved)")
        query = query.where(Incident.status == status)
    if dry_run is not None:
        query = query.where(Incident.dry_run.is_(dry_run))
    return [as_dict(i) for i in session.scalars(query)]


def show(session: Session, incident_id: int) -> dict[str, Any]:
    inc = session.get(Incident, incident_id)
    if inc is None:
        raise IncidentNotFound(f"no incident #{incident_id}")
    members = list(session.scalars(
        select(Remediation).where(Remediation.incident_id == incident_id).order_by(Remediation.id)))
    out = as_dict(inc, members)
    out["likely_cause"] = likely_cause(inc.kind)
    return out


def counts(session: Session) -> dict[str, int]:
    """For /metrics: open incidents now, and every incident ever opened (real ones only)."""
    rows = dict(session.execute(select(Incident.status, func.count()).where(Incident.dry_run.is_(False))
                                .group_by(Incident.status)).all())
    return {"open": int(rows.get(IncidentStatus.OPEN, 0)), "total": int(sum(rows.values()))}


def counts_by_cluster(session: Session) -> dict[str, dict[str, int]]:
    """:func:`counts` of each cluster that has an incident: cluster -> {"open", "total"}."""
    out: dict[str, dict[str, int]] = {}
    for cluster, status, n in session.execute(
            select(Incident.cluster, Incident.status, func.count()).where(Incident.dry_run.is_(False))
            .group_by(Incident.cluster, Incident.status)):
        mine = out.setdefault(cluster, {"open": 0, "total": 0})
        mine["open"] += int(n) if status == IncidentStatus.OPEN else 0
        mine["total"] += int(n)
    return out
