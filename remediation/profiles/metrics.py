"""The profiles' Prometheus series, read from the database at scrape time (profiles are few, so a
``profile`` label stays a handful of series; a node that no profile governs counts under ``(base)``).
Each series also carries the ``cluster`` its rows belong to.

- ``remediation_profile_nodes{profile}``: the nodes each profile governs now (its pool);
- ``remediation_profile_remediations_open{profile,dry_run}``: remediations in flight, a shadow
  profile's marked ``dry_run="true"``;
- ``remediation_profile_remediations_total{profile,outcome}``: closed remediations by final status
  (dry-run ones excluded);
- ``remediation_profile_breaker_open{profile}``: 1 while that profile's own storm breaker is latched
  (the fleet's is ``remediation_breaker_open``).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from remediation.db.models import Control, Node, Remediation
from remediation.db.queries import BREAKER
from remediation.domain.controls import BreakerLatch
from remediation.domain.statemachine import OPEN_STATUSES

BASE = "(base)"


def profile_metrics(s: Session) -> Iterable[Metric]:
    nodes = GaugeMetricFamily(
        "remediation_profile_nodes", "Nodes each profile governs now", labels=["cluster", "profile"]
    )
    for cluster, profile, n in s.execute(
        select(Node.cluster, Node.profile, func.count()).group_by(Node.cluster, Node.profile)
    ):
        nodes.add_metric([cluster, profile or BASE], n)
    yield nodes
    opened = GaugeMetricFamily(
        "remediation_profile_remediations_open",
        "Open remediations by the profile they opened under (dry_run: a shadow profile's, recording only)",
        labels=["cluster", "profile", "dry_run"],
    )
    closed = CounterMetricFamily(
        "remediation_profile_remediations",
        "Closed remediations (dry-run excluded) by the profile they opened under and their outcome",
        labels=["cluster", "profile", "outcome"],
    )
    r = Remediation
    for cluster, profile, status, dry, n in s.execute(
        select(r.cluster, r.profile, r.status, r.dry_run, func.count()).group_by(
            r.cluster, r.profile, r.status, r.dry_run
        )
    ):
        if status in OPEN_STATUSES:
            opened.add_metric([cluster, profile or BASE, "true" if dry else "false"], n)
        elif not dry:
            closed.add_metric([cluster, profile or BASE, status], n)
    yield opened
    yield closed
    latched = GaugeMetricFamily(
        "remediation_profile_breaker_open",
        "1 while a profile's own storm breaker holds its pool's machine actions",
        labels=["cluster", "profile"],
    )
    # Each profile's latch is the control row ``breaker:NAME`` of its cluster.
    for cluster, key, value in s.execute(
        select(Control.cluster, Control.key, Control.value).where(Control.key.startswith(f"{BREAKER}:"))
    ):
        latched.add_metric([cluster, key.split(":", 1)[1]], 1 if BreakerLatch.load(value).open else 0)
    yield latched
