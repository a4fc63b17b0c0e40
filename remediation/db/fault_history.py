"""The reads behind cause classification and lemon scoring, one query each.

:func:`app_xid_counts`: application-level XIDs per node within the repeat window (decided
``app_xid``). :func:`failure_history`: each node's real failures since its last human release within
the lemon horizon, with their class, counted as the repeat-offender rule counts, plus each GPU check
that failed after the node looked recovered.

Why: docs/policy.md#lemons-the-score
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Event, Node, Remediation, Validation
from remediation.db.queries import among
from remediation.domain.lemon import Failure
from remediation.domain.policy import DecisionKind
from remediation.domain.states import ValidationOutcome


def app_xid_counts(session: Session, nodes: Iterable[str], now: datetime, *, window: timedelta) -> dict[str,
    int]:
    rows = session.execute(
        select(Event.node, func.count()).where(
            among(session, Event.node, nodes), Event.decision == DecisionKind.APP_XID, Event.observed_at > now - window)
        .group_by(Event.node))
    return {node: int(n) for node, n in rows}


def failure_history(session: Session, nodes: Iterable[str] | None, now: datetime,
                    *, horizon: timedelta) -> dict[str, list[Failure]]:
    """Per node (all nodes when ``nodes`` is None), oldest first. Keyed by name: for a session scoped to
    one cluster (the policy's); across clusters, :func:`failure_history_by_node`."""
    out: dict[str, list[Failure]] = {}
    for (_cluster, node), failures in failure_history_by_node(session, nodes, now, horizon=horizon).items():
        out.setdefault(node, []).extend(failures)
    for failures in out.values():
        failures.sort(key=lambda f: f.at)
    return out


def failure_history_by_node(session: Session, nodes: Iterable[str] | None, now: datetime, *,
                            horizon: timedelta, cluster: str | None = None) -> dict[tuple[str, str], list[Failure]]:
    """Per (cluster, node) (all nodes when ``nodes`` is None; of ``cluster`` alone when given), oldest
    first: two clusters' nodes of one name are two histories."""
    q = (select(Remediation.cluster, Remediation.node, Remediation.opened_at, Remediation.fault_class)
         .join(Node, (Node.cluster == Remediation.cluster) & (Node.name == Remediation.node))
         .where(Remediation.opened_at > now - horizon, Remediation.dry_run.is_(False),
                Remediation.incident_id.is_(None),  # a node's part in a correlated incident is not its fault
                or_(Node.released_at.is_(None), Remediation.opened_at > Node.released_at))
         .order_by(Remediation.opened_at))
    if nodes is not None:
        q = q.where(among(session, Remediation.node, nodes))
    if cluster is not None:
        q = q.where(Remediation.cluster == cluster)
    out: dict[tuple[str, str], list[Failure]] = {}
    for c, node, opened, cls in session.execute(q):
        out.setdefault((c, node), []).append(Failure(aware(opened), cls))
    # A GPU check that failed after the node looked recovered (validate before return) is evidence
    # against the node as much as the failure that opened its remediation: it weighs as one more.
    v = (select(Validation.cluster, Validation.node, Validation.finished_at, Remediation.fault_class)
         .join(Remediation, Remediation.id == Validation.remediation_id)
         .join(Node, (Node.cluster == Validation.cluster) & (Node.name == Validation.node))
         .where(Validation.outcome == ValidationOutcome.FAILED, Validation.dry_run.is_(False),
                Validation.finished_at > now - horizon, Remediation.incident_id.is_(None),
                or_(Node.released_at.is_(None), Validation.finished_at > Node.released_at)))
    if nodes is not None:
        v = v.where(among(session, Validation.node, nodes))
    if cluster is not None:
        v = v.where(Validation.cluster == cluster)
    for c, node, finished, cls in session.execute(v):
        out.setdefault((c, node), []).append(Failure(aware(finished), cls))
    for failures in out.values():
        failures.sort(key=lambda f: f.at)
    return out


def failures_of(session: Session, ids: Iterable[int], now: datetime, *, horizon: timedelta) -> dict[int, Failure]:
    """Remediation id -> the failure it was, for those of ``ids`` that count (real, not part of an
    incident, within the horizon), in whichever cluster: the failures hardware carries with it."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    q = (select(Remediation.id, Remediation.opened_at, Remediation.fault_class)
         .where(Remediation.id.in_(wanted), Remediation.dry_run.is_(False), Remediation.incident_id.is_(None),
                Remediation.opened_at > now - horizon)
         .execution_options(all_clusters=True))
    return {rid: Failure(aware(opened), cls) for rid, opened, cls in session.execute(q)}
