"""On-call reads of fault intelligence (cause classification, lemon scoring): each node's lemon
score with its explanation, and the ``stats --lemons`` ranking. The score is computed on read, one
query for every node, the same way the policy computes it when it decides. Hardware carries its
failures with it: a node whose current hardware failed in another cluster (:func:`hardware_flags`)
scores those failures too, and says so.

Why: docs/policy.md#lemons-the-score
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from remediation.db.fault_history import failure_history, failure_history_by_node, failures_of
from remediation.db.models import Node
from remediation.db.scope import scope_of
from remediation.domain.lemon import Failure, LemonScore, score
from remediation.services.hardware import HardwareFlag, hardware_flags
from remediation.settings import LemonSettings
from remediation.vocabulary import DEFAULT_CLUSTER, node_label


@dataclass
class LemonRow:
    node: str  # its name; ``cluster/name`` in a ranking over several clusters
    status: str
    score: float
    failures: int
    distinct_causes: int
    over_threshold: bool
    explanation: str
    cluster: str = DEFAULT_CLUSTER
    hardware: str = ""  # which of its hardware failed in another cluster, and where ("" when none)


def spans_clusters(s: Session, cluster: str | None = None) -> bool:
    """Whether a figure of this session's view (of ``cluster`` alone, when given) spans several clusters:
    then it names a node ``cluster/name``; over one, by its name alone."""
    return cluster is None and len(set(s.scalars(select(Node.cluster).distinct()))) > 1


def lemon_scores(s: Session, now: datetime, cfg: LemonSettings,
                 *, nodes: Iterable[str] | None = None) -> dict[str, LemonScore]:
    """Score of every node with counted failures (all nodes, or ``nodes``), by name: for one cluster's
    view; across clusters, :func:`fleet_scores`."""
    history = failure_history(s, None if nodes is None else list(nodes), now,
                              horizon=timedelta(seconds=cfg.horizon_s))
    return {node: score(failures, now, cfg) for node, failures in history.items()}


Flags = dict[tuple[str, str], HardwareFlag]


def fleet_scores(s: Session, now: datetime, cfg: LemonSettings, *, cluster: str | None = None,
                 every_flag: Flags | None = None) -> tuple[dict[tuple[str, str], LemonScore], Flags]:
    """(cluster, node) -> score, of every node with counted failures (of ``cluster`` alone, when given),
    each counting the failures its current hardware had in other clusters; and the flags that say so.
    ``every_flag``: :func:`hardware_flags` at ``now``, when the caller has it already (it reads every
    sighting of the fleet: the reliability report's costliest read)."""
    horizon = timedelta(seconds=cfg.horizon_s)
    history = failure_history_by_node(s, None, now, horizon=horizon, cluster=cluster)
    only = cluster or scope_of(s)  # the flags of the nodes this view scores (hardware_flags sees every cluster)
    every_flag = hardware_flags(s, now) if every_flag is None else every_flag
    flags = {k: f for k, f in every_flag.items() if only is None or k[0] == only}
    carried = failures_of(s, (f.remediation_id for flag in flags.values() for f in flag.failures), now,
                          horizon=horizon)
    for key, flag in flags.items():
        extra: list[Failure] = [carried[f.remediation_id] for f in flag.failures if f.remediation_id in carried]
        if extra:
            history[key] = sorted([*history.get(key, []), *extra], key=lambda f: f.at)
    return {key: score(failures, now, cfg) for key, failures in history.items()}, flags


def lemons(s: Session, now: datetime, cfg: LemonSettings, *, top: int = 10,
           cluster: str | None = None, every_flag: Flags | None = None) -> list[LemonRow]:
    """Nodes by lemon score, worst first (only nodes with counted failures; of ``cluster`` alone when
    given). Over several clusters, a row names its node ``cluster/name``."""
    scores, flags = fleet_scores(s, now, cfg, cluster=cluster, every_flag=every_flag)
    fleet = spans_clusters(s, cluster)
    # Ranked before anything else is read: only the top rows need their node's status and explanation.
    ranked = sorted(((node_label(c, node, fleet=fleet), (c, node), sc) for (c, node), sc in scores.items()
                     if sc.failures), key=lambda r: (-r[2].score, r[0]))[:top]
    q = select(Node.cluster, Node.name, Node.status).where(Node.name.in_(sorted({n for _, (_, n), _ in ranked})))
    status = {(c, n): st for c, n, st in s.execute(q)}
    rows = []
    for label, (c, node), sc in ranked:
        hardware = flags[c, node].summary if (c, node) in flags else ""
        why = f"{sc.explanation}; counted with its hardware's failures elsewhere: {hardware}" if hardware else sc.explanation
        rows.append(LemonRow(label, status.get((c, node), "-"), sc.score, sc.failures, sc.distinct, sc.over(cfg),
                             why, cluster=c, hardware=hardware))
    return rows
