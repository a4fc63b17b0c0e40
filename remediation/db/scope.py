"""Sessions scoped to one cluster: a worker acting for cluster A cannot read or write B's rows.

A scoped session's ORM ``SELECT``, ``UPDATE`` and ``DELETE`` get ``cluster = A`` on every
:class:`ClusterScoped` table they name, and its new rows are written to A; SQL text and upserts name
the cluster themselves (:func:`cluster_of`). An unscoped session (the on-call views) sees every
cluster. ``execution_options(all_clusters=True)`` lets one statement see every cluster.

Why: docs/architecture.md#one-service-many-clusters
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker, with_loader_criteria

from remediation.db.models import ClusterScoped
from remediation.vocabulary import DEFAULT_CLUSTER, checked_cluster

INFO_KEY = "cluster"


def scoped(sessions: sessionmaker[Session], cluster: str) -> sessionmaker[Session]:
    """A session factory like ``sessions`` whose sessions see and write ``cluster``'s rows only."""
    info = {**(sessions.kw.get("info") or {}), INFO_KEY: checked_cluster(cluster)}  # keeps e.g. the audit door
    made: sessionmaker[Session] = sessionmaker(**{**sessions.kw, "info": info})
    return made


def scope_of(session: Session) -> str | None:
    """The cluster ``session`` is scoped to; None for an unscoped session (it sees every cluster)."""
    value = session.info.get(INFO_KEY)
    return str(value) if value is not None else None


def cluster_of(session: Session) -> str:
    """The cluster a row written by ``session`` belongs to: its scope, else ``default``."""
    return scope_of(session) or DEFAULT_CLUSTER


@contextmanager
def narrowed(session: Session, cluster: str) -> Iterator[Session]:
    """``session`` scoped to ``cluster`` for the ``with`` block (an on-call read that asks one
    cluster's question, such as a score by node name); a session scoped elsewhere is refused."""
    before = scope_of(session)
    if before is not None and before != cluster:
        raise ValueError(f"a session scoped to cluster {before!r} cannot read cluster {cluster!r}")
    session.info[INFO_KEY] = checked_cluster(cluster)
    try:
        yield session
    finally:
        if before is None:
            session.info.pop(INFO_KEY, None)


@event.listens_for(Session, "do_orm_execute")
def _filter_by_scope(state: ORMExecuteState) -> Any:
    cluster = scope_of(state.session)
    if cluster is None or state.execution_options.get("all_clusters"):
        return None
    if state.is_insert and isinstance(state.parameters, list):
        return state.invoke_statement(params=[{INFO_KEY: cluster, **row} for row in state.parameters])
    if state.is_select or ((state.is_update or state.is_delete) and not isinstance(state.parameters, list)):
        # An UPDATE by primary key (a list of rows) names each row fully: its key carries the cluster.
        state.statement = state.statement.options(with_loader_criteria(
            ClusterScoped, lambda cls: cls.cluster == cluster, include_aliases=True))
    return None


@event.listens_for(Session, "before_flush")
def _new_rows_in_scope(session: Session, _flush: UOWTransaction, _instances: Any) -> None:
    cluster = scope_of(session)
    if cluster is None:
        return
    for row in session.new:
        if isinstance(row, ClusterScoped) and getattr(row, "cluster", None) is None:
            row.cluster = cluster
