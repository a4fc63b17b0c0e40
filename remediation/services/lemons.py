"""On-call reads of fault intelligence (cause classification, lemon scoring): each node's lemon
score with its explanation, and the ``stats --lemons`` ranking. The score is computed on read, one
query for every node, the same way the policy computes it when it decides, so the number on-call sees
is the number the next failure will be judged by.

Why: docs/policy.md#lemons-the-score
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.fault_history import failure_history
from remediation.db.models import Node
from remediation.domain.lemon import LemonScore, score
from remediation.settings import LemonSettings


@dataclass
class LemonRow:
    node: str
    status: str
    score: float
    failures: int
    distinct_causes: int
    over_threshold: bool
    explanation: str


def lemon_scores(s: Session, now: datetime, cfg: LemonSettings,
                 *, nodes: Iterable[str] | None = None) -> dict[str, LemonScore]:
    """Score of every node with counted failures (all nodes, or ``nodes``)."""
    history = failure_history(s, None if nodes is None else list(nodes), now,
                              horizon=timedelta(seconds=cfg.horizon_s))
    return {node: score(failures, now, cfg) for node, failures in history.items()}


def lemons(s: Session, now: datetime, cfg: LemonSettings, *, top: int = 10) -> list[LemonRow]:
    """Nodes by lemon score, worst first (only nodes with counted failures)."""
    scores = lemon_scores(s, now, cfg)
    status = dict(s.execute(select(Node.name, Node.status).where(Node.name.in_(list(scores)))).all())
    rows = [LemonRow(node, status.get(node, "-"), sc.score, sc.failures, sc.distinct, sc.over(cfg), sc.explanation)
            for node, sc in scores.items() if sc.failures]
    return sorted(rows, key=lambda r: (-r.score, r.node))[:top]
