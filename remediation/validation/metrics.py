"""The validation's Prometheus series, read from the ``validations`` table at scrape time.

- ``remediation_validations_total{outcome,backend}``: checks run (passed, failed, timeout, no_result,
  cannot_run); dry-run rows are not counted;
- ``remediation_validation_pass_rate``: passed / (passed + failed), the share of nodes whose GPUs the
  validation found good after a remediation (NaN before the first verdict);
- ``remediation_validation_duration_seconds{outcome}``: histogram of how long checks took, set-up
  included (``dcgmi diag -r 2`` normally runs about 2 minutes, ``-r 3`` about 15).

Each series also carries the ``cluster`` the checked node belongs to.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from remediation.db.models import Validation
from remediation.domain.states import ValidationOutcome

BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)


def validation_metrics(s: Session, clusters: Iterable[str] = ()) -> Iterable[Metric]:
    """The series, per cluster; each of ``clusters`` has a pass rate (NaN before its first verdict)."""
    total = CounterMetricFamily("remediation_validations", "GPU checks run by the validation",
                                labels=["cluster", "outcome", "backend"])
    real = Validation.dry_run.is_(False)
    verdicts: dict[str, list[int]] = {}  # cluster -> [passed, failed]
    for cluster, outcome, backend, n in s.execute(
            select(Validation.cluster, Validation.outcome, Validation.backend, func.count())
            .where(real).group_by(Validation.cluster, Validation.outcome, Validation.backend)):
        total.add_metric([cluster, outcome, backend], n)
        mine = verdicts.setdefault(cluster, [0, 0])
        mine[0] += n if outcome == ValidationOutcome.PASSED else 0
        mine[1] += n if outcome == ValidationOutcome.FAILED else 0
    yield total
    rate = GaugeMetricFamily("remediation_validation_pass_rate", "Passed / (passed + failed) GPU checks",
                             labels=["cluster"])
    for cluster in sorted(set(clusters) | set(verdicts)):
        passed, failed = verdicts.get(cluster, [0, 0])
        rate.add_metric([cluster], passed / (passed + failed) if passed + failed else float("nan"))
    yield rate
    hist = HistogramMetricFamily("remediation_validation_duration_seconds",
                                 "Duration of GPU checks, set-up included", labels=["cluster", "outcome"])
    cols = [func.sum(case((Validation.duration_s <= b, 1), else_=0)) for b in BUCKETS]
    q = (select(Validation.cluster, Validation.outcome, func.count(),
                func.coalesce(func.sum(Validation.duration_s), 0.0), *cols)
         .where(real).group_by(Validation.cluster, Validation.outcome))
    for cluster, outcome, count, seconds, *cumulative in s.execute(q):
        buckets = [(f"{b:.1f}", int(c or 0)) for b, c in zip(BUCKETS, cumulative, strict=True)]
        buckets.append(("+Inf", int(count)))
        hist.add_metric([cluster, outcome], buckets, float(seconds))
    yield hist
