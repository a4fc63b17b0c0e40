"""Which nodes make up the pool the storm breaker divides by: the ones a watcher's resync confirmed.

A watcher's ``inventory`` event stamps ``nodes.confirmed_at`` on the ingest's clock; the pool is the
nodes confirmed within ``policy.pool_stale_s`` of the latest confirmation. Until anything has been
confirmed, every row counts.

Why: docs/policy.md#storm-breaker-more-than-10-of-the-pool-within-10-minutes-at-least-3-nodes
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from remediation.db.models import Node
from remediation.db.queries import confirmed_since
from remediation.domain.events import EventKind, NodeEvent, Source

#: The sources whose inventory is a confirmation: what each watcher read from its own system.
CONFIRMING = frozenset({Source.SLURM, Source.KUBERNETES})


def confirm_nodes(session: Session, events: Iterable[NodeEvent], now: datetime) -> int:
    """Stamp ``confirmed_at`` on the nodes a watcher's inventory lists; returns how many."""
    names = sorted({ev.node for ev in events if ev.kind == EventKind.INVENTORY and ev.source in CONFIRMING})
    if names:
        session.execute(update(Node).where(Node.name.in_(names)).values(confirmed_at=now))
    return len(names)


@dataclass(frozen=True)
class PoolMembership:
    """The rows and how many of them the breaker counts (``counted``), for status pages."""

    rows: int
    confirmed: int  # listed by a resync within pool_stale_s
    stale: int  # confirmed once, not listed within pool_stale_s: left the pool
    unconfirmed: int  # never listed by a watcher: never in the pool
    counted: int  # the breaker's denominator (every row until anything is confirmed)


def membership(session: Session, stale_after: timedelta) -> PoolMembership:
    since = confirmed_since(session, stale_after)
    rows, confirmed, ever = session.execute(
        select(func.count(), func.count().filter(Node.confirmed_at >= since), func.count(Node.confirmed_at))
        .select_from(Node)
    ).one()
    counted = confirmed if ever else rows
    return PoolMembership(rows, confirmed, ever - confirmed, rows - ever, counted)
