"""The reliability report of a fixed random history, figure for figure as recorded.

The history is the report benchmark's (:func:`bench.reliability_report.fill`) at a small size: many
faults per node, overlapping ones, quarantines, open remediations and host moves. Its CSV was recorded
from the report before its reads and passes were made faster; any change of a figure shows here as a
diff. After a change that is meant to alter figures, rewrite the file with
``REMEDIATION_RECORD_RELIABILITY=1`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.reliability_report import fill
from remediation.db.session import make_engine, make_session_factory
from remediation.reports.reliability import to_csv
from remediation.services.reliability import reliability
from remediation.settings import DatabaseSettings, LemonSettings

RECORDED = Path(__file__).resolve().parent / "data" / "reliability-40-nodes.csv"
UNTIL = datetime(2026, 11, 1, tzinfo=UTC)


def test_the_report_of_a_fixed_history_is_as_recorded(pg_url: str) -> None:
    fill(pg_url, 40, 300, 20, UNTIL, seed=11)
    engine = make_engine(DatabaseSettings(url=pg_url))
    try:
        with make_session_factory(engine)() as s:
            rep = reliability(s, UNTIL - timedelta(days=14), UNTIL, lemon=LemonSettings())
    finally:
        engine.dispose()
    got = to_csv(rep)
    if os.environ.get("REMEDIATION_RECORD_RELIABILITY") == "1":
        RECORDED.write_text(got)
    want = RECORDED.read_text()
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "recorded", "now", lineterm="", n=0)
    assert got == want, "\n".join(list(diff)[:40])
