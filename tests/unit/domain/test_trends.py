"""The trends' arithmetic on hand-made faults, and the report's window and groupings as asked for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.trends import Fault, Window, exposure_h, fleet_group, out_hours, per_node, trends
from remediation.reports.charts import hbars, stacked_days
from remediation.reports.reliability import ReportError, dimensions, window

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def at(h: float) -> datetime:
    return T0 + timedelta(hours=h)


def test_overlapping_faults_of_a_node_count_once_and_quarantine_lasts_to_the_release() -> None:
    faults = [
        Fault(1, "n1", "gpu-memory", "succeeded", at(1), at(3)),
        Fault(2, "n1", None, "succeeded", at(2), at(4)),  # overlaps the first: 1..4 is 3 hours
        Fault(3, "n2", "host", "quarantined", at(10), at(11), released_at=at(20)),
        Fault(4, "n3", "host", "quarantined", at(22), at(23)),  # never released: out to the window's end
        Fault(5, "n4", "host", "running", at(-5), None),  # opened before the window, still open
    ]
    assert out_hours(faults, at(0), at(24)) == pytest.approx(3 + 10 + 2 + 24)


def test_groups_days_and_mtbf() -> None:
    w = Window(at(0), at(48))
    faults = [
        Fault(1, "n1", "gpu-memory", "succeeded", at(1), at(2)),
        Fault(2, "n1", None, "succeeded", at(30), at(31)),
        Fault(3, "n2", "host", "cancelled", at(40), at(41)),
    ]
    nodes = {"n1": at(-100), "n2": at(-100), "n3": at(24)}
    t = trends(faults, nodes, w, by="pool", key=lambda node, f: "a" if node != "n3" else "b")
    a, b = t.groups
    assert (a.name, a.nodes, a.faults, a.by_class, a.repairs) == (
        "a",
        2,
        3,
        {"gpu-memory": 1, "host": 1, "unknown": 1},
        2,
    )
    assert (a.repair_median_h, a.out_h) == (1.0, 3.0) and a.mtbf_h == pytest.approx((96 - 3) / 3)
    assert (b.name, b.faults, b.mtbf_h, b.repair_median_h) == ("b", 0, None, None)
    assert [sum(c.values()) for _, c in t.daily] == [1, 2]
    per = {m.name: m for m in t.nodes}
    assert (per["n1"].hours, per["n1"].mtbf_h) == (46.0, 23.0)
    assert (per["n3"].hours, per["n3"].faults) == (24.0, 0)  # first seen half-way through


def test_every_figure_counts_a_node_from_when_it_was_first_seen_less_its_time_out() -> None:
    w = Window(at(0), at(48))
    faults = [
        Fault(1, "n1", "gpu-memory", "succeeded", at(1), at(2)),
        Fault(2, "n1", None, "succeeded", at(30), at(31)),
        Fault(3, "n2", "host", "succeeded", at(40), at(41)),  # first seen half-way through
        Fault(4, "n3", "host", "quarantined", at(10), at(11), released_at=at(20)),  # out 10 h
        Fault(5, "n5", "host", "succeeded", at(-3), at(-2)),  # before the window: no fault in it
    ]
    first = {"n1": at(-100), "n2": at(24), "n3": at(-1), "n4": at(47.5), "n5": at(-10)}
    hours = {m.name: m.hours for m in per_node(faults, first, w)}
    assert hours == {"n1": 46.0, "n2": 23.0, "n3": 38.0, "n4": 0.5, "n5": 48.0}
    assert exposure_h([], at(60), w) == 0.0  # first seen after the window
    assert fleet_group(faults, per_node(faults, first, w), w).mtbf_h == (46 + 23 + 38 + 0.5 + 48) / 4
    t = trends(faults, first, w, by="pool", key=lambda node, f: "a" if node in ("n1", "n2") else "b")
    g = {x.name: x for x in t.groups}
    assert (g["a"].faults, g["a"].mtbf_h) == (3, (46 + 23) / 3)
    assert (g["b"].faults, g["b"].mtbf_h) == (1, 38 + 0.5 + 48)


def test_the_fleet_of_new_nodes_is_not_counted_for_the_whole_window() -> None:
    w = Window(at(0), at(24))
    first = {f"n{i}": at(24 - 1 / 60) for i in range(36)}  # seen a minute before the window's end
    faults = [Fault(i, f"n{i}", "host", "running", at(24 - 0.5 / 60), None) for i in range(18)]
    rows = per_node(faults, first, w)
    fleet = fleet_group(faults, rows, w)
    assert fleet.mtbf_h == pytest.approx(sum(m.hours for m in rows) / 18) == pytest.approx((18 * 0.5 + 18) / 60 / 18)
    assert (fleet.nodes, fleet.faults) == (36, 18) and fleet.mtbf_h < 0.1  # not 36 x 24 h / 18 = 48 h


def test_the_report_window_and_groupings() -> None:
    now = at(100)
    assert window("30d", now) == (now - timedelta(days=30), now)
    assert window("1d", now, "2026-11-04") == (
        datetime(2026, 11, 3, tzinfo=UTC),
        datetime(2026, 11, 4, tzinfo=UTC),
    )
    for bad, why in (("soon", "not a duration"), ("-3d", "positive"), ("20000d", "at most")):
        with pytest.raises(ReportError, match=why):
            window(bad, now)
    with pytest.raises(ReportError, match="not an ISO time"):
        window("3d", now, "yesterday")
    assert dimensions(None) == ("pool", "rack", "zone", "sku")
    assert dimensions("zone, switch") == ("zone", "switch")
    with pytest.raises(ReportError):
        dimensions(" , ")


def test_charts_escape_their_text_and_mark_missing_values() -> None:
    svg = str(hbars([("<b>", 2.0), ("none", None)], unit=" h", label="x"))
    assert "&lt;b&gt;" in svg and "<b>" not in svg and ">-</text>" in svg
    days = str(stacked_days([(T0.date(), {"a": 2}), (at(24).date(), {})], ["a"]))
    assert "2026-11-01: 2 a" in days and days.count("<rect") == 2  # one bar, one legend swatch
