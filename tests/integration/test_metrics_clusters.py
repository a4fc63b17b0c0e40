"""/metrics over two clusters in one database that share node names (real Postgres): every series read
from the database carries its cluster, each cluster's figures are its own, and a cluster with nothing
open still has its zero series."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import FakeClock
from remediation.db.models import Node, Remediation
from remediation.db.queries import BREAKER, PAUSED, control_set
from remediation.db.scope import scoped
from remediation.domain.events import Source
from remediation.domain.statemachine import NodeStatus, RemediationStatus, Step
from remediation.services.metrics import make_registry

NOW = datetime(2026, 11, 3, tzinfo=UTC)


def seed(sessions: sessionmaker[Session]) -> None:
    """west: gpu-node-0 quarantined, gpu-node-1 healthy, one remediation open at slurm_drain, paused.
    east: the same names, both healthy, one remediation succeeded, its breaker latched open."""
    for cluster, statuses in (("west", (NodeStatus.QUARANTINED, NodeStatus.HEALTHY)),
                              ("east", (NodeStatus.HEALTHY, NodeStatus.HEALTHY))):
        with scoped(sessions, cluster)() as s, s.begin():
            for i, status in enumerate(statuses):
                s.add(Node(name=f"gpu-node-{i}", status=status, first_seen_at=NOW - timedelta(days=1), updated_at=NOW))
            open_ = cluster == "west"
            s.add(Remediation(node="gpu-node-1", cause="xid 79", source=Source.SLURM,
                              status=RemediationStatus.WAITING if open_ else RemediationStatus.SUCCEEDED,
                              step=Step.SLURM_DRAIN if open_ else Step.DONE, opened_at=NOW - timedelta(hours=1),
                              updated_at=NOW, next_run_at=NOW - timedelta(minutes=10) if open_ else None,
                              closed_at=None if open_ else NOW))
            if open_:
                control_set(s, PAUSED, {"paused": True}, now=NOW)
            else:
                control_set(s, BREAKER, {"open": True, "reason": "3/20 nodes failed", "at": NOW.isoformat()}, now=NOW)


def test_every_series_names_its_cluster(sessions: sessionmaker[Session]) -> None:
    seed(sessions)
    registry = make_registry(sessions, clock=FakeClock(NOW))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("remediation_nodes", cluster="west", status="quarantined") == 1
    assert value("remediation_nodes", cluster="west", status="healthy") == 1
    assert value("remediation_nodes", cluster="east", status="healthy") == 2
    assert value("remediation_nodes", cluster="east", status="quarantined") == 0  # a series, not a gap
    assert value("remediation_quarantined_nodes", cluster="west") == 1
    assert value("remediation_quarantined_nodes", cluster="east") == 0
    assert value("remediation_remediations_open", cluster="west", status="waiting", step="slurm_drain") == 1
    assert value("remediation_remediations_open", cluster="east", status="waiting", step="slurm_drain") is None
    assert value("remediation_remediations_total", cluster="east", outcome="succeeded") == 1
    assert value("remediation_remediations_total", cluster="west", outcome="succeeded") == 0
    assert value("remediation_paused", cluster="west") == 1 and value("remediation_paused", cluster="east") == 0
    assert value("remediation_breaker_open", cluster="east") == 1
    assert value("remediation_breaker_open", cluster="west") == 0
    assert value("remediation_breaker_open_info", cluster="east", reason="3/20 nodes failed",
                 since=NOW.isoformat()) == 1
    assert value("remediation_workflow_lag_seconds", cluster="west") == 600
    assert value("remediation_workflow_lag_seconds", cluster="east") == 0
    assert value("remediation_oldest_open_seconds", cluster="west", step="slurm_drain") == 3600
    assert value("remediation_oldest_open_seconds", cluster="east", step="slurm_drain") == 0
    assert value("remediation_profile_nodes", cluster="east", profile="(base)") == 2
    assert value("remediation_incidents_open", cluster="east") == 0
    # No series read from the database lacks its cluster.
    for metric in registry.collect():
        for sample in metric.samples:
            if metric.name not in ("remediation_database_up", "remediation_queue_depth"):
                assert sample.labels.get("cluster") in ("west", "east"), (metric.name, sample.labels)
