"""The FastAPI application: JSON API, dashboard, ``/healthz`` and ``/metrics``.

:func:`create_app` takes its dependencies (settings, a session factory, an optional queue-depth callable,
a clock, the dispatcher) and creates no global state. Errors map the same everywhere: 422 a bad filter,
400 a node name in several clusters with none named, 404 unknown, 409 a refused lever, 503 no database;
JSON on ``/api`` paths, HTML elsewhere.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.factory import evidence_storage
from remediation.api import (
    domain_repairs,
    incidents,
    incidents_ui,
    policy,
    reliability_ui,
    repair_requests,
    ui,
)
from remediation.api.auth import browser_principal, header_token, identify
from remediation.api.docs import mount_docs
from remediation.api.guard import BodyGuard
from remediation.api.levers import node_href
from remediation.api.ratelimit import LoginLimiter
from remediation.api.routes import router
from remediation.clock import SystemClock
from remediation.db.session import DatabaseUnavailable, make_engine, make_session_factory
from remediation.domain.policy import Clock
from remediation.incidents.service import IncidentError
from remediation.ports.dispatch import Dispatcher, SweeperOnly
from remediation.profiles.service import governance
from remediation.reports.reliability import TEMPLATES as REPORT_TEMPLATES
from remediation.services.clusters import AmbiguousNode
from remediation.services.lever_rules import LeverError
from remediation.services.levers import LeverService
from remediation.services.metrics import make_registry
from remediation.services.readmodels import ReadModelError, RecordNotFound, ago, human_duration
from remediation.settings import Settings

HERE = Path(__file__).parent


def create_app(settings: Settings, sessions: sessionmaker[Session] | None = None,
               queue_depth: Callable[[], dict[str, int]] | None = None, *, clock: Clock | None = None,
               dispatcher: Dispatcher | None = None) -> FastAPI:
    """The API and dashboard on ``sessions`` (else the configured database); levers hand follow-up
    work to ``dispatcher``, and ``queue_depth`` reports the broker's queues in the metrics."""
    app = FastAPI(
        title="node-remediation",
        version="1",
        description="On-call API of node-remediation. Every endpoint needs a bearer token; levers "
        "(POST) need an admin token.",
        docs_url=None,  # remediation.api.docs serves /api/docs: behind a login, with local assets
        redoc_url=None,
    )
    if sessions is None:
        sessions = make_session_factory(make_engine(settings.database))
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.queue_depth = queue_depth
    app.state.clock = clock or SystemClock()
    app.state.session_key = settings.api.session_key_bytes()  # in memory only; never logged
    app.state.login_limiter = LoginLimiter(settings.api.login_attempts_per_minute)
    # Levers hand their follow-up work to the dispatcher passed in; without one it waits for the sweeper.
    app.state.levers = LeverService(sessions, dispatcher or SweeperOnly(), settings.policy,
                                    clock=app.state.clock,
                                    via="api", governance=governance(settings))
    app.state.registry = make_registry(sessions, queue_depth, app.state.clock)
    app.state.evidence_storage = evidence_storage(settings)  # collected evidence's items, read back
    # The dashboard's pages, and the report's body the Reliability page shares with the standalone report.
    templates = Jinja2Templates(directory=[str(HERE / "templates"), str(REPORT_TEMPLATES)])
    templates.env.filters["dur"] = human_duration
    templates.env.globals["ago"] = lambda at: ago(at, app.state.clock.now())
    templates.env.globals["node_href"] = node_href
    app.state.templates = templates

    mount_docs(app)  # before the routers: /api/docs/assets must not fall to a catch-all route
    app.include_router(router)
    app.include_router(incidents.router)
    app.include_router(domain_repairs.router)
    app.include_router(repair_requests.router)
    app.include_router(policy.router)
    app.include_router(ui.router)
    app.include_router(incidents_ui.router)
    app.include_router(reliability_ui.router)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    _errors(app)
    app.add_middleware(BodyGuard, max_bytes=settings.api.max_body_bytes)
    app.add_exception_handler(ui.LoginRequired, ui.login_redirect)
    _ops(app, settings, sessions)
    return app


def _ops(app: FastAPI, settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The operators' endpoints: ``/healthz`` (no auth) and ``/metrics`` (a token if so configured)."""

    @app.get("/healthz", tags=["ops"], summary="Liveness and database reachability (no auth)",
             responses={200: {"description": "Alive, and the database answers"},
                        503: {"description": "Alive, but the database does not answer"}})
    def healthz() -> JSONResponse:
        try:
            with sessions() as s:
                s.execute(text("SELECT 1 FROM remediations WHERE 1 = 0"))
        except SQLAlchemyError as exc:
            return JSONResponse({"status": "error", "database": type(exc).__name__}, status_code=503)
        return JSONResponse({"status": "ok", "database": "ok"})

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics, read from the database",
             response_class=PlainTextResponse,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "The metrics"},
                        401: {"content": {"text/plain": {}},
                              "description": "No known token (when metrics_require_token is set)"}})
    def metrics(request: Request) -> Response:
        if settings.api.metrics_require_token:
            if identify(header_token(request), settings.api) is None:
                return PlainTextResponse("unauthorized\n", 401, headers={"WWW-Authenticate": "Bearer"})
        return Response(generate_latest(app.state.registry), media_type=CONTENT_TYPE_LATEST)


def _errors(app: FastAPI) -> None:
    def respond(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": message}, status_code=status)
        templates: Jinja2Templates = request.app.state.templates
        try:
            who = browser_principal(request)
        except (DatabaseUnavailable, SQLAlchemyError):  # the page may be about the database being down
            who = None
        return templates.TemplateResponse(request, "error.html", {
            "status": status, "message": message, "who": who, "path": request.url.path},
            status_code=status)

    @app.exception_handler(RecordNotFound)
    def not_found(request: Request, exc: RecordNotFound) -> Response:
        return respond(request, 404, str(exc))

    @app.exception_handler(AmbiguousNode)
    def ambiguous(request: Request, exc: AmbiguousNode) -> Response:
        return respond(request, 400, str(exc))

    @app.exception_handler(ReadModelError)
    def bad_request(request: Request, exc: ReadModelError) -> Response:
        return respond(request, 422, str(exc))

    @app.exception_handler(IncidentError)
    def incident_refused(request: Request, exc: IncidentError) -> Response:
        return respond(request, 409, str(exc))

    @app.exception_handler(LeverError)
    def refused(request: Request, exc: LeverError) -> Response:
        return respond(request, 409, str(exc))

    @app.exception_handler(DatabaseUnavailable)
    def db_down(request: Request, exc: DatabaseUnavailable) -> Response:
        return respond(request, 503, str(exc))

    @app.exception_handler(SQLAlchemyError)
    def db_error(request: Request, exc: SQLAlchemyError) -> Response:
        return respond(request, 503, f"database error ({type(exc).__name__}); see the service logs")
