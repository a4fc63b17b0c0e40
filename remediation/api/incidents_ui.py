"""The dashboard's Incidents page: open and recent correlated incidents, and the resolve lever.

Same rules as the rest of the dashboard (:mod:`remediation.api.ui`): reading needs a token, resolving
needs an admin token and the form's CSRF value, and the form redirects back with one line. The resolve
goes through the one lever service, as ``remediation incidents resolve`` and the JSON API do.

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from remediation.api.auth import USER_COOKIE, check_csrf
from remediation.api.ui import Fields, Viewer, _page
from remediation.db.scope import scoped
from remediation.domain.states import IncidentStatus
from remediation.incidents import service as svc
from remediation.services.clusters import checked, incident_cluster
from remediation.services.lever_rules import LeverError
from remediation.services.readmodels import ReadModelError

router = APIRouter(include_in_schema=False)


@router.get("/incidents")
def incidents_page(request: Request, who: Viewer, cluster: str | None = None) -> HTMLResponse:
    sessions, only = request.app.state.sessions, checked(cluster)
    with (sessions if only is None else scoped(sessions, only))() as s:
        rows = svc.list_incidents(s, limit=200)
        members = {r["id"]: svc.show(s, r["id"])["remediations"] for r in rows if r["status"] == IncidentStatus.OPEN}
    return _page(request, who, "incidents.html", rows=rows, members=members)


@router.post("/incidents/{incident_id}/resolve")
def resolve(request: Request, who: Viewer, incident_id: int, *, f: Fields) -> Response:
    if not who.admin:
        return RedirectResponse("/incidents?err=" + quote("read-only token: levers need an admin token"), 303)
    check_csrf(who, f.get("csrf"))
    try:
        with request.app.state.sessions() as s:
            owner = incident_cluster(s, incident_id)
        followups = request.app.state.levers.in_cluster(owner).resolve_incident(
            incident_id, who.actor(request.cookies.get(USER_COOKIE)), f.get("reason", "")[:1000])
    except (svc.IncidentError, LeverError, ReadModelError) as exc:
        return RedirectResponse("/incidents?err=" + quote(str(exc)), 303)
    return RedirectResponse("/incidents?msg=" + quote(
        f"incident #{incident_id} resolved; {len(followups)} member remediation(s) re-check their trigger"), 303)
