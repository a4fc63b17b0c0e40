"""The storm breaker's pool is the nodes a watcher's resync confirmed, not every name on the stream."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.api import create_app
from remediation.cli.status import _pool_line
from remediation.clock import FakeClock
from remediation.db.models import Node
from remediation.db.queries import cluster_view
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.holds import automation_status
from remediation.services.ingest import ingest
from remediation.settings import Settings
from tests.integration.history import sessions  # noqa: F401  (fixture)

TOKEN = "read-token-0123456789"
SETTINGS = Settings(policy={"pool_stale_s": 900}, api={"read_tokens": [TOKEN]})


def _send(sessions: sessionmaker[Session], clock: FakeClock, kind: EventKind, names: list[str], key: str) -> None:
    events = [NodeEvent(source=Source.SLURM, node=n, kind=kind, state="IDLE" if kind == EventKind.INVENTORY
                        else "DOWN", observed_at=clock.now(), dedupe_key=f"slurm:{n}:{key}").to_json()
              for n in names]
    with sessions() as s, s.begin():
        ingest(s, events, SETTINGS.policy, clock=clock)


def _pool(sessions: sessionmaker[Session], clock: FakeClock) -> int:
    with sessions() as s:
        view = cluster_view(s, clock.now(), SETTINGS.policy.breaker_window, exclude=None,
                            pool_stale=SETTINGS.policy.pool_stale)
    return view.pool_size


def test_only_nodes_a_resync_listed_lately_make_up_the_pool(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    real = [f"gpu-node-{i}" for i in range(10)]
    assert _pool(sessions, clock) == 0
    _send(sessions, clock, EventKind.UNHEALTHY, ["ghost-1", "ghost-2"], "down")  # before any resync
    assert _pool(sessions, clock) == 2  # nothing confirmed yet: every row counts, as before
    _send(sessions, clock, EventKind.INVENTORY, real, "inventory:IDLE")  # the Slurm watcher's resync
    _send(sessions, clock, EventKind.UNHEALTHY, [f"ghost-{i}" for i in range(3, 6)], "down")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Node)) == 15  # every name still has its row
    assert _pool(sessions, clock) == 10  # the names no resync listed do not dilute the breaker
    for _ in range(2):  # two resyncs that no longer list gpu-node-8 and -9 (re-sent: duplicates, yet confirm)
        clock.advance(500)
        _send(sessions, clock, EventKind.INVENTORY, real[:8], "inventory:IDLE")
    assert _pool(sessions, clock) == 8  # last listed 1000 s before the latest resync: past pool_stale_s
    clock.advance(86400)  # the watcher stops: nobody is confirmed, so nobody leaves
    assert _pool(sessions, clock) == 8
    with sessions() as s:
        pool = automation_status(s, SETTINGS.policy.pool_stale)["pool"]
    assert pool == {"rows": 15, "confirmed": 8, "stale": 2, "unconfirmed": 5, "counted": 8}
    assert _pool_line(pool) == ("8 nodes confirmed by a watcher resync; left out: 2 not listed lately "
                                "(policy.pool_stale_s), 5 never listed")
    with TestClient(create_app(SETTINGS, sessions, clock=clock)) as dashboard:
        dashboard.post("/login", data={"token": TOKEN, "next": "/"})
        page = dashboard.get("/").text
        assert "pool (7 left out)" in page, page[-3000:]
