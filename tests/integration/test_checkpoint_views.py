"""The checkpoint request on every on-call surface: `nodes show`, the JSON API and the dashboard's
node page all say "asked job 123 to checkpoint (USR1) 40 s ago; waiting up to 300 s", rendered from
the request recorded on the drain's step row (typed fields, served as such by the API), and say
nothing once the drain is over."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.adapters.memory import MemoryWorld
from remediation.api import create_app
from remediation.cli.oncall import app as cli
from remediation.clock import FakeClock
from remediation.ports.dispatch import FollowUp, SweeperOnly
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.test_checkpoint_engine import make_engine, make_settings, publish
from tests.integration.test_cli import db  # noqa: F401  (fixture)

READ = "read-token-0123456789"
NODE = "gpu-node-1"
#: What every surface says, 40 s (give or take the test's own run time) after the request.
SAID = re.compile(r"asked job 123 to checkpoint \(USR1\) ([45]\d) s ago; waiting up to 300 s")


@pytest.fixture
def waiting(db: tuple[str, sessionmaker[Session]]) -> tuple[Workflow, FollowUp, MemoryWorld, FakeClock]:
    """A remediation whose drain asked job 123 to checkpoint 40 s ago and waits for it."""
    clock = FakeClock(datetime.now(UTC) - timedelta(seconds=40))
    world = MemoryWorld(nodes=[NODE])
    settings = make_settings(checkpoint_wait_s=300)
    engine = make_engine(db[1], world, settings, clock)
    world.set_jobs(NODE, ["123"])
    f = publish(db[1], settings, clock, world, NODE)
    nxt = engine.run(f.remediation_id, f.step)
    assert nxt is not None and nxt.step == "slurm_drain"
    return engine, nxt, world, clock


@pytest.fixture
def client(db: tuple[str, sessionmaker[Session]]) -> Iterator[TestClient]:
    settings = Settings(database={"url": db[0]}, api={"read_tokens": [READ]})
    with TestClient(create_app(settings, db[1], queue_depth=None, dispatcher=SweeperOnly())) as c:
        yield c


def nodes_show(db: tuple[str, sessionmaker[Session]], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    env = {"REMEDIATION_DATABASE__URL": db[0], "USER": "oncall-tester", "COLUMNS": "250"}
    result = CliRunner().invoke(cli, ["nodes", "show", NODE], env=env, obj=lambda settings: SweeperOnly())
    assert result.exit_code == 0, result.output
    return result.output


Waiting = tuple[Workflow, FollowUp, MemoryWorld, FakeClock]
Db = tuple[str, sessionmaker[Session]]


def test_nodes_show_says_who_was_asked_when_and_how_long_it_waits(
    db: Db, waiting: Waiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = nodes_show(db, monkeypatch)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Checkpoint:")]
    assert SAID.search(line), line


def test_the_api_serves_the_request_typed_and_the_dashboard_shows_it(
    client: TestClient, waiting: Waiting
) -> None:
    body = client.get(f"/api/v1/nodes/{NODE}", headers={"Authorization": f"Bearer {READ}"}).json()
    checkpoint = body["checkpoint"]
    assert (checkpoint["jobs"], checkpoint["signal"], checkpoint["scope"]) == (["123"], "USR1", "batch")
    assert (checkpoint["wait_s"], checkpoint["sent"], checkpoint["dry_run"]) == (300, True, False)
    asked = datetime.fromisoformat(checkpoint["asked_at"])
    assert 39 <= (datetime.now(UTC) - asked).total_seconds() < 60
    assert SAID.search(checkpoint["text"])
    client.post("/login", data={"token": READ, "next": "/"})
    assert SAID.search(client.get(f"/nodes/{NODE}").text)


def test_once_the_job_has_left_nothing_is_said(
    db: Db, client: TestClient, waiting: Waiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, f, world, clock = waiting
    world.set_jobs(NODE, [])
    clock.advance(f.countdown)
    assert engine.run(f.remediation_id, f.step) is not None  # the drain is done: on to the cordon
    (line,) = [ln for ln in nodes_show(db, monkeypatch).splitlines() if ln.startswith("Checkpoint:")]
    assert re.fullmatch(r"Checkpoint:\s+-\s*", line), line
    body = client.get(f"/api/v1/nodes/{NODE}", headers={"Authorization": f"Bearer {READ}"}).json()
    assert body["checkpoint"] is None
