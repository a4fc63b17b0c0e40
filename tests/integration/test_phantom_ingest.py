"""No phantom faults at the ingest, on real Postgres: the service's own reboot never makes a node a repeat
offender, and a stale edge superseded by a newer healthy observation acts on nothing.

The remediation runs for real (the workflow engine over the in-memory world, an injected clock), then
the events of the issue's table arrive: the Kubernetes watcher's held ``Ready=Unknown`` of our own
reboot, flushed after the remediation closed together with the ``Ready=True`` that ended it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.factory import make_adapters
from remediation.adapters.memory import MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import Event, Node, Remediation, RemediationStep
from remediation.db.queries import recent_failure_counts
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import ingest
from remediation.services.readmodels import node_detail
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.faults import show_fault

NODE = "gpu-node-8"
T0 = datetime(2026, 11, 23, 6, 20, 43, tzinfo=UTC)
SETTINGS = Settings(slurm={"backend": "memory"}, kube={"backend": "memory"}, machine={"backend": "memory"},
                    policy={"min_restart_gap_s": 0, "repeat_offender_count": 2, "settle_s": 600})


def ev(source: Source, kind: EventKind, state: str, at: datetime, reason: str = "",
       since: datetime | None = None, key: str = "") -> str:
    return NodeEvent(source=source, node=NODE, kind=kind, state=state, reason=reason, observed_at=at,
                     since=since, dedupe_key=key).to_json()


def remediate(sessions: sessionmaker[Session], clock: FakeClock, payload: str) -> int:
    """Ingest the trigger and run its remediation to the end; returns its id."""
    world = MemoryWorld(nodes=[NODE])
    trigger = json.loads(payload)
    show_fault(world, NODE, trigger["state"], trigger["reason"])  # Slurm shows the fault the trigger reports
    engine = Workflow(sessions, make_adapters(SETTINGS, world), SETTINGS, clock=clock)
    with sessions() as s, s.begin():
        (rid, step), = ingest(s, [payload], SETTINGS.policy, clock=clock).opened
    todo = [FollowUp(rid, step)]
    while todo:
        f = todo.pop()
        clock.advance(max(f.countdown, 0.1))
        todo += [n] if (n := engine.run(f.remediation_id, f.step)) else []
    with sessions() as s:
        rem = s.get(Remediation, rid)
        assert rem is not None and rem.status == "succeeded", rem and (rem.status, rem.outcome)
    return rid


def decisions(sessions: sessionmaker[Session]) -> list[tuple[str, str, str, str, int | None]]:
    with sessions() as s:
        return [(e.source, e.state, e.decision, e.decision_reason, e.remediation_id) for e in
                s.scalars(select(Event).where(Event.node == NODE).order_by(Event.id))]


def remediations(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Remediation)) or 0)


def test_the_reboots_own_ready_unknown_flushed_after_close_is_attributed(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(T0)
    rid = remediate(sessions, clock, ev(Source.SLURM, EventKind.UNHEALTHY, "FAIL", T0, "xid 79: GPU fell off"))
    with sessions() as s:  # the reboot's Ready=Unknown began just after our VM action started
        started = s.scalar(select(RemediationStep.started_at).where(RemediationStep.step == "vm_restart"))
        assert started is not None
        vm_started = started + timedelta(seconds=0.2)
    flushed = clock.advance(0.4)  # "within a second after their one remediation closed"
    with sessions() as s, s.begin():
        result = ingest(s, [
            ev(Source.KUBERNETES, EventKind.UNHEALTHY, "Ready=Unknown", flushed,
               "Node gke-a3-pool-8: NodeStatusUnknown: Kubelet stopped posting node status.", since=vm_started),
            ev(Source.KUBERNETES, EventKind.HEALTHY, "Ready=True", flushed, "Node gke-a3-pool-8: KubeletReady"),
        ], SETTINGS.policy, clock=clock)
    assert result.opened == []
    *_, unknown, ready = decisions(sessions)
    assert unknown[1:] == ("Ready=Unknown", "attributed", f"caused by remediation #{rid}: vm_restart", rid)
    assert ready[1:3] == ("Ready=True", "record")
    assert remediations(sessions) == 1
    with sessions() as s:
        assert recent_failure_counts(s, [NODE], clock.now(), window=timedelta(days=7)) == {NODE: 1}
        node = s.get(Node, ("default", NODE))
        assert node is not None and node.status == "healthy"


def test_a_stale_edge_is_superseded_by_a_newer_healthy_observation(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(T0)
    # Same batch: the edge and the observation that ended it.
    with sessions() as s, s.begin():
        result = ingest(s, [
            ev(Source.KUBERNETES, EventKind.UNHEALTHY, "Ready=False", T0, "PLEG", since=T0 - timedelta(seconds=300)),
            ev(Source.KUBERNETES, EventKind.HEALTHY, "Ready=True", T0 + timedelta(seconds=1)),
        ], SETTINGS.policy, clock=clock)
    assert result.opened == [] and result.decisions.get("superseded") == 1
    # Across batches: the healthy observation is recorded; the edge it ended is delivered late.
    clock.advance(60)
    with sessions() as s, s.begin():
        ingest(s, [ev(Source.SLURM, EventKind.HEALTHY, "IDLE", T0 + timedelta(seconds=50), key="h")],
               SETTINGS.policy, clock=clock)
    with sessions() as s, s.begin():
        late = ingest(s, [ev(Source.SLURM, EventKind.UNHEALTHY, "FAIL", T0 + timedelta(seconds=40), "xid")],
                      SETTINGS.policy, clock=clock)
    assert late.opened == []
    assert [d[2] for d in decisions(sessions) if d[0] == "slurm"] == ["record", "superseded"]
    assert remediations(sessions) == 0
    # A newer bad edge of the same condition is not superseded by the older healthy one: it acts.
    with sessions() as s, s.begin():
        fresh = ingest(s, [ev(Source.SLURM, EventKind.UNHEALTHY, "FAIL", T0 + timedelta(seconds=55), "xid 48")],
                       SETTINGS.policy, clock=clock)
    assert len(fresh.opened) == 1


def test_a_different_fault_in_the_settle_window_still_counts(sessions: sessionmaker[Session]) -> None:
    clock = FakeClock(T0)
    remediate(sessions, clock, ev(Source.SLURM, EventKind.UNHEALTHY, "FAIL", T0, "xid 79"))
    later = clock.advance(30)
    with sessions() as s, s.begin():
        result = ingest(s, [
            ev(Source.KUBERNETES, EventKind.UNHEALTHY, "GpuXidError=True", later, "XID 48",
               since=later - timedelta(seconds=5)),
        ], SETTINGS.policy, clock=clock)
    assert [step for _, step in result.opened] == ["quarantine"]  # the 2nd episode, limit 2
    assert decisions(sessions)[-1][2:4] == ("quarantine", "repeat offender: 2 failures within 7d (limit 2)")


def test_nodes_show_lists_the_episodes_with_their_evidence(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fault, its restart and the reboot's own signals: one episode, counted once, the phantom
    among its evidence; then a different fault is a second episode."""
    engine = create_engine(pg_url, poolclass=NullPool)
    sessions = sessionmaker(engine, expire_on_commit=False)
    clock = FakeClock(T0)
    rid = remediate(sessions, clock, ev(Source.SLURM, EventKind.UNHEALTHY, "FAIL", T0, "xid 79"))
    with sessions() as s:
        started = s.scalar(select(RemediationStep.started_at).where(RemediationStep.step == "vm_restart"))
    flushed = clock.advance(0.4)
    with sessions() as s, s.begin():
        ingest(s, [ev(Source.KUBERNETES, EventKind.UNHEALTHY, "Ready=Unknown", flushed, "NodeStatusUnknown",
                      since=started + timedelta(seconds=0.2)),
                   ev(Source.SLURM, EventKind.UNHEALTHY, "NOT_RESPONDING",
                      flushed)], SETTINGS.policy, clock=clock)
    clock.advance(900)  # past the settle period: a new GPU fault is a second episode
    with sessions() as s, s.begin():
        (second, _), = ingest(s, [ev(Source.KUBERNETES, EventKind.UNHEALTHY, "GpuXidError=True", clock.now(),
                                     "XID 48", since=clock.now())], SETTINGS.policy, clock=clock).opened
    with sessions() as s:
        detail = node_detail(s, NODE, policy=SETTINGS.policy, now=clock.now())
    newest, first = detail.episodes
    assert (newest.remediation_id, newest.state, newest.counted, newest.signals) == (second, "open", True, 1)
    assert (first.remediation_id, first.state, first.outcome, first.counted) == (rid, "over", "succeeded", True)
    assert first.attributed == 2 and first.signals >= 3 and first.recovered_at is not None
    assert first.started_at == T0 and first.settles_at is not None
    with sessions() as s:
        phantoms = set(s.scalars(select(Event.id).where(Event.decision == "attributed")))
    assert phantoms and phantoms <= set(first.evidence)

    from typer.testing import CliRunner

    from remediation.cli.oncall import app

    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    env = {"REMEDIATION_DATABASE__URL": pg_url, "COLUMNS": "250", "REMEDIATION_POLICY__SETTLE_S": "600"}
    res = CliRunner().invoke(app, ["nodes", "show", NODE], env=env)
    assert res.exit_code == 0, res.output
    assert "Fault episodes" in res.stdout and f"#{rid}" in res.stdout and f"#{second}" in res.stdout
    data = CliRunner().invoke(app, ["nodes", "show", NODE, "-o", "json"], env=env).stdout
    shown = json.loads(data)["episodes"]
    assert [(e["remediation_id"], e["attributed"]) for e in shown] == [(second, 0), (rid, 2)]
    engine.dispose()
