"""/metrics after a scripted scenario: every series the on-call issue lists, with its exact value.

The scenario runs the production path (watcher events through ``ingest``, the workflow ``Workflow``
against the in-memory world, the levers) on a fake clock, so every number below is known in advance:

- 8 nodes in the inventory (8 slurm/inventory events) and one malformed payload;
- gpu-1 (slurm FAIL) and gpu-3 (slurm DRAIN, two jobs that leave after 250 s) are remediated;
  gpu-3 later reports healthy (one slurm/healthy event);
- gpu-2 (kubernetes Ready=False) has a VM that never comes back: restart, verify times out,
  reimage, verify times out, quarantined;
- gpu-4 is reported by hand (one manual/unhealthy event) and the remediation is cancelled;
- gpu-0 is quarantined by hand;
- then gpu-5, gpu-6 and gpu-7 fail within a minute: 3 of 8 nodes is over the 25 % limit, so the
  engine opens the storm breaker and all three wait in front of k8s_evict.

Step durations come from the clock: the memory VM finishes an operation on its third poll (30 s at a
10 s poll interval) and verify gives up after 60 s (first check past it: 70 s).

The scenario runs against Postgres and against SQLite (the embedded default), which computes step
durations with a different SQL expression.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld, OpTiming
from remediation.api import create_app
from remediation.clock import FakeClock
from remediation.db.migrate import upgrade
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.statemachine import Step
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.ingest import ingest
from remediation.services.metrics import STEP_BUCKETS, make_registry
from remediation.services.workflow import Workflow
from remediation.settings import DatabaseSettings, Settings
from tests.integration.history import drive  # the same settle loop as the shared history

NODES = [f"gpu-{i}" for i in range(8)]
START = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)
QUEUES = {"ingest": 0, "workflow": 12}
SCRAPE_DELAY_S = 300  # the scrape happens this long after the last step ran


@dataclass
class Scenario:
    sessions: sessionmaker[Session]
    clock: FakeClock
    engine: Workflow
    lag_s: float  # how overdue the most overdue open remediation is at scrape time
    storm_at: datetime  # when the three storm remediations opened (the open ones at scrape time)


@pytest.fixture(params=["postgres", "sqlite"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'metrics.db'}"
        upgrade(url)
    engine = make_engine(DatabaseSettings(url=url))
    yield make_session_factory(engine)
    engine.dispose()


def _show_fault(world: MemoryWorld, node: str, source: Source, state: str, reason: str) -> None:
    """The world shows the fault a watcher reports, as it did when the watcher saw it: a Kubernetes
    condition on the Node, or a researcher's ``scontrol update state=fail`` (or drain) in Slurm."""
    if source == Source.KUBERNETES:
        condition, status = state.split("=", 1)
        assert condition == "Ready", condition
        world.set_k8s(node, ready=status)
    else:
        world.set_slurm(node, flags=[state], reason=reason, user="researcher")


def _publish(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock, world: MemoryWorld,
             node: str, source: Source, kind: EventKind, state: str, reason: str = "") -> list[FollowUp]:
    if kind == EventKind.UNHEALTHY:
        _show_fault(world, node, source, state, reason)
    event = NodeEvent(source=source, node=node, kind=kind, state=state, reason=reason, observed_at=clock.now())
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock)
    return [FollowUp(rid, step) for rid, step in result.opened]


@pytest.fixture
def scenario(sessions: sessionmaker[Session]) -> Scenario:
    settings = Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, "breaker_max_fraction": 0.25,
                "breaker_window_s": 600},
        workflow={"poll_interval_s": 10, "verify_timeout_s": 60, "lease_s": 30},
    )
    clock = FakeClock(START)
    world = MemoryWorld(nodes=NODES, timing=OpTiming(polls=3))
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                      clock=clock)
    slurm, kube = Source.SLURM, Source.KUBERNETES

    for node in NODES:
        _publish(sessions, settings, clock, world, node, slurm, EventKind.INVENTORY, "IDLE")
    with sessions() as s, s.begin():
        ingest(s, [b"{not json"], settings.policy, clock=clock)

    drive(engine, clock, _publish(sessions, settings, clock, world, "gpu-1", slurm, EventKind.UNHEALTHY, "FAIL", "xid 79"))

    clock.advance(3600)
    with world.mutate() as st:
        st["nodes"]["gpu-2"]["vm"]["broken"] = True
    drive(engine, clock, _publish(sessions, settings, clock, world, "gpu-2", kube, EventKind.UNHEALTHY, "Ready=False"))

    clock.advance(3600)
    world.set_jobs("gpu-3", 2)
    (drain,) = _publish(sessions, settings, clock, world, "gpu-3", slurm, EventKind.UNHEALTHY, "DRAIN", "ecc errors")
    waiting = engine.run(drain.remediation_id, drain.step)
    assert waiting is not None and waiting.step == "slurm_drain"
    clock.advance(250)  # the two jobs finish 250 s after the drain started
    world.set_jobs("gpu-3", 0)
    drive(engine, clock, [engine.run(drain.remediation_id, drain.step)])  # type: ignore[list-item]
    clock.advance(60)
    _publish(sessions, settings, clock, world, "gpu-3", slurm, EventKind.HEALTHY, "IDLE")

    clock.advance(3600)
    with sessions() as s, s.begin():
        (report,) = lever_rules.report(s, lever_rules.HumanReport("gpu-4", "dana", "NCCL hangs"),
                                       now=clock.now(), policy=settings.policy)
    clock.advance(120)
    with sessions() as s, s.begin():
        lever_rules.cancel(s, report.remediation_id, "dana", reason="false alarm", now=clock.now())
    clock.advance(60)
    with sessions() as s, s.begin():
        manual = lever_rules.quarantine(s, "gpu-0", "dana", reason="fan failure", now=clock.now())
    drive(engine, clock, [manual])

    clock.advance(3600)  # the storm: three nodes within a minute, past the breaker's limit
    storm_at = clock.now()
    storm = [f for node in ("gpu-5", "gpu-6", "gpu-7")
             for f in _publish(sessions, settings, clock, world, node, slurm, EventKind.UNHEALTHY, "FAIL", "xid 48")]
    first_gated: datetime | None = None
    for f in storm:
        while f.step != "k8s_evict" or f.countdown == 0:
            clock.advance(1)
            nxt = engine.run(f.remediation_id, f.step)
            assert nxt is not None
            f = nxt
        first_gated = first_gated or clock.now()
    assert first_gated is not None
    due = first_gated + timedelta(seconds=10)  # gated steps are checked again after one poll interval
    clock.advance(SCRAPE_DELAY_S)
    return Scenario(sessions, clock, engine, lag_s=(clock.now() - due).total_seconds(), storm_at=storm_at)


def _scrape(scenario: Scenario) -> dict[str, float]:
    settings = Settings(database={"url": "sqlite://"}, api={"admin_tokens": ["admin-token-0123456789"]})
    app = create_app(settings, scenario.sessions, queue_depth=lambda: dict(QUEUES), clock=scenario.clock)
    with TestClient(app) as client:
        res = client.get("/metrics")
    assert res.status_code == 200
    samples: dict[str, float] = {}
    for line in res.text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[_one_cluster(key)] = float(value)
    return samples


NOT_FROM_THE_DATABASE = ("remediation_queue_depth", "remediation_database_up")


def _one_cluster(key: str) -> str:
    """``key`` without its ``cluster="default"`` label, which every series read from the database carries
    (the scenario has the one cluster); the series below are then compared as they were before clusters."""
    if key.startswith(NOT_FROM_THE_DATABASE):
        assert "cluster=" not in key, key
        return key
    assert 'cluster="default"' in key, key
    return key.replace('{cluster="default"}', "").replace('cluster="default",', "").replace(',cluster="default"', "")


def _series(samples: dict[str, float], name: str) -> dict[str, float]:
    """``{labels: value}`` for one metric name, labels as Prometheus prints them (sorted)."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{.*\}})?$")
    return {m.group(1) or "": v for k, v in samples.items() if (m := pattern.match(k))}


def test_events_by_source_and_kind(scenario: Scenario) -> None:
    samples = _scrape(scenario)
    assert _series(samples, "remediation_events_total") == {
        '{kind="inventory",source="slurm"}': 8,
        '{kind="unhealthy",source="slurm"}': 5,
        '{kind="healthy",source="slurm"}': 1,
        '{kind="unhealthy",source="kubernetes"}': 1,
        '{kind="unhealthy",source="manual"}': 1,
    }
    assert samples["remediation_rejected_events_total"] == 1


def test_remediations_by_outcome_and_in_flight(scenario: Scenario) -> None:
    samples = _scrape(scenario)
    assert _series(samples, "remediation_remediations_total") == {
        '{outcome="succeeded"}': 2, '{outcome="quarantined"}': 2, '{outcome="cancelled"}': 1,
        '{outcome="failed"}': 0,
    }
    assert _series(samples, "remediation_remediations_open") == {'{status="waiting",step="k8s_evict"}': 3}


# Every finished step attempt of the scenario, in seconds. The storm's gated k8s_evict never started,
# so it is not there; gpu-4's remediation was cancelled before its first step.
DURATIONS = {
    "slurm_drain": [0, 0, 250, 0, 0, 0],  # gpu-1, gpu-2, gpu-3 (jobs), gpu-5..7
    "k8s_cordon": [0] * 6,
    "k8s_evict": [0] * 3,
    # gpu-1, gpu-2 restart + reimage, gpu-3: done on the third poll, a second after slurmd's start is recorded
    "vm_restart": [31, 31, 31, 31],
    "verify": [0, 70, 70, 0],  # gpu-2's two attempts time out after 60 s (first check past it: 70 s)
    "return": [0, 0],
    "quarantine": [0, 0],  # gpu-2, gpu-0
}


def test_step_duration_histograms(scenario: Scenario) -> None:
    samples = _scrape(scenario)
    count = _series(samples, "remediation_step_duration_seconds_count")
    total = _series(samples, "remediation_step_duration_seconds_sum")
    assert count == {f'{{step="{step}"}}': len(d) for step, d in DURATIONS.items()}
    assert total == {f'{{step="{step}"}}': sum(d) for step, d in DURATIONS.items()}
    buckets = _series(samples, "remediation_step_duration_seconds_bucket")
    for step, durations in DURATIONS.items():
        for le in (*STEP_BUCKETS, float("inf")):
            label = "+Inf" if le == float("inf") else f"{le:.1f}"
            # Boundaries are inclusive: the 30 s restarts count in le="30.0", not only from le="60.0".
            expected = sum(1 for d in durations if d <= le)
            assert buckets[f'{{le="{label}",step="{step}"}}'] == expected, (step, label)
    assert len(buckets) == len(DURATIONS) * (len(STEP_BUCKETS) + 1)


def test_nodes_breaker_and_queue(scenario: Scenario) -> None:
    samples = _scrape(scenario)
    assert samples["remediation_quarantined_nodes"] == 2
    assert _series(samples, "remediation_nodes") == {
        '{status="healthy"}': 2, '{status="unhealthy"}': 1, '{status="remediating"}': 3,
        '{status="quarantined"}': 2, '{status="with-repair"}': 0,
    }
    assert samples["remediation_breaker_open"] == 1
    assert samples["remediation_paused"] == 0
    assert _series(samples, "remediation_queue_depth") == {'{queue="ingest"}': 0, '{queue="workflow"}': 12}
    assert scenario.lag_s > SCRAPE_DELAY_S - 10  # the first gated check is overdue since then
    assert samples["remediation_workflow_lag_seconds"] == scenario.lag_s
    assert samples["remediation_database_up"] == 1


def test_oldest_open_remediation_by_step(scenario: Scenario) -> None:
    """The storm's three remediations are the open ones, all at k8s_evict; every other step has a series
    at 0, so an alert on it reads a value rather than a gap."""
    ages = _series(_scrape(scenario), "remediation_oldest_open_seconds")
    assert ages.pop('{step="k8s_evict"}') == (scenario.clock.now() - scenario.storm_at).total_seconds()
    assert ages == {f'{{step="{step.value}"}}': 0 for step in Step if step not in (Step.DONE, Step.K8S_EVICT)}


def test_breaker_and_pause_follow_the_database(scenario: Scenario) -> None:
    """The gauges are read at scrape time: a closed breaker and a pause show on the next scrape. The
    breaker latches: the window sliding past the storm leaves it open; a human's close closes it."""
    with scenario.sessions() as s, s.begin():
        lever_rules.set_paused(s, True, "dana", reason="maintenance window", now=scenario.clock.now())
    scenario.clock.advance(3600)  # the storm leaves the breaker window
    scenario.engine.sweep()
    assert _scrape(scenario)["remediation_breaker_open"] == 1
    with scenario.sessions() as s, s.begin():
        lever_rules.close_breaker(s, "dana", "switch replaced", now=scenario.clock.now())
    samples = _scrape(scenario)
    assert samples["remediation_breaker_open"] == 0
    assert samples["remediation_paused"] == 1


def test_collector_reports_a_dead_database() -> None:
    sessions = make_session_factory(make_engine(DatabaseSettings(url="postgresql+psycopg://nobody@127.0.0.1:9/none")))
    registry = make_registry(sessions, queue_depth=lambda: dict(QUEUES))
    assert registry.get_sample_value("remediation_database_up") == 0
    assert registry.get_sample_value("remediation_queue_depth", {"queue": "workflow"}) == 12
    assert registry.get_sample_value("remediation_quarantined_nodes") is None
