"""The server-rendered dashboard: overview, nodes, node timeline, remediations, quarantine, audit.

Jinja2 templates, one stylesheet, no JavaScript. Forms POST and redirect (303) with a one-line message.
Reading needs a read or admin token, acting admin plus the form's CSRF value. ``/login`` opens a session
and returns to a local path only; ``/logout`` ends it.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from remediation.api.auth import COOKIE, USER_COOKIE, Principal, browser_principal, check_csrf, identify
from remediation.api.levers import FLEET_LEVERS, Aim, Pull, every_cluster, node_href, pull
from remediation.api.routes import evidence_text
from remediation.db.scope import scoped
from remediation.evidence_collection.settings import NAME as ITEM_NAME
from remediation.repair_requests import service as repair_requests
from remediation.services.clusters import checked, cluster_states, node_cluster
from remediation.services.dashboard_sessions import end_session, open_session
from remediation.services.hardware import node_eras
from remediation.services.lever_rules import LeverError
from remediation.services.pool import membership
from remediation.services.readmodels import (
    ReadModelError,
    RecordNotFound,
    list_audit,
    list_events,
    list_nodes,
    list_remediations,
    node_detail,
    overview,
    quarantined,
)
from remediation.services.readmodels import get_remediation as get_rem

router = APIRouter(include_in_schema=False)


class LoginRequired(Exception):
    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


def login_redirect(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginRequired)
    return RedirectResponse("/login?" + urlencode({"next": exc.next_path}), status_code=303)


def viewer(request: Request) -> Principal:
    who = browser_principal(request)
    if who is None:
        raise LoginRequired(request.url.path)
    return who


Viewer = Annotated[Principal, Depends(viewer)]


async def form_fields(request: Request) -> dict[str, str]:
    """A URL-encoded form body, parsed with the standard library (the dashboard's forms are three
    short text fields; no multipart parser is needed). Capped so a huge body cannot cost memory."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise HTTPException(415, "expected a form (application/x-www-form-urlencoded)")
    body = await request.body()
    if len(body) > 16384:
        raise HTTPException(413, "form too large")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=10))


Fields = Annotated[dict[str, str], Depends(form_fields)]


def _page(request: Request, who: Principal, template: str, **ctx: Any) -> HTMLResponse:
    st = request.app.state
    ctx.update(who=who, user=request.cookies.get(USER_COOKIE, ""), msg=request.query_params.get("msg"),
               err=request.query_params.get("err"), path=request.url.path,
               cluster=(cluster := request.query_params.get("cluster") or ""),
               cq=f"&cluster={quote(cluster, safe='')}" if cluster else "",  # a filter link keeps the cluster
               cq0=f"?cluster={quote(cluster, safe='')}" if cluster else "",
               clusters=every_cluster(st.sessions, st.settings, None))
    return _render(request, template, ctx)


def _cluster(cluster: str | None) -> str | None:
    """The page's ``?cluster=`` filter (None: every cluster); a bad name is a 422 page."""
    return checked(cluster)


def _reading(request: Request, cluster: str | None) -> Session:
    sessions = request.app.state.sessions
    return (sessions if cluster is None else scoped(sessions, cluster))()


def _render(request: Request, template: str, ctx: dict[str, Any], *, status_code: int = 200) -> HTMLResponse:
    response: HTMLResponse = request.app.state.templates.TemplateResponse(request, template, ctx,
                                                                          status_code=status_code)
    return response


def _safe_next(path: str | None) -> str:
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


# ---------------------------------------------------------------------------------------- login


@router.get("/login")
def login_form(request: Request, next: str = "/") -> HTMLResponse:
    return _render(request, "login.html", {"next": _safe_next(next), "error": None, "who": None})


@router.post("/login")
def login(request: Request, f: Fields) -> Response:
    token, name, nxt = f.get("token", "")[:4096], f.get("name", ""), _safe_next(f.get("next"))
    client = request.client.host if request.client else "unknown"
    wait = request.app.state.login_limiter.retry_after(client, request.app.state.clock.now())
    if wait is not None:
        ctx = {"next": nxt, "error": "Too many login attempts: wait a minute.", "who": None}
        response = _render(request, "login.html", ctx, status_code=429)
        response.headers["Retry-After"] = str(int(wait + 0.999))
        return response
    known = identify(token, request.app.state.settings.api)
    if known is None or known.role == "repair":  # the repair system's token calls its callback only
        return _render(request, "login.html", {"next": nxt, "error": "That token is not valid.",
                                               "who": None}, status_code=401)
    st = request.app.state
    ttl = st.settings.api.session_ttl_s
    with st.sessions() as s, s.begin():
        session_id = open_session(s, token, st.clock.now(), ttl=timedelta(seconds=ttl), key=st.session_key)
    resp = RedirectResponse(nxt, status_code=303)
    secure = request.url.scheme == "https"
    resp.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", secure=secure, max_age=ttl)
    clean = "".join(c for c in name.strip() if c.isalnum() or c in "._@ -")[:64]
    resp.set_cookie(USER_COOKIE, clean, httponly=True, samesite="strict", secure=secure, max_age=30 * 86400)
    return resp


@router.post("/logout")
def logout(request: Request) -> Response:
    session_id = request.cookies.get(COOKIE)
    if session_id:
        with request.app.state.sessions() as s, s.begin():
            end_session(s, session_id, request.app.state.session_key)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(COOKIE)
    return resp


# ---------------------------------------------------------------------------------------- pages


@router.get("/")
def home(request: Request, who: Viewer, cluster: str | None = None) -> HTMLResponse:
    st = request.app.state
    cluster = _cluster(cluster)
    with _reading(request, cluster) as s:
        ov = overview(s)
        ov.clusters = cluster_states(s, every_cluster(st.sessions, st.settings, cluster))
        pool = membership(s, st.settings.policy.pool_stale)
        in_flight = list_remediations(s, "open", limit=200)
        quarantine = quarantined(s)
        recent = list_audit(s, limit=15)
        undelivered = repair_requests.failing(s)
    ov.queue_depth = st.queue_depth() if st.queue_depth is not None else None
    return _page(request, who, "overview.html", ov=ov, in_flight=in_flight, quarantine=quarantine,
                 recent=recent, pool=pool, undelivered=undelivered)


@router.get("/nodes")
def nodes(request: Request, who: Viewer, status: str | None = None, *,
          profile: str | None = None, cluster: str | None = None) -> HTMLResponse:
    st = request.app.state
    with _reading(request, _cluster(cluster)) as s:
        rows = list_nodes(s, status or None, st.settings.policy.lemon, now=st.clock.now(),
                          profile=profile or None)
    return _page(request, who, "nodes.html", rows=rows, status=status or "", profile=profile or "",
                 profiles=[p.name for p in st.settings.profiles], lemon_threshold=st.settings.policy.lemon.threshold)


@router.get("/nodes/{node}")
def node(request: Request, who: Viewer, node: str, *, cluster: str | None = None) -> HTMLResponse:
    st = request.app.state
    with st.sessions() as s:
        owner = node_cluster(s, node, _cluster(cluster))
    with _reading(request, owner) as s:
        detail = node_detail(s, node, policy=st.settings.policy, now=st.clock.now())
        eras = node_eras(s, [node]).get(node, [])
        repairs = repair_requests.list_requests(s, node=node, limit=10)
    return _page(request, who, "node.html", d=detail, eras=eras, repairs=repairs)


@router.get("/remediations")
def remediations(request: Request, who: Viewer, status: str | None = "open",
                 *, profile: str | None = None, cluster: str | None = None) -> HTMLResponse:
    st = request.app.state
    with _reading(request, _cluster(cluster)) as s:
        rows = list_remediations(s, status or None, limit=300, profile=profile or None)
    return _page(request, who, "remediations.html", rows=rows, status=status or "", profile=profile or "",
                 profiles=[p.name for p in st.settings.profiles])


@router.get("/remediations/{remediation_id}")
def remediation(request: Request, who: Viewer, remediation_id: int, *, cluster: str | None = None) -> HTMLResponse:
    if not 0 < remediation_id < 2**63:
        raise RecordNotFound(f"no remediation #{remediation_id}")
    with _reading(request, _cluster(cluster)) as s:
        d = get_rem(s, remediation_id)
    return _page(request, who, "remediation.html", d=d)


@router.get("/remediations/{remediation_id}/evidence/{name}")
def evidence_item(request: Request, _: Viewer, remediation_id: int, *, name: str,
                  step: int | None = None, cluster: str | None = None) -> Response:
    """One item of collected evidence, whole, as plain text (the page links each item here)."""
    if not 0 < remediation_id < 2**63 or not ITEM_NAME.fullmatch(name) or not 0 < (step or 1) < 2**63:
        raise RecordNotFound(f"no collected evidence {name!r} of remediation #{remediation_id}")
    with _reading(request, _cluster(cluster)) as s:
        return evidence_text(s, request, (remediation_id, name, step))


@router.get("/quarantine")
def quarantine_page(request: Request, who: Viewer, cluster: str | None = None) -> HTMLResponse:
    with _reading(request, _cluster(cluster)) as s:
        rows = quarantined(s)
    return _page(request, who, "quarantine.html", rows=rows)


@router.get("/audit")
def audit_page(request: Request, who: Viewer, cluster: str | None = None) -> HTMLResponse:
    with _reading(request, _cluster(cluster)) as s:
        rows = list_audit(s, limit=300)
    return _page(request, who, "audit.html", rows=rows)


@router.get("/events")
def events_page(request: Request, who: Viewer, cluster: str | None = None) -> HTMLResponse:
    with _reading(request, _cluster(cluster)) as s:
        rows = list(reversed(list_events(s, limit=300)))
    return _page(request, who, "events.html", rows=rows)


# -------------------------------------------------------------------------------------- levers


def _act(request: Request, who: Principal, f: dict[str, str], *, back: str, aim: Aim) -> Response:
    back += "&" if "?" in back else "?"  # the page's own query (its cluster) stays
    if not who.admin:
        return RedirectResponse(f"{back}err=" + quote("read-only token: levers need an admin token"), 303)
    check_csrf(who, f.get("csrf"))
    st = request.app.state
    try:
        aim = replace(aim, cluster=_cluster(f.get("cluster") or request.query_params.get("cluster")))
        fleet = every_cluster(st.sessions, st.settings, aim.cluster) if aim.lever in FLEET_LEVERS else []
        req = Pull(aim, who.actor(request.cookies.get(USER_COOKIE)), f.get("reason", "")[:1000],
                   give_back=f.get("give_back") == "1", clusters=fleet)
        result = pull(st.levers, st.sessions, req)
    except (LeverError, ReadModelError) as exc:
        return RedirectResponse(f"{back}err=" + quote(str(exc)), 303)
    key = "msg" if result.queued else "err"
    return RedirectResponse(f"{back}{key}=" + quote(result.message), 303)


@router.post("/nodes/{node}/release")
def release(request: Request, who: Viewer, node: str, *, f: Fields) -> Response:
    back = _safe_next(f.get("back") or node_href(node, f.get("cluster") or None))
    return _act(request, who, f, back=back, aim=Aim("release", node))


@router.post("/nodes/{node}/quarantine")
def quarantine(request: Request, who: Viewer, node: str, *, f: Fields) -> Response:
    return _act(request, who, f, back=node_href(node, f.get("cluster") or None), aim=Aim("quarantine", node))


@router.post("/remediations/{remediation_id}/cancel")
def cancel(request: Request, who: Viewer, remediation_id: int, *, f: Fields) -> Response:
    return _act(request, who, f, back=f"/remediations/{remediation_id}",
                aim=Aim("cancel", remediation_id=remediation_id))


@router.post("/breaker/close")
def breaker_close(request: Request, who: Viewer, f: Fields) -> Response:
    return _act(request, who, f, back="/", aim=Aim("breaker_close"))


@router.post("/pause")
def pause(request: Request, who: Viewer, f: Fields) -> Response:
    return _act(request, who, f, back="/", aim=Aim("pause"))


@router.post("/resume")
def resume(request: Request, who: Viewer, f: Fields) -> Response:
    return _act(request, who, f, back="/", aim=Aim("resume"))
