"""``policy show`` and ``policy explain`` in the CLI (direct database mode) and the API, the profile on
nodes, remediations, stats, the dashboard and /metrics, over real Postgres: nodes reported by the
Slurm watcher's inventory, a fault in each of two pools, one acting and one in shadow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.api import create_app
from remediation.cli.oncall import app as cli
from remediation.clock import FakeClock
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.profiles.service import governance
from remediation.services.ingest import IngestRules, ingest
from remediation.settings import Settings
from tests.integration.history import sessions  # noqa: F401  (the fixture: the database the CLI reads too)
from tests.integration.test_profiles_engine import inventory_events

TOKEN = "read-token-0123456789"
PROFILES = [
    {"name": "train", "select": {"partitions": ["train"]}, "policy": {"max_concurrent": 2},
     "workflow": {"on_jobs_timeout": "requeue"}},
    {"name": "serve", "select": {"partitions": ["serve"]}, "mode": "shadow"},
    {"name": "h100", "select": {"features": ["h100"]}, "policy": {"repeat_offender_count": 5}},
    {"name": "nvl72", "select": {"features": ["gb200"]}},  # no such node: flagged
]


@pytest.fixture
def settings(pg_url: str) -> Settings:
    return Settings(database={"url": pg_url}, api={"read_tokens": [TOKEN]}, policy={"max_concurrent": 6},
                    profiles=PROFILES)


@pytest.fixture
def fleet(sessions: sessionmaker[Session], settings: Settings) -> None:  # noqa: F811
    clock = FakeClock(datetime.now(UTC))
    facts = {"gpu-node-1": (["train"], ["h100"]), "gpu-node-2": (["train"], []), "gpu-node-5": (["serve"], []),
             "gpu-node-9": (["gpu"], [])}
    events = inventory_events(clock, facts)
    events += [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.UNHEALTHY, state="FAIL", reason="xid 79",
                         observed_at=clock.now()).to_json() for n in ("gpu-node-2", "gpu-node-5")]
    with sessions() as s, s.begin():
        ingest(s, events, settings.policy, clock=clock, rules=IngestRules(governance=governance(settings)))


@pytest.fixture
def client(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[TestClient]:  # noqa: F811
    with TestClient(create_app(settings, sessions)) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        yield c


@pytest.fixture
def run(pg_url: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("REMEDIATION_CONFIG", "")

    def invoke(*args: str, profiles: object = PROFILES):  # noqa: ANN202
        env = {"REMEDIATION_DATABASE__URL": pg_url, "REMEDIATION_POLICY__MAX_CONCURRENT": "6",
               "REMEDIATION_PROFILES": json.dumps(profiles), "USER": "oncall", "COLUMNS": "250"}
        return CliRunner().invoke(cli, list(args), env=env)

    return invoke


def test_explain_names_the_profile_the_order_and_every_layer(run, fleet) -> None:
    res = run("policy", "explain", "gpu-node-1", "-o", "json")
    assert res.exit_code == 0, res.output
    found = json.loads(res.stdout)
    assert (found["profile"], found["also_matched"]) == ("train", ["h100"])
    assert "train is the first that selects it; h100 also do" in found["why"]
    fields = {f["field"]: (f["value"], f["layer"]) for f in found["fields"]}
    assert fields["policy.max_concurrent"] == (2, "profile")
    assert fields["workflow.on_jobs_timeout"] == ("requeue", "profile")
    assert fields["policy.repeat_offender_count"] == (3, "default")  # h100's 5 lost to the order
    assert found["facts"] == {"partitions": ["train"], "features": ["h100"], "labels": {}}
    table = run("policy", "explain", "gpu-node-9")
    assert "profile: (base), mode act: no profile selects it" in table.stdout
    assert re.search(r"policy\.max_concurrent\s+6\s+base config", table.stdout)


def test_explain_shows_what_an_open_remediation_recorded(run, fleet) -> None:
    found = json.loads(run("policy", "explain", "gpu-node-5", "-o", "json").stdout)
    rem = found["open_remediation"]
    assert (found["profile"], found["mode"]) == ("serve", "shadow")
    assert (rem["profile"], rem["dry_run"], rem["policy"]["mode"]) == ("serve", True, "shadow")


def test_show_flags_a_profile_that_governs_no_node(run, fleet) -> None:
    res = run("policy", "show")
    assert res.exit_code == 0, res.output
    assert "warning: profile nvl72 governs none of the 4 known nodes" in res.stdout
    assert "warning: profile train" not in res.stdout
    one = json.loads(run("policy", "show", "train", "-o", "json").stdout)
    assert one["profile"]["nodes"] == 2 and not one["profile"]["wins_no_node"]
    assert {p["name"]: p["wins_no_node"] for p in one["profiles"]}["nvl72"] is True
    assert run("policy", "show", "nope").exit_code != 0


def test_a_malformed_selector_stops_the_cli_naming_it(run) -> None:
    bad = [{"name": "x", "select": {"labels": "pool in (a"}}]
    res = run("policy", "show", profiles=bad)
    assert res.exit_code != 0
    assert "profiles.0.select.labels" in res.output and "malformed label selector 'pool in (a'" in res.output


def test_the_api_serves_the_same(client, fleet) -> None:
    explained = client.get("/api/v1/nodes/gpu-node-1/policy").json()
    assert (explained["profile"], explained["also_matched"]) == ("train", ["h100"])
    shown = client.get("/api/v1/policy").json()
    # h100 selects gpu-node-1, but train, above it, wins it: flagged as well.
    assert [p["name"] for p in shown["profiles"] if p["wins_no_node"]] == ["h100", "nvl72"]
    assert client.get("/api/v1/policy/profiles/h100").json()["profile"]["nodes"] == 0
    assert client.get("/api/v1/policy/profiles/nope").status_code == 404
    assert client.get("/api/v1/nodes/nobody/policy").status_code == 404


def test_profile_on_nodes_remediations_stats_dashboard_and_metrics(client, fleet, run) -> None:
    nodes = {n["name"]: n["profile"] for n in client.get("/api/v1/nodes").json()}
    assert nodes == {"gpu-node-1": "train", "gpu-node-2": "train", "gpu-node-5": "serve", "gpu-node-9": None}
    assert [n["name"] for n in client.get("/api/v1/nodes", params={"profile": "serve"}).json()] == ["gpu-node-5"]
    rems = client.get("/api/v1/remediations", params={"profile": "serve"}).json()
    assert [(r["node"], r["profile"], r["dry_run"]) for r in rems] == [("gpu-node-5", "serve", True)]
    detail = client.get(f"/api/v1/remediations/{rems[0]['id']}").json()
    assert detail["policy"]["profile"] == "serve"
    stats = client.get("/api/v1/stats", params={"profile": "serve", "dry_run": "true"}).json()
    assert (stats["total"], stats["dry_run"], stats["profile"]) == (1, 1, "serve")
    assert client.get("/api/v1/stats", params={"profile": "train"}).json()["total"] == 1
    metrics = client.get("/metrics").text
    assert 'remediation_profile_nodes{cluster="default",profile="train"} 2.0' in metrics
    assert 'remediation_profile_remediations_open{cluster="default",dry_run="true",profile="serve"} 1.0' in metrics
    listed = run("remediations", "list", "--profile", "serve")
    assert "serve (dry-run: records only)" in listed.stdout and "gpu-node-2" not in listed.stdout
    shown = run("nodes", "show", "gpu-node-2")
    assert re.search(r"Profile:\s+train", shown.stdout)
    res = client.post("/login", data={"token": TOKEN, "name": "dana", "next": "/nodes"}, follow_redirects=False)
    assert res.status_code == 303
    page = client.get("/nodes", params={"profile": "serve"}).text
    assert "gpu-node-5" in page and "gpu-node-2" not in page
    assert "(dry-run)" in client.get("/remediations", params={"profile": "serve", "status": "open"}).text


@pytest.mark.parametrize("command", [["worker"], ["api"], ["watch", "slurm"]], ids=["worker", "api", "watcher"])
def test_every_process_refuses_a_malformed_selector_at_start_up(command: list[str]) -> None:
    """The real entry points, as an operator starts them: nothing runs, and the error names the field."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["REMEDIATION_PROFILES"] = json.dumps([{"name": "nvl72", "select": {"hostlist": "gb-[9-1]"}}])
    proc = subprocess.run([sys.executable, "-c", "from remediation.cli.main import main; main()", *command],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "profiles.0.select.hostlist" in proc.stderr and "malformed hostlist 'gb-[9-1]'" in proc.stderr
