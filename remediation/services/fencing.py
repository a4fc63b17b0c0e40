"""The ingest's fence: drop what a replaced leader published, keeping the highest tokens in Postgres.

The rule is :func:`remediation.domain.fencing.sort_by_fence`; this module reads the highest token per
lock from ``leader_fences``, locked (``FOR UPDATE``, in lock-name order) for the rest of the ingest's
transaction, and writes back what a batch raised. Fenced events go to ``rejected_events`` with both
tokens, counted in ``leader_fences.fenced``.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from remediation.db.models import LeaderFence
from remediation.db.scope import cluster_of
from remediation.domain.events import NodeEvent
from remediation.domain.fencing import sort_by_fence

log = logging.getLogger(__name__)


def fence_events(
    session: Session, events: Sequence[NodeEvent], now: datetime
) -> tuple[list[NodeEvent], list[tuple[str, str]]]:
    """(the events that count, (payload, why) of each one a replaced leader published)."""
    locks = sorted({ev.fence.lock for ev in events if ev.fence is not None})
    if not locks:
        return list(events), []
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(
        dialect.insert(LeaderFence)
        .values([{"cluster": cluster_of(session), "lock": lock, "token": 0, "fenced": 0, "raised_at": now}
                 for lock in locks])
        .on_conflict_do_nothing(index_elements=["cluster", "lock"])
    )
    highest = {
        lock: token
        for lock, token in session.execute(
            select(LeaderFence.lock, LeaderFence.token)
            .where(LeaderFence.lock.in_(locks))
            .order_by(LeaderFence.lock)
            .with_for_update()
        )
    }
    result = sort_by_fence(events, highest)
    fenced = Counter(ev.fence.lock for ev, _ in result.stale if ev.fence is not None)
    for lock in locks:
        if result.highest[lock] != highest[lock] or fenced[lock]:
            session.execute(
                update(LeaderFence)
                .where(LeaderFence.lock == lock)
                .values(
                    token=result.highest[lock],
                    fenced=LeaderFence.fenced + fenced[lock],
                    **({"raised_at": now} if result.highest[lock] != highest[lock] else {}),
                )
            )
    for lock, n in fenced.items():
        log.warning(
            "dropped %d event(s) a replaced %s leader published (token below %d)",
            n,
            lock,
            result.highest[lock],
        )
    return result.kept, [
        (
            ev.to_json(),
            f"fenced: published under {ev.fence.lock} leader token {ev.fence.token} after "
            f"token {above} was recorded; a newer leader had taken over",
        )
        for ev, above in result.stale
        if ev.fence is not None
    ]
