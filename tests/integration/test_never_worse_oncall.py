"""Never worse, as on-call sees it: the latched breaker in the CLI, the API, the dashboard and /metrics;
cancel --give-back through the CLI and the API; dry-run history shown or hidden in stats. Real
Postgres; the workflow runs on the in-memory world to make the history these read."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopKube, NoopMachine, NoopSlurm
from remediation.api import create_app
from remediation.cli.oncall import app as cli_app
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import Dispatcher
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.history import dispatch, dispatcher, drive, sessions  # noqa: F401  (fixtures)
from tests.integration.test_never_worse import publish

ADMIN, READ = "admin-token-0123456789", "read-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READ}"}


@dataclass
class Storm:
    held: list[int]  # remediations held at k8s_evict by the open breaker
    dry: int  # a finished dry-run remediation


@pytest.fixture
def storm(sessions: sessionmaker[Session]) -> Storm:  # noqa: F811
    db = sessions
    """Five of twenty nodes fail for real (the breaker opens and latches); one more failed in dry-run."""
    nodes = [f"gpu-node-{i}" for i in range(20)]
    clock, world = FakeClock(datetime.now(UTC) - timedelta(hours=2)), MemoryWorld(nodes=nodes)
    settings = Settings(policy={"min_restart_gap_s": 0, "breaker_max_fraction": 0.10},
                        workflow={"poll_interval_s": 5})
    engine = Workflow(db, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                      clock=clock)
    with db() as s, s.begin():  # the watchers' resync: every node is in the pool
        ingest(s, [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.INVENTORY, state="IDLE",
                             observed_at=clock.now()).to_json() for n in nodes], settings.policy, clock=clock)
    clock.advance(1)
    # First a rehearsal: one node fails while the service runs in dry-run.
    dry_settings = Settings(dry_run=True, policy={"min_restart_gap_s": 0}, workflow={"poll_interval_s": 5})
    dry = Workflow(db, Adapters(NoopSlurm(MemorySlurm(world)), NoopKube(MemoryKube(world)), NoopMachine()), dry_settings,
                 clock=clock)
    (f,) = publish(db, dry_settings, clock, "gpu-node-19", world=world)
    drive(dry, clock, [f])
    dry_id = f.remediation_id
    held = []
    for i in range(5):
        (f,) = publish(db, settings, clock, f"gpu-node-{i}", reason="leaf switch lost", world=world)
        for _ in range(4):  # drain, cordon, then held at the breaker
            f = engine.run(f.remediation_id, f.step)
        held.append(f.remediation_id)
    clock.advance(1800)  # far past the window: still latched
    return Storm(held, dry_id)


@pytest.fixture
def client(pg_url: str, sessions: sessionmaker[Session], dispatcher: Dispatcher) -> Iterator[TestClient]:  # noqa: F811
    settings = Settings(database={"url": pg_url}, api={"admin_tokens": [ADMIN], "read_tokens": [READ]})
    with TestClient(create_app(settings, sessions, queue_depth=lambda: {}, dispatcher=dispatcher)) as c:
        yield c


@pytest.fixture
def run(pg_url: str, monkeypatch: pytest.MonkeyPatch, dispatcher: Dispatcher):  # noqa: ANN201
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        return runner.invoke(cli_app, list(args), env={"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall",
                                                       "COLUMNS": "250"}, obj=lambda settings: dispatcher)

    return invoke


def test_cli_breaker_status_and_close(run, storm, sessions, dispatch) -> None:
    res = run("breaker", "status")
    assert res.exit_code == 0 and res.stdout.startswith("storm breaker OPEN since ")
    assert "3/20 nodes failed" in res.stdout and "remediation breaker close -r REASON" in res.stdout
    assert run("breaker", "close").exit_code != 0  # a reason is required
    res = run("breaker", "close", "-r", "switch replaced")
    assert res.exit_code == 0 and "5 held remediation(s) re-check their trigger now" in res.stdout
    assert sorted(f.remediation_id for f in dispatch.steps_called) == sorted(storm.held)
    assert "closed at" in run("breaker", "status").stdout and "switch replaced" in run("breaker", "status").stdout
    res = run("breaker", "close", "-r", "again")
    assert res.exit_code == 1 and "not open" in res.output
    with sessions() as s:
        (row,) = s.scalars(select(AuditLog).where(AuditLog.action == "breaker_closed")).all()
        assert (row.actor, row.reason) == ("oncall", "switch replaced")
        assert all(s.get(Remediation, rid).context["reconfirm"] for rid in storm.held)


def test_cli_cancel_give_back_queues_the_undo(run, storm, sessions, dispatch) -> None:
    res = run("cancel", str(storm.held[0]), "-r", "false alarm", "--give-back")
    assert res.exit_code == 0 and "giving back node/gpu-node-0" in res.stdout
    assert dispatch.released(sessions) == ["gpu-node-0"]
    res = run("cancel", str(storm.held[1]), "-r", "keep it drained")
    assert res.exit_code == 0 and "left as it is" in res.stdout and dispatch.released(sessions) == ["gpu-node-0"]
    with sessions() as s:
        rows = s.scalars(select(AuditLog).where(AuditLog.action == "cancel").order_by(AuditLog.id)).all()
        assert [r.detail["give_back"] for r in rows] == [True, False]


def test_cli_stats_hides_dry_run_unless_asked(run, storm) -> None:
    hidden = run("stats", "-o", "json")
    shown = run("stats", "-o", "json", "--dry-run")
    assert hidden.exit_code == shown.exit_code == 0
    assert '"total": 5' in hidden.stdout and '"dry_run": 1' in hidden.stdout
    assert '"total": 6' in shown.stdout
    assert "1 dry-run remediation(s) hidden (show them with --dry-run)" in run("stats").stdout


def test_api_breaker_route_close_and_cancel_give_back(client, storm, sessions, dispatch) -> None:
    state = client.get("/api/v1/breaker", headers=AS_READER).json()
    assert state["open"] is True and "3/20 nodes failed" in state["reason"]
    assert client.post("/api/v1/breaker/close", json={"reason": "x"}, headers=AS_READER).status_code == 403
    res = client.post("/api/v1/breaker/close", json={"reason": "switch fixed", "actor": "erin"}, headers=AS_ADMIN)
    assert res.status_code == 200 and "5 held" in res.json()["message"]
    assert client.get("/api/v1/breaker", headers=AS_READER).json()["open"] is False
    assert client.post("/api/v1/breaker/close", json={"reason": "x"}, headers=AS_ADMIN).status_code == 409
    res = client.post(f"/api/v1/remediations/{storm.held[2]}/cancel", json={"reason": "ok", "give_back": True},
                      headers=AS_ADMIN)
    assert res.status_code == 200 and "giving back" in res.json()["message"] and dispatch.released(sessions) == ["gpu-node-2"]
    stats = client.get("/api/v1/stats", headers=AS_READER).json()
    assert stats["dry_run"] == 1 and stats["total"] == 5
    assert client.get("/api/v1/stats?dry_run=true", headers=AS_READER).json()["total"] == 6
    with sessions() as s:
        row = s.scalars(select(AuditLog).where(AuditLog.action == "breaker_closed")).one()
        assert row.actor.startswith("erin (token ")


def test_dashboard_and_metrics_show_it_open_and_why_until_closed(client, storm, dispatch) -> None:
    text = client.get("/metrics").text
    assert re.search(r'^remediation_breaker_open\{cluster="default"\} 1\.0$', text, re.M)
    assert re.search(r'^remediation_breaker_open_info\{cluster="default",reason="3/20 nodes failed[^"]*",since="[^"]+"\} 1\.0$', text,
                     re.M)
    client.post("/login", data={"token": ADMIN, "name": "dana", "next": "/"})
    page = client.get("/").text
    assert "Storm breaker open" in page and "3/20 nodes failed" in page and "Close the storm breaker" in page
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    res = client.post("/breaker/close", data={"reason": "fixed", "csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303 and "storm%20breaker%20closed" in res.headers["location"]
    assert "Close the storm breaker" not in client.get("/").text
    text = client.get("/metrics").text
    assert re.search(r'^remediation_breaker_open\{cluster="default"\} 0\.0$', text, re.M) and "remediation_breaker_open_info{" not in text
