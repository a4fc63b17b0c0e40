"""The validation's Prometheus series, read from the ``validations`` table at scrape time.

- ``remediation_validations_total{outcome,backend}``: checks run (passed, failed, timeout, no_result,
  cannot_run); dry-run rows are not counted;
- ``remediation_validation_pass_rate``: passed / (passed + failed), the share of nodes whose GPUs the
  validation found good after a remediation (NaN before the first verdict);
- ``remediation_validation_duration_seconds{outcome}``: histogram of how long checks took, set-up
  included (``dcgmi diag -r 2`` normally runs about 2 minutes, ``-r 3`` about 15).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from remediation.db.models import Validation
from remediation.domain.states import ValidationOutcome

BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)


def validation_metrics(s: Session) -> Iterable[Metric]:
    total = CounterMetricFamily("remediation_validations", "GPU checks run by the validation",
                                labels=["outcome", "backend"])
    real = Validation.dry_run.is_(False)
    passed = failed = 0
    for outcome, backend, n in s.execute(select(Validation.outcome, Validation.backend, func.count())
                                         .where(real).group_by(Validation.outcome, Validation.backend)):
        total.add_metric([outcome, backend], n)
        passed += n if outcome == ValidationOutcome.PASSED else 0
        failed += n if outcome == ValidationOutcome.FAILED else 0
    yield total
    yield GaugeMetricFamily("remediation_validation_pass_rate", "Passed / (passed + failed) GPU checks",
                            value=passed / (passed + failed) if passed + failed else float("nan"))
    hist = HistogramMetricFamily("remediation_validation_duration_seconds",
                                 "Duration of GPU checks, set-up included", labels=["outcome"])
    cols = [func.sum(case((Validation.duration_s <= b, 1), else_=0)) for b in BUCKETS]
    q = (select(Validation.outcome, func.count(), func.coalesce(func.sum(Validation.duration_s), 0.0), *cols)
         .where(real).group_by(Validation.outcome))
    for outcome, count, seconds, *cumulative in s.execute(q):
        buckets = [(f"{b:.1f}", int(c or 0)) for b, c in zip(BUCKETS, cumulative, strict=True)]
        buckets.append(("+Inf", int(count)))
        hist.add_metric([outcome], buckets, float(seconds))
    yield hist
