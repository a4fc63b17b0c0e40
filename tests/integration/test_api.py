"""The JSON API, the dashboard and /metrics against real Postgres holding a realistic history."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.api import create_app
from remediation.api.auth import COOKIE
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, DashboardSession, Node, Remediation
from remediation.db.queries import BREAKER, control_set
from remediation.ports.dispatch import Dispatcher
from remediation.settings import Settings
from tests.integration.history import History, RecordingDispatcher, dispatch, dispatcher, history, sessions  # noqa: F401  (fixtures)

ADMIN, READ = "admin-token-0123456789", "read-token-0123456789"
SESSION_KEY = "a-session-key-of-32-characters-or-more"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READ}"}


@pytest.fixture
def client(pg_url: str, sessions: sessionmaker[Session], dispatcher: Dispatcher) -> Iterator[TestClient]:
    settings = Settings(database={"url": pg_url}, api={"admin_tokens": [ADMIN], "read_tokens": [READ]})
    app = create_app(settings, sessions, queue_depth=lambda: {"workflow": 7, "ingest": 2}, dispatcher=dispatcher)
    with TestClient(app) as c:
        yield c


READS = ["/api/v1/overview", "/api/v1/nodes", "/api/v1/nodes/gpu-node-8", "/api/v1/remediations",
         "/api/v1/remediations/1", "/api/v1/quarantine", "/api/v1/audit", "/api/v1/events",
         "/api/v1/rejected", "/api/v1/stats"]
WRITES = [("/api/v1/nodes/gpu-node-8/release", "release"), ("/api/v1/nodes/gpu-node-2/quarantine", "quarantine"),
          ("/api/v1/nodes/gpu-node-5/report", "report"), ("/api/v1/remediations/5/cancel", "cancel"),
          ("/api/v1/pause", "pause"), ("/api/v1/resume", "resume")]


def test_reads_need_a_token(client, history) -> None:
    for path in READS:
        res = client.get(path)
        assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer", path
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
        assert client.get(path, headers=AS_READER).status_code == 200, path


def test_read_only_token_cannot_pull_levers(client, history, sessions) -> None:
    for path, _lever in WRITES:
        assert client.post(path, json={"reason": "x"}).status_code == 401, path
        res = client.post(path, json={"reason": "x"}, headers=AS_READER)
        assert res.status_code == 403 and "read-only" in res.json()["detail"], path
    with sessions() as s:
        actions = {lever for _, lever in WRITES}
        assert s.scalars(select(AuditLog).where(AuditLog.action.in_(actions))).all() == []


def test_each_lever_works_and_is_audited(client, history, sessions, dispatch) -> None:
    body = {"reason": "GPU swapped", "actor": "alice"}
    res = client.post("/api/v1/nodes/gpu-node-8/release", json=body, headers=AS_ADMIN)
    assert res.status_code == 200 and res.json()["message"] == "gpu-node-8 released"
    assert dispatch.released(sessions) == ["gpu-node-8"]
    res = client.post("/api/v1/nodes/gpu-node-2/quarantine", json={"reason": "NVLink"}, headers=AS_ADMIN)
    assert res.status_code == 200 and dispatch.steps_called[-1].remediation_id == res.json()["remediation_id"]
    res = client.post("/api/v1/nodes/gpu-node-5/report", json={"reason": "NCCL hangs"}, headers=AS_ADMIN)
    assert res.status_code == 200 and res.json()["remediation_id"] is not None
    res = client.post(f"/api/v1/remediations/{history.waiting}/cancel", json={"reason": "jobs ok"}, headers=AS_ADMIN)
    assert res.status_code == 200
    assert client.post("/api/v1/pause", json={"reason": "window"}, headers=AS_ADMIN).json()["message"] == "automation paused"
    assert client.get("/api/v1/overview", headers=AS_READER).json()["paused"] is True
    assert client.post("/api/v1/resume", json={"reason": "done"}, headers=AS_ADMIN).status_code == 200
    with sessions() as s:
        rows = s.execute(select(AuditLog.action, AuditLog.target, AuditLog.actor).where(
            AuditLog.action.in_(("release", "quarantine", "report", "cancel", "pause", "resume")))
            .order_by(AuditLog.id)).all()
        assert [(a, t) for a, t, _ in rows] == [("release", "gpu-node-8"), ("quarantine", "gpu-node-2"),
                                                ("report", "gpu-node-5"), ("cancel", "gpu-node-4"),
                                                ("pause", ""), ("resume", "")]
        assert re.fullmatch(r"alice \(token [0-9a-f]{8}\)", rows[0][2])
        assert re.fullmatch(r"api \(token [0-9a-f]{8}\)", rows[1][2])
        assert ADMIN not in " ".join(r[2] for r in rows)
        assert s.get(Node, ("default", "gpu-node-8")).status == "healthy"
        assert s.get(Remediation, history.waiting).status == "cancelled"


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("get", "/api/v1/nodes/gpu-node-99", None, 404),
        ("get", "/api/v1/nodes?status=broken", None, 422),
        ("get", "/api/v1/remediations/424242", None, 404),
        ("post", "/api/v1/nodes/gpu-node-3/release", {"reason": "x"}, 409),
        ("post", "/api/v1/nodes/gpu-node-99/quarantine", {"reason": "x"}, 404),
        ("post", "/api/v1/pause", {"reason": "   "}, 422),
        ("post", "/api/v1/pause", {"reason": "x", "extra": 1}, 422),
    ],
    ids=["unknown-node", "bad-filter", "unknown-rem", "release-healthy", "quarantine-unknown", "blank", "extra"],
)
def test_errors_map_to_clear_statuses(client, history, method, path, body, status) -> None:
    res = getattr(client, method)(path, headers=AS_ADMIN, **({"json": body} if body is not None else {}))
    assert res.status_code == status
    assert res.json()["detail"]


def test_node_detail_and_overview(client, history) -> None:
    d = client.get("/api/v1/nodes/gpu-node-8", headers=AS_READER).json()
    assert d["node"]["status"] == "quarantined" and d["quarantine_history"][0]["action"] == "remediation_quarantined"
    assert [r["id"] for r in d["remediations"]] == [history.quarantined]
    assert [(e["remediation_id"], e["outcome"], e["state"]) for e in d["episodes"]] == [
        (history.quarantined, "quarantined", "over")]
    ov = client.get("/api/v1/overview", headers=AS_READER).json()
    assert ov["nodes_by_status"] == {"healthy": 8, "unhealthy": 0, "remediating": 1, "quarantined": 1,
                                     "with-repair": 0}
    assert ov["in_flight"] == 1 and ov["queue_depth"] == {"workflow": 7, "ingest": 2}
    inflight = client.get("/api/v1/remediations", headers=AS_READER).json()
    assert [r["id"] for r in inflight] == [history.waiting]


def test_healthz_needs_no_token(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok"}


def test_healthz_reports_a_dead_database() -> None:
    settings = Settings(database={"url": "postgresql+psycopg://nobody@127.0.0.1:9/none"})
    with TestClient(create_app(settings)) as c:
        res = c.get("/healthz")
    assert res.status_code == 503 and res.json()["status"] == "error"


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} missing"
    return float(m.group(1))


def test_metrics_expose_the_history(client, history, sessions) -> None:
    with sessions() as s, s.begin():
        control_set(s, BREAKER, {"open": True}, now=history.start)
    text = client.get("/metrics").text
    assert _metric(text, "remediation_events_total", '{cluster="default",kind="unhealthy",source="slurm"}') == 5
    assert _metric(text, "remediation_events_total", '{cluster="default",kind="inventory",source="slurm"}') == 10
    assert _metric(text, "remediation_remediations_total", '{cluster="default",outcome="succeeded"}') == 3
    assert _metric(text, "remediation_remediations_total", '{cluster="default",outcome="quarantined"}') == 1
    assert _metric(text, "remediation_remediations_open", '{cluster="default",status="waiting",step="slurm_drain"}') == 1
    assert _metric(text, "remediation_quarantined_nodes", '{cluster="default"}') == 1
    assert _metric(text, "remediation_breaker_open", '{cluster="default"}') == 1
    assert _metric(text, "remediation_paused", '{cluster="default"}') == 0
    assert _metric(text, "remediation_queue_depth", '{queue="workflow"}') == 7
    assert _metric(text, "remediation_rejected_events_total", '{cluster="default"}') == 1
    # Two verify attempts on gpu-node-8 each waited ~125 s: between the 120 s and 300 s buckets.
    assert _metric(text, "remediation_step_duration_seconds_count", '{cluster="default",step="verify"}') == 5
    assert _metric(text, "remediation_step_duration_seconds_bucket", '{cluster="default",le="120.0",step="verify"}') == 3
    assert _metric(text, "remediation_step_duration_seconds_bucket", '{cluster="default",le="300.0",step="verify"}') == 5
    assert _metric(text, "remediation_workflow_lag_seconds", '{cluster="default"}') > 0  # gpu-node-4's check is long overdue
    assert _metric(text, "remediation_database_up") == 1


def _login(client: TestClient, token: str) -> None:
    res = client.post("/login", data={"token": token, "name": "dana", "next": "/quarantine"}, follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/quarantine"
    cookie = res.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie


def test_dashboard_requires_login_then_renders(client, history) -> None:
    res = client.get("/nodes/gpu-node-8", follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/login?next=%2Fnodes%2Fgpu-node-8"
    bad = client.post("/login", data={"token": "nope", "next": "/"})
    assert bad.status_code == 401 and "not valid" in bad.text
    _login(client, READ)
    pages = {"/": "In flight", "/nodes": "gpu-node-9", "/nodes/gpu-node-8": "ladder exhausted",
             f"/remediations/{history.quarantined}": "vm_restart", "/remediations": "gpu-node-4",
             "/quarantine": "gpu-node-8", "/audit": "remediation_quarantined", "/events": "ecc errors"}
    for path, text in pages.items():
        res = client.get(path)
        assert res.status_code == 200 and text in res.text, path
    node_page = client.get("/nodes/gpu-node-8").text
    assert "Fault episodes" in node_page and f'href="/remediations/{history.quarantined}">#{history.quarantined}' in node_page
    assert "Release</button>" not in client.get("/quarantine").text  # read-only: no lever forms
    assert client.get("/nodes/ghost").status_code == 404


def test_a_dashboard_session_holds_no_token_and_ends_at_logout(client, history, sessions) -> None:
    _login(client, ADMIN)
    session_id = client.cookies[COOKIE]
    assert ADMIN not in session_id and len(session_id) >= 32
    with sessions() as s:  # the database keeps hashes only: a copy of the table opens no session
        (row,) = s.scalars(select(DashboardSession)).all()
        assert session_id not in (row.id_hmac, row.token_sha256) and ADMIN != row.token_sha256
    assert client.get("/quarantine", follow_redirects=False).status_code == 200
    assert client.post("/logout", follow_redirects=False).headers["location"] == "/login"
    client.cookies.set(COOKIE, session_id)  # the cookie as copied before the logout
    assert client.get("/quarantine", follow_redirects=False).status_code == 303
    assert client.post("/pause", data={"reason": "x"}, follow_redirects=False).status_code == 303


def test_sessions_are_shared_expire_and_end_with_their_token(pg_url, sessions, history) -> None:
    clock = FakeClock(datetime.now(UTC))
    other = "other-admin-token-0123456789"

    def replica(tokens: list[str], key: str = SESSION_KEY) -> TestClient:
        api = {"admin_tokens": tokens, "session_ttl_s": 3600, "session_key": key}
        return TestClient(create_app(Settings(database={"url": pg_url}, api=api), sessions, clock=clock))

    with replica([ADMIN, other]) as one, replica([ADMIN, other]) as two, replica([other]) as rotated:
        _login(one, ADMIN)
        session_id = one.cookies[COOKIE]
        two.cookies.set(COOKIE, session_id)
        assert two.get("/quarantine", follow_redirects=False).status_code == 200  # every replica knows it
        rotated.cookies.set(COOKIE, session_id)  # ADMIN removed from this replica's configuration
        assert rotated.get("/quarantine", follow_redirects=False).status_code == 303
        _login(rotated, other)
        clock.advance(3599)
        assert one.get("/quarantine", follow_redirects=False).status_code == 200
        assert rotated.get("/quarantine", follow_redirects=False).status_code == 200
        clock.advance(2)  # both sessions are now older than api.session_ttl_s
        assert one.get("/quarantine", follow_redirects=False).status_code == 303
        assert rotated.get("/quarantine", follow_redirects=False).status_code == 303


def test_a_session_id_is_stored_as_an_hmac_under_the_server_key(pg_url, sessions, history) -> None:
    """An unsalted SHA-256 of the id would let a copy of the table be matched against cookies; under
    the server key the row is useless without it, and another key knows no session."""
    def replica(key: str) -> TestClient:
        api = {"admin_tokens": [ADMIN], "session_key": key}
        return TestClient(create_app(Settings(database={"url": pg_url}, api=api), sessions))

    with replica(SESSION_KEY) as one, replica("another-session-key-of-32-characters") as other:
        _login(one, ADMIN)
        session_id = one.cookies[COOKIE]
        with sessions() as s:
            stored = s.scalars(select(DashboardSession.id_hmac)).all()
        mac = hmac.new(SESSION_KEY.encode(), session_id.encode(), hashlib.sha256).hexdigest()
        assert mac in stored and hashlib.sha256(session_id.encode()).hexdigest() not in stored
        other.cookies.set(COOKIE, session_id)
        assert other.get("/quarantine", follow_redirects=False).status_code == 303


def test_login_attempts_are_limited_per_client(pg_url, sessions, history) -> None:
    """One client may try api.login_attempts_per_minute logins in any minute; the next is 429 with a
    Retry-After, even with a good token (it is refused before the token is compared), until the
    window has passed; another client is not held back by it."""
    clock = FakeClock(datetime.now(UTC))
    api = {"admin_tokens": [ADMIN], "login_attempts_per_minute": 3}
    app = create_app(Settings(database={"url": pg_url}, api=api), sessions, clock=clock)
    with TestClient(app) as guesser, TestClient(app, client=("192.0.2.7", 50000)) as neighbour:
        for _ in range(3):
            assert guesser.post("/login", data={"token": "guess-0123456789abcdef"}).status_code == 401
        held = guesser.post("/login", data={"token": ADMIN}, follow_redirects=False)
        assert held.status_code == 429 and held.headers["retry-after"] == "60" and "Too many" in held.text
        assert neighbour.post("/login", data={"token": ADMIN}, follow_redirects=False).status_code == 303
        clock.advance(61)
        assert guesser.post("/login", data={"token": ADMIN}, follow_redirects=False).status_code == 303


def test_api_docs_need_a_principal_and_load_nothing_from_the_network(client, history) -> None:
    """/api/docs is for someone who may use the API (a login or a bearer token), and its page loads
    Swagger UI from this server only: no CDN, so it works air-gapped and runs no foreign script."""
    res = client.get("/api/docs", follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/login?next=%2Fapi%2Fdocs"
    assert client.get("/api/docs", headers={"Authorization": "Bearer wrong-token-0123456789"},
                      follow_redirects=False).status_code == 303
    page = client.get("/api/docs", headers=AS_READER)
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert not re.findall(r"(?:src|href)=['\"](?:https?:)?//", page.text), "an asset from another host"
    assets = re.findall(r"(?:src|href)=['\"](/api/docs/assets/[^'\"]+)", page.text)
    assert len(assets) == 3
    for path in assets:
        assert client.get(path).status_code == 200, path
    _login(client, READ)
    assert client.get("/api/docs").status_code == 200  # a dashboard session will do in a browser


def test_dashboard_release_form_needs_admin_and_csrf(client, history, sessions, dispatch) -> None:
    _login(client, ADMIN)
    page = client.get("/quarantine").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    forged = client.post("/nodes/gpu-node-8/release", data={"reason": "x", "csrf": "0" * 32})
    assert forged.status_code == 403
    res = client.post("/nodes/gpu-node-8/release", data={"reason": "fan replaced", "csrf": csrf, "back": "/quarantine"},
                      follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/quarantine?msg=gpu-node-8%20released"
    assert "no node is quarantined" in client.get(res.headers["location"]).text
    with sessions() as s:
        row = s.scalars(select(AuditLog).where(AuditLog.action == "release")).one()
        assert row.reason == "fan replaced" and row.actor.startswith("dana (token ")
    again = client.post("/nodes/gpu-node-8/release", data={"reason": "x", "csrf": csrf}, follow_redirects=False)
    assert "err=gpu-node-8%20is%20not%20quarantined" in again.headers["location"]
