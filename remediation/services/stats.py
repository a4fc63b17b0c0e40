"""Failure statistics for on-call and capacity reviews: by node, by cause, by day, time to recovery,
and the repeat offenders that are about to be (or already are) quarantined.

"Cause" is the class of the signal that opened the remediation (``slurm FAIL``, ``kubernetes
Ready=False``; ``manual quarantine`` without an event), not its reason text. Counts run in SQL, day
buckets in Python (Postgres and SQLite alike), over a window bounded by ``days``.

Why: docs/architecture.md#one-lever-service-one-set-of-read-models
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from remediation.clock import aware
from remediation.db.models import Event, Node, Remediation
from remediation.domain.statemachine import RemediationStatus
from remediation.services.readmodels import ReadModelError
from remediation.vocabulary import DEFAULT_CLUSTER


@dataclass
class Count:
    key: str
    count: int
    cluster: str | None = None  # by node: the node's cluster (two clusters' gpu-node-0 are two rows)


@dataclass
class Offender:
    node: str
    failures: int
    status: str
    last_failure_at: datetime
    cluster: str = DEFAULT_CLUSTER


@dataclass
class Stats:
    since: datetime
    days: int
    total: int
    by_node: list[Count]
    by_cause: list[Count]
    by_day: list[Count]
    outcomes: dict[str, int]
    mttr_s: float | None  # mean opened -> closed of succeeded remediations
    mttr_samples: int
    repeat_window_s: int
    offenders: list[Offender]
    dry_run: int = 0  # dry-run remediations in the window (counted above only with include_dry_run)
    include_dry_run: bool = False
    profile: str | None = None  # only the remediations opened under this profile


@dataclass(frozen=True)
class StatsQuery:
    """What a reader asks of the history: the last ``days``, ``top`` rows per ranking, what dry-run
    recorded too (``include_dry_run``, a shadow profile's included), only what opened under ``profile``."""

    days: int = 30
    top: int = 10
    include_dry_run: bool = False
    profile: str | None = None


def stats(s: Session, now: datetime, query: StatsQuery = StatsQuery(), *,
          repeat_window: timedelta = timedelta(days=7)) -> Stats:
    """Real history by default. Repeat offenders are always counted as the policy counts them
    (``repeat_window``), without dry-run."""
    days, top, include_dry_run, profile = query.days, query.top, query.include_dry_run, query.profile
    if days < 1 or days > 3650:
        raise ReadModelError(f"--days must be between 1 and 3650 (got {days})")
    if top < 1 or top > 1000:
        raise ReadModelError(f"--top must be between 1 and 1000 (got {top})")
    since = now - timedelta(days=days)
    opened = and_(Remediation.opened_at > since, *([Remediation.profile == profile] if profile else []))
    in_window = opened if include_dry_run else and_(opened, Remediation.dry_run.is_(False))
    dry = int(s.scalar(select(func.count()).where(opened, Remediation.dry_run.is_(True))) or 0)

    by_node = [Count(n, int(c), cluster) for cluster, n, c in s.execute(
        select(Remediation.cluster, Remediation.node, func.count()).where(in_window)
        .group_by(Remediation.cluster, Remediation.node)
        .order_by(func.count().desc(), Remediation.node, Remediation.cluster).limit(top))]

    causes: Counter[str] = Counter()
    rows = s.execute(
        select(Event.source, Event.state, func.count()).select_from(Remediation)
        .outerjoin(Event, Event.id == Remediation.event_id).where(in_window)
        .group_by(Event.source, Event.state))
    for source, state, n in rows:
        causes["manual quarantine" if source is None else f"{source} {state}"] += int(n)
    by_cause = [Count(k, v) for k, v in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]

    days_count: Counter[str] = Counter(
        aware(at).date().isoformat()
        for at in s.scalars(select(Remediation.opened_at).where(in_window)))
    by_day = [Count(d, n) for d, n in sorted(days_count.items())]

    outcomes = {st.value: 0 for st in RemediationStatus}
    for status, n in s.execute(select(Remediation.status, func.count()).where(in_window)
                               .group_by(Remediation.status)):
        outcomes[status] = int(n)

    durations = [
        (aware(closed) - aware(opened)).total_seconds()  # type: ignore[operator]
        for opened, closed in s.execute(
            select(Remediation.opened_at, Remediation.closed_at).where(
                in_window, Remediation.status == RemediationStatus.SUCCEEDED,
                Remediation.closed_at.is_not(None)))
    ]
    mttr = round(sum(durations) / len(durations), 3) if durations else None

    return Stats(since=since, days=days, total=sum(outcomes.values()), by_node=by_node,
                 by_cause=by_cause, by_day=by_day, outcomes=outcomes, mttr_s=mttr,
                 mttr_samples=len(durations), repeat_window_s=int(repeat_window.total_seconds()),
                 offenders=offenders(s, now, repeat_window, top=top, profile=profile), dry_run=dry,
                 include_dry_run=include_dry_run, profile=profile)


def offenders(s: Session, now: datetime, window: timedelta, *, top: int = 10,
              profile: str | None = None) -> list[Offender]:
    """Nodes with two or more failures in the repeat-offender window, counted the way the policy
    counts them (failures before a human release are forgiven), worst first."""
    n = func.count().label("n")
    rows = s.execute(
        select(Remediation.cluster, Remediation.node, n, func.max(Remediation.opened_at), Node.status)
        .join(Node, (Node.cluster == Remediation.cluster) & (Node.name == Remediation.node))
        .where(Remediation.opened_at > now - window, Remediation.dry_run.is_(False),
               or_(Node.released_at.is_(None), Remediation.opened_at > Node.released_at),
               *([Remediation.profile == profile] if profile else []))
        .group_by(Remediation.cluster, Remediation.node, Node.status)
        .having(func.count() >= 2)
        .order_by(n.desc(), Remediation.node, Remediation.cluster).limit(top))
    return [Offender(node, int(c), status, aware(last), cluster) for cluster, node, c, last, status in rows]
