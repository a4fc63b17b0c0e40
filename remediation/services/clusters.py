"""Which clusters one database holds, each one's state, and which cluster a node name means.

An unscoped session sees every cluster, so a name alone may mean two nodes (two clusters' ``gpu-node-0``).
:func:`node_cluster` resolves it: the cluster asked for, else the only one holding the name; a name in
several clusters is :class:`AmbiguousNode`, never a guess. :func:`cluster_states` is the on-call view
of every cluster: paused, breaker latched, open remediations, node counts.

Why: docs/on-call.md#many-clusters
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from remediation.db.models import Control, DomainRepair, Incident, Node, Remediation
from remediation.db.queries import BREAKER, PAUSED
from remediation.db.scope import scope_of
from remediation.domain.controls import BreakerLatch, PauseState
from remediation.domain.statemachine import OPEN_STATUSES, QUARANTINE_STATUSES, NodeStatus
from remediation.services.read_rows import ClusterState
from remediation.services.readmodels import ReadModelError, RecordNotFound
from remediation.vocabulary import checked_cluster


class AmbiguousNode(ReadModelError):
    """A node name held by several clusters, asked for without naming one."""

    def __init__(self, name: str, clusters: Iterable[str]) -> None:
        self.clusters = sorted(clusters)
        super().__init__(f"node {name!r} is in several clusters ({', '.join(self.clusters)}): "
                         "pass --cluster (API: ?cluster=) to say which")


def checked(cluster: str | None) -> str | None:
    """A cluster filter as given (None: every cluster); a bad name is a :class:`ReadModelError`."""
    if cluster is None or cluster == "":
        return None
    try:
        return checked_cluster(cluster)
    except ValueError as exc:
        raise ReadModelError(str(exc)) from None


def known_clusters(s: Session, configured: Iterable[str] = ()) -> list[str]:
    """Every cluster the configuration names or the database holds a node or a control row of."""
    names = set(configured)
    names.update(s.scalars(select(Node.cluster).distinct().execution_options(all_clusters=True)))
    names.update(s.scalars(select(Control.cluster).distinct().execution_options(all_clusters=True)))
    return sorted(names)


def node_cluster(s: Session, name: str, cluster: str | None = None) -> str:
    """The cluster holding node ``name``: ``cluster`` (or the session's scope) if it has it, else the
    only cluster that does. :class:`RecordNotFound` if none, :class:`AmbiguousNode` if several."""
    wanted = checked(cluster) or scope_of(s)
    q = select(Node.cluster).where(Node.name == name).execution_options(all_clusters=True)
    found = sorted(s.scalars(q if wanted is None else q.where(Node.cluster == wanted)))
    if not found:
        where = f" in cluster {wanted!r}" if wanted else ""
        raise RecordNotFound(f"unknown node {name!r}{where} (see `remediation nodes list`)")
    if len(found) > 1:
        raise AmbiguousNode(name, found)
    return found[0]


def remediation_cluster(s: Session, remediation_id: int, cluster: str | None = None) -> str:
    """The cluster remediation ``remediation_id`` belongs to (ids are unique across clusters); with
    ``cluster``, :class:`RecordNotFound` unless it is that one."""
    return _owner(s, Remediation, remediation_id, cluster=cluster, what="remediation")


def incident_cluster(s: Session, incident_id: int, cluster: str | None = None) -> str:
    """The cluster incident ``incident_id`` belongs to, as :func:`remediation_cluster`."""
    return _owner(s, Incident, incident_id, cluster=cluster, what="incident")


def repair_cluster(s: Session, repair_id: int, cluster: str | None = None) -> str:
    """The cluster domain repair ``repair_id`` belongs to, as :func:`remediation_cluster`."""
    return _owner(s, DomainRepair, repair_id, cluster=cluster, what="domain repair")


def _owner(s: Session, table: type[Remediation] | type[Incident] | type[DomainRepair], row_id: int, *,
           cluster: str | None, what: str) -> str:
    wanted = checked(cluster) or scope_of(s)
    found = s.scalar(select(table.cluster).where(table.id == row_id).execution_options(all_clusters=True))
    if found is None or (wanted is not None and found != wanted):
        where = f" in cluster {wanted!r}" if wanted else ""
        listing = "domains" if table is DomainRepair else f"{what}s"
        raise RecordNotFound(f"no {what} #{row_id}{where} (see `remediation {listing} list`)")
    return str(found)


def cluster_states(s: Session, names: Iterable[str]) -> list[ClusterState]:
    """Each of ``names`` with its state, in name order: four grouped queries, whatever the count."""
    states = {n: ClusterState(n) for n in names}
    every = {"all_clusters": True}
    for cl, status, n in s.execute(select(Node.cluster, Node.status, func.count())
                                   .group_by(Node.cluster, Node.status).execution_options(**every)):
        st = states.setdefault(cl, ClusterState(cl))
        st.nodes += int(n)
        if status in (NodeStatus.UNHEALTHY, NodeStatus.REMEDIATING):
            st.unhealthy += int(n)
        elif status in QUARANTINE_STATUSES:
            st.quarantined += int(n)
    for cl, n in s.execute(select(Remediation.cluster, func.count()).where(
            Remediation.status.in_(OPEN_STATUSES)).group_by(Remediation.cluster).execution_options(**every)):
        states.setdefault(cl, ClusterState(cl)).open_remediations = int(n)
    for cl, key, value in s.execute(select(Control.cluster, Control.key, Control.value).where(
            Control.key.in_([PAUSED, BREAKER])).execution_options(**every)):
        st = states.setdefault(cl, ClusterState(cl))
        if key == PAUSED:
            st.paused, st.paused_detail = bool(PauseState.load(value).paused), dict(value or {})
        else:
            st.breaker_open, st.breaker_detail = bool(BreakerLatch.load(value).open), dict(value or {})
    scope = scope_of(s)
    return [states[n] for n in sorted(states) if scope is None or n == scope]


def paused_anywhere(states: Iterable[ClusterState]) -> ClusterState | None:
    """The first paused cluster among ``states`` (None: automation runs everywhere)."""
    return next((st for st in states if st.paused), None)
