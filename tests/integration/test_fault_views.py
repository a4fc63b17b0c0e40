"""Fault class, chosen action and lemon score on every on-call surface: the CLI (`nodes
list/show`, `remediations list/show`, `stats --lemons`), the JSON API, the dashboard and /metrics,
over the shared test history (tests/integration/history.py) built with classification and lemon
scoring on, as shipped."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.api import create_app
from remediation.cli.oncall import app as cli
from remediation.db.models import Remediation
from remediation.ports.dispatch import SweeperOnly
from remediation.settings import Settings
from tests.integration.history import History, build, engine_settings
from tests.integration.test_cli import db  # noqa: F401  (fixture)

ON = {"faults": {"classify": True}, "lemon": {"enabled": True}}
READ = "read-token-0123456789"


@pytest.fixture
def history(db: tuple[str, sessionmaker[Session]]) -> History:
    base = engine_settings()
    settings = Settings(policy={**base.policy.model_dump(), **ON}, workflow=base.workflow.model_dump())
    return build(db[1], settings)


@pytest.fixture
def run(db: tuple[str, sessionmaker[Session]], monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        env = {"REMEDIATION_DATABASE__URL": db[0], "USER": "oncall-tester", "COLUMNS": "250"}
        return runner.invoke(cli, list(args), env=env, obj=lambda settings: SweeperOnly())

    return invoke


@pytest.fixture
def client(db: tuple[str, sessionmaker[Session]]) -> Iterator[TestClient]:
    settings = Settings(database={"url": db[0]}, api={"read_tokens": [READ]}, policy=ON)
    with TestClient(create_app(settings, db[1], queue_depth=None, dispatcher=SweeperOnly())) as c:
        yield c


def classes(db: tuple[str, sessionmaker[Session]]) -> dict[str, tuple[str | None, str | None]]:
    with db[1]() as s:
        return {r.node: (r.fault_class, r.action) for r in s.scalars(select(Remediation).order_by(Remediation.id))}


def expected_score(db: tuple[str, sessionmaker[Session]], node: str) -> float:
    """The lemon score worked out by hand from the node's remediations: weights 1.5 (gpu-memory) and
    1.0 (unknown), a 14-day half-life, x1.25 per distinct cause beyond the first."""
    weight = {"gpu-memory": 1.5, "unknown": 1.0, "host": 1.0, "gpu-hardware": 1.5}
    now = datetime.now(UTC)
    with db[1]() as s:
        rows = s.execute(select(Remediation.opened_at, Remediation.fault_class).where(Remediation.node == node)).all()
    total = sum(weight[c] * 0.5 ** ((now - at).total_seconds() / (14 * 86400)) for at, c in rows)
    return total * 1.25 ** (len({c for _, c in rows}) - 1)


def test_history_is_classified_as_the_signals_say(db, history) -> None:
    got = classes(db)
    assert got["gpu-node-3"] == ("gpu-hardware", "move-host")  # xid 79: fallen off the bus
    assert got["gpu-node-8"] == ("host", "quarantine")  # DOWN, Not responding; never recovered
    assert got["gpu-node-4"] == ("gpu-memory", "move-host")  # "ecc errors", still draining


def test_cli_remediations_show_class_and_action(run, history) -> None:
    res = run("remediations", "list", "--status", "closed")
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[0].split()
    assert header[:10] == ["ID", "NODE", "STATUS", "PROFILE", "STEP", "OPENED", "TOOK", "CLASS", "ACTION", "CAUSE"]
    row = next(line for line in res.stdout.splitlines() if line.split()[:2] == [str(history.ok), "gpu-node-3"])
    assert re.search(r"\bgpu-hardware\s+move-host\b", row)
    shown = run("remediations", "show", str(history.quarantined))
    assert shown.exit_code == 0, shown.output
    assert re.search(r"Class:\s+host", shown.stdout) and re.search(r"Action:\s+quarantine", shown.stdout)
    assert "Not responding" in shown.stdout
    data = json.loads(run("remediations", "show", str(history.ok), "-o", "json").stdout)
    assert (data["fault_class"], data["action"]) == ("gpu-hardware", "move-host")
    assert data["fault_evidence"].startswith("xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")


def test_cli_nodes_show_the_lemon_score_and_why(run, history, db) -> None:
    res = run("nodes", "list")
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[0]
    at = header.index("LEMON")  # the table's columns line up under their headers
    lemon = {line.split()[0]: line[at:].split()[0] for line in res.stdout.splitlines()[1:]}
    # gpu-node-9 failed twice two days ago (xid 48: gpu-memory, xid 49: unknown); gpu-node-0 never failed.
    assert float(lemon["gpu-node-9"]) == pytest.approx(expected_score(db, "gpu-node-9"), abs=0.01)
    assert 2.5 <= float(lemon["gpu-node-9"]) < 3.0  # the score is over the threshold, the count not yet
    assert lemon["gpu-node-0"] == "-"
    show = run("nodes", "show", "gpu-node-9")
    assert show.exit_code == 0, show.output
    assert "Lemon score:" in show.stdout and "gpu-memory x1" in show.stdout and "2 distinct cause(s)" in show.stdout
    data = json.loads(run("nodes", "list", "-o", "json").stdout)
    nine = next(n for n in data if n["name"] == "gpu-node-9")
    assert nine["lemon_score"] == pytest.approx(expected_score(db, "gpu-node-9"), abs=0.01)
    assert "unknown x1" in nine["lemon"]


def test_cli_stats_lemons_ranks_worst_first(run, history) -> None:
    res = run("stats", "--lemons")
    assert res.exit_code == 0, res.output
    assert "threshold 2.5" in res.stdout
    lines = [line for line in res.stdout.splitlines() if line.startswith("gpu-node-")]
    assert lines[0].split()[:2] == ["gpu-node-9", "healthy"]
    assert lines[0].split()[5] == "no"  # over the score, but two failures are never a lemon
    rows = json.loads(run("stats", "--lemons", "-o", "json").stdout)
    assert [r["node"] for r in rows][0] == "gpu-node-9"
    assert rows == sorted(rows, key=lambda r: -r["score"])
    assert {r["node"] for r in rows} == {"gpu-node-3", "gpu-node-4", "gpu-node-8", "gpu-node-9"}


def test_api_dashboard_and_metrics_carry_class_action_and_score(client, history, db) -> None:
    auth = {"Authorization": f"Bearer {READ}"}
    rem = client.get(f"/api/v1/remediations/{history.ok}", headers=auth).json()
    assert (rem["fault_class"], rem["action"]) == ("gpu-hardware", "move-host")
    listed = client.get("/api/v1/remediations?status=closed", headers=auth).json()
    assert {r["fault_class"] for r in listed} >= {"gpu-hardware", "host"}
    node = client.get("/api/v1/nodes/gpu-node-9", headers=auth).json()["node"]
    assert node["lemon_score"] == pytest.approx(expected_score(db, "gpu-node-9"), abs=0.01)
    assert "distinct cause" in node["lemon"]
    lemons = client.get("/api/v1/lemons", headers=auth).json()
    assert lemons[0]["node"] == "gpu-node-9" and lemons[0]["over_threshold"] is False
    assert lemons[0]["failures"] == 2 and lemons[0]["distinct_causes"] == 2

    client.post("/login", data={"token": READ, "next": "/"})
    page = client.get(f"/remediations/{history.ok}").text
    assert "gpu-hardware" in page and "move-host" in page
    assert "<th>Lemon</th>" in client.get("/nodes").text
    assert "Lemon score" in client.get("/nodes/gpu-node-9").text and "distinct cause" in client.get("/nodes/gpu-node-9").text
    assert "<th>Class</th><th>Action</th>" in client.get("/remediations?status=").text

    metrics = client.get("/metrics").text
    assert 'remediation_remediations_by_class_total{action="move-host",cluster="default",fault_class="gpu-hardware"} 1.0' in metrics
    assert 'remediation_remediations_by_class_total{action="quarantine",cluster="default",fault_class="host"} 1.0' in metrics
