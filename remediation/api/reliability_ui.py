"""The dashboard's Reliability page and the report downloads.

``/reliability?since=30d&by=pool,zone&cluster=NAME``: trends, hardware and lemons over the window (of one
cluster, or of every cluster: per cluster and for the fleet), charts drawn on
the server as SVG (:mod:`remediation.reports.charts`). ``/reliability/report.html`` is the same figures as
one self-contained file to attach to a postmortem, ``/reliability/report.csv`` the long-form CSV for a
notebook. Reading needs a read or admin token, like every dashboard page (:mod:`remediation.api.ui`).

Why: docs/running.md#the-cli
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from remediation.api.ui import Viewer, _page
from remediation.reports import reliability as report
from remediation.services.reliability import Reliability

router = APIRouter(include_in_schema=False)


def _load(request: Request, since: str, by: str | None, *, cluster: str | None) -> tuple[Reliability, datetime]:
    st = request.app.state
    now = st.clock.now()
    try:
        start, until = report.window(since, now)
        dims = report.dimensions(by)
        only = report.cluster_filter(cluster)
    except report.ReportError as exc:
        raise HTTPException(400, str(exc)) from None
    with st.sessions() as s:
        return report.build(s, start, until, lemon=st.settings.policy.lemon, by=dims, cluster=only), now


@router.get("/reliability")
def reliability_page(
    request: Request, who: Viewer, since: str = "30d", *, by: str | None = None, cluster: str | None = None
) -> HTMLResponse:
    rep, _ = _load(request, since, by, cluster=cluster)
    return _page(request, who, "reliability.html", since=since, cluster=cluster or "", **report.context(rep))


@router.get("/reliability/report.html")
def report_html(
    request: Request, who: Viewer, since: str = "30d", *, by: str | None = None, cluster: str | None = None
) -> HTMLResponse:
    rep, now = _load(request, since, by, cluster=cluster)
    name = f"reliability-{now:%Y%m%d}.html"
    return HTMLResponse(
        report.standalone_html(rep, now), headers={"Content-Disposition": f'inline; filename="{name}"'}
    )


@router.get("/reliability/report.csv")
def report_csv(
    request: Request, who: Viewer, since: str = "30d", *, by: str | None = None, cluster: str | None = None
) -> Response:
    rep, now = _load(request, since, by, cluster=cluster)
    return Response(
        report.to_csv(rep),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="reliability-{now:%Y%m%d}.csv"'},
    )
