"""The reliability report as people and notebooks read it: HTML (the dashboard's Reliability page, and a
standalone file to attach to a postmortem), CSV (long form, one figure per row) and, through a headless
browser, PDF (:mod:`remediation.adapters.pdf`).

Every figure comes from :func:`remediation.services.reliability.reliability`; nothing here computes one.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy.orm import Session

from remediation.reports.charts import hbars, stacked_days
from remediation.services.readmodels import human_duration
from remediation.services.reliability import BY, DIMENSIONS, Reliability, reliability
from remediation.settings import LemonSettings, parse_duration
from remediation.vocabulary import checked_cluster

TEMPLATES = Path(__file__).resolve().parent / "templates"
# The dashboard's stylesheet, inlined so that the file stands alone and matches the Reliability page.
STYLE = Path(__file__).resolve().parent.parent / "api" / "static" / "style.css"
FORMATS = ("html", "pdf", "csv")
MAX_WINDOW = timedelta(days=3660)


class ReportError(ValueError):
    """A report asked for in a way that cannot be given; the message says why."""


def window(since: str, now: datetime, until: str | None = None) -> tuple[datetime, datetime]:
    """``--since 30d`` as [end - 30d, end), where the end is ``--until`` (an ISO time, UTC when it names
    no zone) or now; a bad or absurd window is a ReportError."""
    end = now
    if until:
        try:
            end = datetime.fromisoformat(until.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ReportError(
                f"--until {until!r}: not an ISO time such as 2026-11-04 or 2026-11-04T12:00Z"
            ) from None
        end = end if end.tzinfo else end.replace(tzinfo=UTC)
    try:
        span = parse_duration(since)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    if span > MAX_WINDOW:
        raise ReportError(f"--since {since}: at most {MAX_WINDOW.days} days")
    return end - span, end


def dimensions(by: str | None) -> tuple[str, ...]:
    """The groupings asked for (comma-separated), or every named one."""
    if not by:
        return BY
    asked = tuple(d.strip() for d in by.split(",") if d.strip())
    if not asked or any(len(d) > 253 or not d.isprintable() for d in asked):
        raise ReportError(f"--by {by!r}: name groupings such as {', '.join(BY)}, or a failure-domain kind")
    return asked


def build(
    s: Session, since: datetime, until: datetime, *, lemon: LemonSettings, by: tuple[str, ...] = BY,
    cluster: str | None = None,
) -> Reliability:
    """The report of ``cluster`` alone, or (None) of every cluster: per cluster and for the fleet."""
    return reliability(s, since, until, lemon=lemon, by=by, cluster=cluster)


def cluster_filter(name: str | None) -> str | None:
    """``--cluster NAME`` checked (None: every cluster); a bad name is a ReportError."""
    if not name:
        return None
    try:
        return checked_cluster(name)
    except ValueError as exc:
        raise ReportError(f"--cluster: {exc}") from None


def hours(value: float | None, digits: int = 1) -> str:
    """Hours for people: ``-`` for none, minutes under one hour, else hours with ``digits`` decimals."""
    if value is None:
        return "-"
    return f"{value * 60:.0f} min" if value < 1 else f"{value:,.{digits}f} h"


def charts(rep: Reliability) -> dict[str, Any]:
    """The SVG charts of the report: faults per day, and per grouping the faults, node-hours out of
    service, MTBF and median time to repair of each group."""
    first = next(iter(rep.trends.values()))
    out: dict[str, Any] = {"daily": stacked_days(first.daily, first.classes), "by": {}}
    for dim, t in rep.trends.items():
        out["by"][dim] = {
            "faults": hbars([(g.name, g.faults) for g in t.groups], label=f"faults by {dim}"),
            "out": hbars([(g.name, g.out_h) for g in t.groups], fmt=hours,
                         label=f"node-hours out of service by {dim}"),
            "mtbf": hbars([(g.name, g.mtbf_h) for g in t.groups], fmt=lambda v: hours(v, 0), label=f"MTBF by {dim}"),
            "repair": hbars([(g.name, g.repair_median_h) for g in t.groups], fmt=lambda v: hours(v, 2),
                            label=f"median time to repair by {dim}"),
        }  # fmt: skip
    return out


def context(rep: Reliability, top: int = 20) -> dict[str, Any]:
    """What the report's templates render (``top``: rows of the per-node and per-hardware tables)."""
    return {
        "rep": rep,
        "charts": charts(rep),
        "hours": hours,
        "dur": human_duration,
        "dimensions": DIMENSIONS,
        "top": top,
    }


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    env.globals["hours"] = hours
    return env


def standalone_html(rep: Reliability, generated_at: datetime) -> str:
    """One self-contained HTML file (styles inline, charts inline SVG, no link to fetch)."""
    tpl = environment().get_template("reliability_report.html")
    return tpl.render(**context(rep), style=Markup(STYLE.read_text()), generated_at=generated_at)


def rows(rep: Reliability) -> Iterator[list[Any]]:
    """The report as long-form rows: section, grouping, key, metric, value."""
    w = rep.window
    yield ["window", "", "", "since", w.since.isoformat()]
    yield ["window", "", "", "until", w.until.isoformat()]
    if rep.fleet is not None:
        g = rep.fleet
        yield ["window", "", "", "clusters", " ".join(rep.clusters)]
        yield from (["fleet", "", "fleet", m, v] for m, v in (
            ("nodes", g.nodes), ("faults", g.faults), ("repairs", g.repairs),
            ("repair_median_h", g.repair_median_h), ("repair_mean_h", g.repair_mean_h),
            ("out_of_service_h", g.out_h), ("mtbf_h", g.mtbf_h)))  # fmt: skip
    for dim, t in rep.trends.items():
        for g in t.groups:
            yield from ([dim and "group", dim, g.name, m, v] for m, v in (
                ("nodes", g.nodes), ("faults", g.faults), ("repairs", g.repairs),
                ("repair_median_h", g.repair_median_h), ("repair_mean_h", g.repair_mean_h),
                ("out_of_service_h", g.out_h), ("mtbf_h", g.mtbf_h),
                *((f"faults_{cls}", n) for cls, n in g.by_class.items())))  # fmt: skip
    first = next(iter(rep.trends.values()))
    for day, counts in first.daily:
        for cls in first.classes:
            yield ["faults_per_day", "class", cls, day.isoformat(), counts.get(cls, 0)]
    for n in first.nodes:
        yield from (
            ["node", "", n.name, m, v]
            for m, v in (("faults", n.faults), ("in_service_h", n.hours), ("mtbf_h", n.mtbf_h))
        )
    for h in rep.hardware:
        yield from (
            ["hardware", h.sku or "", h.name, m, v]
            for m, v in (
                ("faults", h.faults),
                ("in_service_h", h.hours),
                ("mtbf_h", h.mtbf_h),
                ("nodes", " ".join(h.nodes)),
            )
        )
    for x in rep.repairs:
        yield from (["repair_time", "hardware", x.hardware, m, v] for m, v in (
            ("repairs", x.repairs), ("median_h", x.median_h), ("total_h", x.total_h),
            ("nodes", " ".join(x.nodes))))  # fmt: skip
    for m in rep.moves:
        yield ["move", m.node, m.after, m.at.isoformat(), f"{m.before} -> {m.after}: {m.why}"]
    for serial, names in rep.shared_gpus.items():
        yield ["gpu_under_two_names", "", serial, "nodes", " ".join(names)]
    for lemon in rep.lemons:
        yield ["lemon", lemon.status, lemon.node, "score", round(lemon.score, 3)]
        if lemon.hardware:
            yield ["lemon", lemon.status, lemon.node, "hardware_failed_elsewhere", lemon.hardware]
    for flag in rep.flags:
        for f in flag.failures:
            yield ["hardware_failed_elsewhere", flag.cluster, flag.node, f.identity,
                   f"{f.cluster}/{f.node} remediation #{f.remediation_id} at {f.at.isoformat()}"]


def to_csv(rep: Reliability) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["section", "group_by", "key", "metric", "value"])
    for row in rows(rep):
        out.writerow(["" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for v in row])
    return buf.getvalue()
