"""One on-call view of two clusters in one database, on real Postgres: the CLI (direct database mode
and API mode), the JSON API and the dashboard.

Both clusters have a ``gpu-node-0`` (tests/integration/two_clusters.py): a read shows both, never merged;
a lever on that name without a cluster is refused and does nothing; with one, it acts and audits there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.api import create_app
from remediation.cli.context import CliError
from remediation.cli.oncall import app as cli_app
from remediation.cli.remote import Remote
from remediation.db.models import AuditLog, Node
from remediation.db.queries import BREAKER, control_set
from remediation.db.scope import scoped
from remediation.domain.statemachine import NodeStatus
from remediation.ports.dispatch import SweeperOnly
from remediation.settings import Settings
from tests.integration.history import sessions  # noqa: F401  (a fixture)
from tests.integration.two_clusters import EAST, SHARED, WEST, Seeded, seed

ADMIN, READ = "admin-token-0123456789", "read-token-0123456789"
FLEET = [{"name": WEST}, {"name": EAST}]  # the site's configuration names both clusters


@pytest.fixture
def seeded(sessions: sessionmaker[Session]) -> Seeded:
    return seed(sessions)


@pytest.fixture
def run(pg_url: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        env = {"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall-tester", "COLUMNS": "250",
               "REMEDIATION_CLUSTERS": json.dumps(FLEET)}
        return runner.invoke(cli_app, list(args), env=env, obj=lambda settings: SweeperOnly())

    return invoke


@pytest.fixture
def client(pg_url: str, sessions: sessionmaker[Session]) -> Iterator[TestClient]:
    settings = Settings(database={"url": pg_url}, api={"admin_tokens": [ADMIN], "read_tokens": [READ]},
                        clusters=FLEET)
    with TestClient(create_app(settings, sessions, dispatcher=SweeperOnly())) as c:
        yield c


def audit(sessions: sessionmaker[Session], action: str) -> list[tuple[str, str]]:
    with sessions() as s:
        return sorted((a.cluster, a.target) for a in s.scalars(select(AuditLog).where(AuditLog.action == action)))


def status_of(sessions: sessionmaker[Session], cluster: str, node: str) -> str:
    with sessions() as s:
        found = s.get(Node, (cluster, node))
        assert found is not None
        return str(found.status)


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()[1:] if line.strip() and not line[:1].isspace()]


# ------------------------------------------------------------------------------ CLI, database mode


def test_cli_lists_every_cluster_with_a_cluster_column_and_filters_one(run, seeded) -> None:
    res = run("nodes", "list")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].split()[:3] == ["CLUSTER", "NAME", "STATUS"]
    assert sorted((r[0], r[1]) for r in rows(res.stdout)) == [
        (EAST, SHARED), (EAST, "gpu-node-2"), (WEST, SHARED), (WEST, "gpu-node-1")]
    by = {(r[0], r[1]): r for r in rows(res.stdout)}
    assert by[(WEST, SHARED)][2] == "remediating" and by[(WEST, SHARED)][4] == f"#{seeded.west_open}"
    assert by[(EAST, SHARED)][2] == "healthy" and by[(EAST, SHARED)][4] == "-"  # never merged with west's

    one = run("nodes", "list", "--cluster", EAST)
    assert one.exit_code == 0, one.output
    assert one.stdout.splitlines()[0].split()[:2] == ["NAME", "STATUS"]  # one cluster: no CLUSTER column
    assert sorted(r[0] for r in rows(one.stdout)) == [SHARED, "gpu-node-2"]

    listed = json.loads(run("remediations", "list", "-o", "json").stdout)
    assert [(r["cluster"], r["node"]) for r in listed] == [(WEST, SHARED)]
    events = json.loads(run("events", "tail", "--cluster", EAST, "-o", "json").stdout)
    assert events and {e["cluster"] for e in events} == {EAST}


def test_cli_refuses_an_ambiguous_node_and_resolves_a_unique_one(run, seeded, sessions) -> None:
    res = run("nodes", "show", SHARED)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "east, west" in res.stderr and "--cluster" in res.stderr

    refused = run("quarantine", SHARED, "-r", "bad GPU")
    assert refused.exit_code == 2 and "--cluster" in refused.stderr
    assert audit(sessions, "quarantine") == []  # nothing done

    shown = run("nodes", "show", SHARED, "--cluster", EAST, "-o", "json")
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.stdout)
    assert detail["node"]["cluster"] == EAST and detail["remediations"] == []  # west's remediation is not east's

    only = run("quarantine", "gpu-node-1", "-r", "bad GPU")  # in west only: found without --cluster
    assert only.exit_code == 0, only.output
    east = run("quarantine", SHARED, "--cluster", EAST, "-r", "bad GPU")
    assert east.exit_code == 0, east.output
    assert audit(sessions, "quarantine") == [(EAST, SHARED), (WEST, "gpu-node-1")]
    assert status_of(sessions, EAST, SHARED) == NodeStatus.REMEDIATING
    assert status_of(sessions, WEST, SHARED) == NodeStatus.REMEDIATING  # its own remediation, untouched

    wrong = run("release", "gpu-node-2", "--cluster", WEST, "-r", "fine")
    assert wrong.exit_code == 1 and "in cluster 'west'" in wrong.stderr


def test_cli_pause_acts_on_every_cluster_or_the_one_named(run, seeded, sessions) -> None:
    res = run("pause", "-r", "maintenance")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [f"cluster {EAST}: automation paused", f"cluster {WEST}: automation paused"]
    assert audit(sessions, "pause") == [(EAST, ""), (WEST, "")]

    res = run("resume", "--cluster", WEST, "-r", "west is done")
    assert res.exit_code == 0 and res.stdout.strip() == "automation resumed"
    assert audit(sessions, "resume") == [(WEST, "")]
    status = json.loads(run("status", "-o", "json").stdout)
    assert {c["name"]: c["paused"] for c in status["clusters"]} == {EAST: True, WEST: False}
    table = run("status")
    assert "CLUSTER" in table.stdout and "yes: maintenance" in table.stdout


def test_cli_cancel_audits_in_the_remediations_cluster(run, seeded, sessions) -> None:
    wrong = run("cancel", str(seeded.west_open), "--cluster", EAST, "-r", "not this one")
    assert wrong.exit_code == 1 and audit(sessions, "cancel") == []
    res = run("cancel", str(seeded.west_open), "-r", "false alarm")
    assert res.exit_code == 0, res.output
    assert audit(sessions, "cancel") == [(WEST, SHARED)]


# ------------------------------------------------------------------------------------ the JSON API


def api(client: TestClient, method: str, path: str, token: str = ADMIN, **kw: object):  # noqa: ANN201
    return client.request(method, f"/api/v1{path}", headers={"Authorization": f"Bearer {token}"}, **kw)


def test_api_rows_carry_their_cluster_and_lists_filter(client, seeded) -> None:
    nodes = api(client, "GET", "/nodes").json()
    assert sorted((n["cluster"], n["name"]) for n in nodes) == [
        (EAST, SHARED), (EAST, "gpu-node-2"), (WEST, SHARED), (WEST, "gpu-node-1")]
    east = api(client, "GET", "/nodes", params={"cluster": EAST}).json()
    assert {n["cluster"] for n in east} == {EAST} and len(east) == 2
    assert api(client, "GET", "/remediations", params={"cluster": EAST}).json() == []
    assert [r["cluster"] for r in api(client, "GET", "/remediations").json()] == [WEST]
    assert {e["cluster"] for e in api(client, "GET", "/events", params={"cluster": WEST}).json()} == {WEST}
    assert api(client, "GET", "/nodes", params={"cluster": "Not_A_Label"}).status_code == 422


def test_api_node_endpoints_need_the_cluster_only_when_ambiguous(client, seeded, sessions) -> None:
    res = api(client, "GET", f"/nodes/{SHARED}")
    assert res.status_code == 400 and "east, west" in res.json()["detail"]
    ok = api(client, "GET", f"/nodes/{SHARED}", params={"cluster": WEST}).json()
    assert ok["node"]["cluster"] == WEST and [r["id"] for r in ok["remediations"]] == [seeded.west_open]
    assert api(client, "GET", "/nodes/gpu-node-2").json()["node"]["cluster"] == EAST

    refused = api(client, "POST", f"/nodes/{SHARED}/report", json={"reason": "flaky"})
    assert refused.status_code == 400 and audit(sessions, "report") == []
    done = api(client, "POST", f"/nodes/{SHARED}/report", params={"cluster": EAST}, json={"reason": "flaky"})
    assert done.status_code == 200, done.text
    assert done.json()["cluster"] == EAST and audit(sessions, "report") == [(EAST, SHARED)]


def test_api_lists_every_cluster_with_its_state_and_pauses_each(client, seeded, sessions) -> None:
    with scoped(sessions, EAST)() as s, s.begin():
        control_set(s, BREAKER, {"open": True, "reason": "7 of 20 failed", "at": "2026-01-01T00:00:00+00:00"},
                    now=s.execute(select(Node.updated_at)).scalars().first())
    res = api(client, "POST", "/pause", json={"reason": "switch upgrade"}, params={"cluster": WEST})
    assert res.status_code == 200 and res.json()["clusters"] == [WEST]
    states = {c["name"]: c for c in api(client, "GET", "/clusters", READ).json()}
    assert set(states) == {EAST, WEST}
    assert states[WEST]["paused"] and states[WEST]["paused_detail"]["reason"] == "switch upgrade"
    assert not states[EAST]["paused"] and states[EAST]["breaker_open"]
    assert states[EAST]["breaker_detail"]["reason"] == "7 of 20 failed"
    assert (states[WEST]["nodes"], states[WEST]["unhealthy"], states[WEST]["open_remediations"]) == (2, 1, 1)
    assert (states[EAST]["nodes"], states[EAST]["unhealthy"], states[EAST]["open_remediations"]) == (2, 0, 0)
    overview = api(client, "GET", "/overview").json()
    assert {c["name"] for c in overview["clusters"]} == {EAST, WEST}
    assert audit(sessions, "pause") == [(WEST, "")]
    every = api(client, "POST", "/resume", json={"reason": "done"})
    assert every.status_code == 200 and every.json()["clusters"] == [EAST, WEST]
    assert audit(sessions, "resume") == [(EAST, ""), (WEST, "")]
    closed = api(client, "POST", "/breaker/close", json={"reason": "switch fixed"})
    assert closed.status_code == 200 and closed.json()["clusters"] == [EAST]
    assert audit(sessions, "breaker_closed") == [(EAST, "")]


# ----------------------------------------------------------------------------- the CLI in API mode


def test_cli_api_mode_sends_the_cluster_and_refuses_an_ambiguous_name(client, seeded, sessions) -> None:
    remote = Remote("http://testserver", ADMIN, client=client)
    assert sorted((n.cluster, n.name) for n in remote.nodes(None)) == [
        (EAST, SHARED), (EAST, "gpu-node-2"), (WEST, SHARED), (WEST, "gpu-node-1")]
    with pytest.raises(CliError) as refused:
        remote.quarantine(SHARED, "bad GPU")
    assert refused.value.code == 2 and "--cluster" in str(refused.value)
    remote.cluster = EAST
    assert [n.cluster for n in remote.nodes(None)] == [EAST, EAST]
    assert remote.node(SHARED).cluster == EAST
    assert "quarantined" in remote.quarantine(SHARED, "bad GPU")
    assert audit(sessions, "quarantine") == [(EAST, SHARED)]


# ---------------------------------------------------------------------------------- the dashboard


def login(client: TestClient) -> None:
    res = client.post("/login", data={"token": ADMIN, "name": "dana", "next": "/"}, follow_redirects=False)
    assert res.status_code == 303


def test_dashboard_shows_every_cluster_and_filters_by_one(client, seeded, sessions) -> None:
    login(client)
    home = client.get("/").text
    assert "<h2>Clusters" in home
    assert f'href="/?cluster={EAST}"' in home and f'href="/?cluster={WEST}"' in home
    nodes = client.get("/nodes").text
    assert f'href="/nodes/{SHARED}?cluster={EAST}"' in nodes and f'href="/nodes/{SHARED}?cluster={WEST}"' in nodes
    east = client.get("/nodes", params={"cluster": EAST}).text
    assert f"?cluster={EAST}" in east and f'href="/nodes/{SHARED}?cluster={WEST}"' not in east
    assert "gpu-node-2" in east and "gpu-node-1" not in east
    assert client.get(f"/nodes/{SHARED}").status_code == 400  # which one? the page says to pick
    page = client.get(f"/nodes/{SHARED}", params={"cluster": WEST}).text
    assert f"/remediations/{seeded.west_open}" in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', home)
    assert csrf is not None
    res = client.post("/pause", data={"csrf": csrf.group(1), "reason": "east maintenance", "cluster": EAST},
                      follow_redirects=False)
    assert res.status_code == 303 and "msg=" in res.headers["location"]
    assert audit(sessions, "pause") == [(EAST, "")]


def test_cli_breaker_names_the_latched_cluster_and_closes_it_alone(run, seeded, sessions) -> None:
    with scoped(sessions, EAST)() as s, s.begin():
        now = s.execute(select(Node.updated_at)).scalars().first()
        control_set(s, BREAKER, {"open": True, "reason": "7 of 20 failed", "at": "2026-01-01T00:00:00+00:00"},
                    now=now)
    res = run("breaker", "status")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"storm breaker (cluster {EAST}) OPEN") and f"--cluster {EAST}" in res.stdout
    assert run("breaker", "status", "--cluster", WEST).stdout.startswith("storm breaker closed")
    closed = run("breaker", "close", "-r", "switch fixed")
    assert closed.exit_code == 0, closed.output
    assert closed.stdout.startswith(f"cluster {EAST}: storm breaker closed")
    assert audit(sessions, "breaker_closed") == [(EAST, "")]
    again = run("breaker", "close", "-r", "switch fixed")
    assert again.exit_code == 1 and "not open in any cluster" in again.stderr
