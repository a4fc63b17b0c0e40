"""Correlated incidents through the real ingest and workflow engine on Postgres, and on-call's view
of them: ``remediation incidents list|show|resolve``, the JSON API and /metrics.

The story (a fake clock; the in-memory cluster): four nodes share NVLink clique ``c1`` (learnt from a
DOMAINS event, as the Kubernetes watcher publishes it from ``nvidia.com/gpu.clique``), two more share
``c2``. gpu-node-0 fails first and opens a normal remediation, which drains and cordons, then waits
out ``incidents.vm_grace_s`` before its VM action. gpu-node-1 fails 10 s later: half of c1 failing
within the window is an incident, and gpu-node-0's remediation is folded into it before any VM action.
gpu-node-2 failing next joins it (no second page). A node of c2 failing alone opens nothing more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.api import create_app
from remediation.cli.oncall import app as cli
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Incident, Node, Remediation
from remediation.db.queries import recent_failure_counts
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.states import AuditAction
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import IngestRules, ingest
from remediation.services.workflow import Workflow
from remediation.settings import DatabaseSettings, Settings
from tests.integration.history import RecordingDispatcher, drive, engine_settings

INCIDENT_ACTIONS = (AuditAction.INCIDENT_OPENED, AuditAction.INCIDENT_JOINED, AuditAction.INCIDENT_RECOVERED,
                    AuditAction.INCIDENT_RESOLVED)

CLIQUE = "nvidia.com/gpu.clique"
NODES = [f"gpu-node-{i}" for i in range(6)]
ADMIN, READ = "admin-token-0123456789", "read-token-0123456789"


class Story:
    def __init__(self, sessions: sessionmaker[Session], settings: Settings, dry_run: bool = False) -> None:
        self.sessions, self.settings, self.dry_run = sessions, settings, dry_run
        self.clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
        self.world = MemoryWorld(nodes=NODES)
        self.engine = Workflow(sessions, Adapters(MemorySlurm(self.world), MemoryKube(self.world),
                                                  MemoryVM(self.world)), settings, clock=self.clock)
        events = [NodeEvent(source=Source.KUBERNETES, node=n, kind=EventKind.DOMAINS, state="labels",
                            domains={CLIQUE: "c1" if i < 4 else "c2"}, observed_at=self.clock.now())
                  for i, n in enumerate(NODES)]
        self.publish(*events)

    def publish(self, *events: NodeEvent) -> list[FollowUp]:
        with self.sessions() as s, s.begin():
            result = ingest(s, [e.to_json() for e in events], self.settings.policy, clock=self.clock,
                            rules=IngestRules(dry_run=self.dry_run, incidents=self.settings.incidents))
        return [FollowUp(rid, step) for rid, step in result.opened]

    def fail(self, node: str) -> FollowUp:
        self.world.set_slurm(node, state="IDLE", flags={"FAIL"}, reason="xid 79")
        (f,) = self.publish(NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="FAIL",
                                      reason="xid 79", observed_at=self.clock.now()))
        return f

    def run_to(self, f: FollowUp, step: str, limit: int = 50) -> FollowUp:
        """Run until the remediation waits at ``step`` (held there) or stops."""
        for _ in range(limit):
            self.clock.advance(f.countdown or 0.5)
            nxt = self.engine.run(f.remediation_id, f.step)
            assert nxt is not None, f"remediation {f.remediation_id} stopped before {step}"
            if nxt.step == step and self.rem(f.remediation_id).status == "waiting":
                return nxt
            f = nxt
        raise AssertionError(f"never waited at {step}")

    def rem(self, rid: int) -> Remediation:
        with self.sessions() as s:
            found = s.get(Remediation, rid)
            assert found is not None
            return found


def story_settings(pg_url: str | None = None, **extra: object) -> Settings:
    base = engine_settings(**({"database": {"url": pg_url}} if pg_url else {}))
    return base.model_copy(update={"incidents": base.incidents.model_copy(update={
        "min_nodes": 4, "min_fraction": 0.5, "window_s": 60, "vm_grace_s": 60, **extra})})


def vm_ops(world: MemoryWorld) -> int:
    with world.mutate() as st:
        return len(st["ops"])


def test_late_failure_folds_the_first_into_one_incident_before_any_vm_action(sessions) -> None:
    story = Story(sessions, story_settings())
    first = story.fail("gpu-node-0")
    held = story.run_to(first, "vm_restart")
    assert "incidents.vm_grace_s" in (story.rem(first.remediation_id).wait_reason or "")

    story.clock.advance(10)
    second = story.fail("gpu-node-1")
    with sessions() as s:
        (inc,) = s.scalars(select(Incident)).all()
        assert (inc.kind, inc.name, inc.nodes, inc.domain_size, inc.cause) == (
            CLIQUE, "c1", ["gpu-node-0", "gpu-node-1"], 4, "NVLink domain")
    # The first remediation, past its grace now, is held by the incident: still no VM action.
    story.clock.advance(120)
    again = story.engine.run(held.remediation_id, held.step)
    assert again is not None and again.step == "vm_restart"
    assert "held by incident #" in (story.rem(first.remediation_id).wait_reason or "")
    story.run_to(second, "k8s_evict")
    assert vm_ops(story.world) == 0

    third = story.fail("gpu-node-2")
    assert story.rem(third.remediation_id).incident_id == inc.id
    story.fail("gpu-node-4")  # c2: one node alone
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Incident)) == 1
        actions = [a for (a,) in s.execute(select(AuditLog.action).where(AuditLog.action.in_(INCIDENT_ACTIONS))
                                           .order_by(AuditLog.id))]
        assert actions == ["incident_opened", "incident_joined"]  # one page
        assert s.get(Incident, inc.id).nodes == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]  # type: ignore[union-attr]
        counted = recent_failure_counts(s, NODES, story.clock.now(),
                                        window=story.settings.policy.repeat_offender_window)
        assert counted == {"gpu-node-4": 1}


def test_a_quarantine_decided_on_a_failure_the_incident_explains_is_taken_back(sessions) -> None:
    """A policy that quarantines on the first failure (repeat_offender_count 1) stands in for a node with
    its N-1 failures behind it: gpu-node-0's failure is the first of its NVLink domain's. The quarantine
    waits out the grace, and the incident that forms takes it back."""
    settings = story_settings()
    story = Story(sessions, settings.model_copy(update={
        "policy": settings.policy.model_copy(update={"repeat_offender_count": 1})}))
    third = story.fail("gpu-node-0")
    assert third.step == "quarantine"
    held = story.engine.run(third.remediation_id, third.step)
    assert held is not None and held.step == "quarantine"
    assert "before quarantining" in (story.rem(third.remediation_id).wait_reason or "")
    story.clock.advance(5)
    story.fail("gpu-node-1")
    rem = story.rem(third.remediation_id)
    assert rem.incident_id is not None and rem.step == "slurm_drain" and rem.status in ("running", "waiting")
    assert "quarantine_reason" not in rem.context and rem.context["quarantine_taken_back"]
    with sessions() as s:
        assert s.get(Node, ("default", "gpu-node-0")).status != "quarantined"  # type: ignore[union-attr]
        taken = s.scalars(select(AuditLog.reason).where(AuditLog.action == "quarantine_taken_back")).all()
        # Both nodes' quarantines were decided on failures the incident explains.
        assert len(taken) == 2 and all("incident #" in t for t in taken)


def test_incident_closes_when_its_nodes_answer_again_and_gives_them_back(sessions) -> None:
    story = Story(sessions, story_settings())
    opened = []
    for node in ("gpu-node-0", "gpu-node-1"):  # the switch dies: both stop answering
        story.world.set_slurm(node, state="DOWN", flags=["NOT_RESPONDING"], reason="Not responding")
        opened += story.publish(NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="DOWN",
                                          reason="Not responding", observed_at=story.clock.now()))
    members = [story.run_to(f, "k8s_evict") for f in opened]
    # Still unreachable: the sweeper's check leaves the incident open.
    assert story.engine.sweep() == []
    with sessions() as s:
        (inc,) = s.scalars(select(Incident)).all()
        assert inc.status == "open"
    for node in ("gpu-node-0", "gpu-node-1"):  # the switch is back: DOWN with our drain, answering
        story.world.set_slurm(node, flags=["DRAIN"])
    released = story.engine.sweep()
    assert sorted(f.remediation_id for f in released) == sorted(f.remediation_id for f in members)
    drive(story.engine, story.clock, released)
    with sessions() as s:
        inc = s.get(Incident, inc.id)
        assert (inc.status, inc.closed_by) == ("recovered", "remediation")  # type: ignore[union-attr]
        for f in members:
            rem = s.get(Remediation, f.remediation_id)
            assert rem.status == "cancelled" and "incident" in (rem.outcome or ""), rem.outcome  # type: ignore[union-attr]
    for node in ("gpu-node-0", "gpu-node-1"):  # given back: our drain lifted, no VM action taken
        assert "DRAIN" not in story.engine.adapters.slurm.get_node(node).flags
    assert vm_ops(story.world) == 0


def test_dry_run_incidents_are_marked_and_read_would(sessions) -> None:
    story = Story(sessions, story_settings(), dry_run=True)
    story.fail("gpu-node-0")
    story.fail("gpu-node-1")
    with sessions() as s:
        (inc,) = s.scalars(select(Incident)).all()
        (page,) = s.scalars(select(AuditLog).where(AuditLog.action == "incident_opened")).all()
    assert inc.dry_run and page.dry_run and page.reason.startswith("would (dry-run):")


def test_incidents_off_means_every_node_on_its_own(sessions) -> None:
    story = Story(sessions, story_settings(enabled=False))
    story.fail("gpu-node-0")
    story.fail("gpu-node-1")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Incident)) == 0


# ------------------------------------------------------------------------------ on-call: CLI and API


@pytest.fixture
def committed(pg_url: str) -> Iterator[tuple[str, sessionmaker[Session], Story]]:
    engine = make_engine(DatabaseSettings(url=pg_url))
    sessions = make_session_factory(engine)
    story = Story(sessions, story_settings(pg_url))
    members = [story.fail("gpu-node-0"), story.fail("gpu-node-1")]
    for f in members:
        story.run_to(f, "k8s_evict")
    yield pg_url, sessions, story
    engine.dispose()


def test_cli_lists_shows_and_resolves(committed, monkeypatch: pytest.MonkeyPatch) -> None:
    url, sessions, story = committed
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    dispatch = RecordingDispatcher()
    runner = CliRunner()

    def run(*args: str):  # noqa: ANN202
        env = {"REMEDIATION_DATABASE__URL": url, "USER": "oncall-tester", "COLUMNS": "250"}
        return runner.invoke(cli, list(args), env=env, obj=lambda settings: dispatch)

    res = run("incidents", "list")
    assert res.exit_code == 0, res.output
    header, row = res.stdout.splitlines()[:2]
    assert header.split()[:3] == ["ID", "STATUS", "DOMAIN"]
    assert row.split()[1:3] == ["open", f"{CLIQUE}=c1"] and "2/4: gpu-node-[0-1]" in row
    (listed,) = json.loads(run("incidents", "list", "-o", "json").stdout)
    res = run("incidents", "show", str(listed["id"]))
    assert res.exit_code == 0 and "NVLink domain" in res.stdout and "held by incident" in res.stdout, res.output
    detail = json.loads(run("incidents", "show", str(listed["id"]), "-o", "json").stdout)
    assert [m["node"] for m in detail["remediations"]] == ["gpu-node-0", "gpu-node-1"]

    res = run("incidents", "resolve", str(listed["id"]), "-r", "NVSwitch tray replaced")
    assert res.exit_code == 0 and "2 member remediation(s)" in res.stdout, res.output
    assert sorted(f.remediation_id for f in dispatch.steps_called) == [m["id"] for m in detail["remediations"]]
    res = run("incidents", "list", "--status", "open")
    assert (res.exit_code, res.stdout, res.stderr) == (0, "", "No incidents found.\n")
    res = run("incidents", "resolve", str(listed["id"]), "-r", "again")
    assert res.exit_code == 1 and "already resolved" in res.stderr
    assert run("incidents", "show", "999").exit_code == 1
    assert run("incidents", "list", "--status", "bogus").exit_code == 1
    with sessions() as s:
        (audit_row,) = s.scalars(select(AuditLog).where(AuditLog.action == "incident_resolved")).all()
    assert (audit_row.actor, audit_row.reason.endswith("NVSwitch tray replaced")) == ("oncall-tester", True)

    # Released, each member re-checks: FAIL "xid 79" is still there, so it is remediated on its own.
    drive(story.engine, story.clock, list(dispatch.steps_called))
    assert vm_ops(story.world) == 2


def test_api_reads_resolves_and_counts_incidents(committed) -> None:
    url, sessions, _ = committed
    settings = Settings(database={"url": url}, api={"admin_tokens": [ADMIN], "read_tokens": [READ]})
    dispatch = RecordingDispatcher()
    with TestClient(create_app(settings, sessions, dispatcher=dispatch)) as c:
        reader = {"Authorization": f"Bearer {READ}"}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert c.get("/api/v1/incidents").status_code == 401
        (row,) = c.get("/api/v1/incidents?status=open", headers=reader).json()
        assert (row["domain"], row["node_count"], row["cause"]) == (f"{CLIQUE}=c1", 2, "NVLink domain")
        detail = c.get(f"/api/v1/incidents/{row['id']}", headers=reader).json()
        assert len(detail["remediations"]) == 2
        assert c.get("/api/v1/incidents/999", headers=reader).status_code == 404
        assert c.get("/api/v1/incidents?status=bogus", headers=reader).status_code == 422
        metrics = c.get("/metrics").text
        assert 'remediation_incidents_open{cluster="default"} 1.0' in metrics
        assert 'remediation_incidents_total{cluster="default"} 1.0' in metrics
        path = f"/api/v1/incidents/{row['id']}/resolve"
        assert c.post(path, json={"reason": "fixed"}, headers=reader).status_code == 403
        res = c.post(path, json={"reason": "fixed", "actor": "alice"}, headers=admin)
        assert res.status_code == 200 and sorted(res.json()["released"]) == sorted(
            m["id"] for m in detail["remediations"])
        assert c.post(path, json={"reason": "again"}, headers=admin).status_code == 409
        assert 'remediation_incidents_open{cluster="default"} 0.0' in c.get("/metrics").text


def test_dashboard_lists_incidents_and_resolves_with_admin_and_csrf(committed) -> None:
    url, sessions, _ = committed
    settings = Settings(database={"url": url}, api={"admin_tokens": [ADMIN], "read_tokens": [READ]})
    with TestClient(create_app(settings, sessions, dispatcher=RecordingDispatcher())) as c:
        assert c.get("/incidents", follow_redirects=False).headers["location"] == "/login?next=%2Fincidents"
        c.post("/login", data={"token": READ, "name": "dana", "next": "/incidents"})
        page = c.get("/incidents").text
        assert "NVLink domain" in page and "gpu-node-1" in page and "Resolve</button>" not in page
        c.post("/logout")
        c.post("/login", data={"token": ADMIN, "name": "dana", "next": "/incidents"})
        page = c.get("/incidents").text
        incident = re.search(r'action="/incidents/(\d+)/resolve"', page).group(1)  # type: ignore[union-attr]
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        path = f"/incidents/{incident}/resolve"
        assert c.post(path, data={"reason": "x", "csrf": "0" * 32}).status_code == 403
        res = c.post(path, data={"reason": "tray swapped", "csrf": csrf}, follow_redirects=False)
        assert res.status_code == 303 and "msg=incident%20%23" in res.headers["location"]
        again = c.post(path, data={"reason": "x", "csrf": csrf}, follow_redirects=False)
        assert "already%20resolved" in again.headers["location"]
    with sessions() as s:
        row = s.scalars(select(AuditLog).where(AuditLog.action == "incident_resolved")).one()
        assert row.actor.startswith("dana") and row.reason.endswith("tray swapped")
