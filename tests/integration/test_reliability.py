"""Reliability figures from the database only: a known history built through ingest and the workflow
(the in-memory world), and every number of the report checked against it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.models import HardwareSighting, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.services.ingest import ingest
from remediation.services.reliability import Reliability, reliability
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.history import drive, engine_settings, publish, sessions  # noqa: F401

NODES = ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
POOL = {"gpu-node-0": "a3", "gpu-node-1": "a3", "gpu-node-2": "nd", "gpu-node-3": "nd"}
ZONE_KEY = "topology.kubernetes.io/zone"


def domains(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock) -> None:
    events = [
        NodeEvent(
            source=Source.KUBERNETES,
            node=n,
            kind=EventKind.DOMAINS,
            state="domains",
            observed_at=clock.now(),
            domains={
                "cloud.google.com/gke-nodepool": POOL[n],
                ZONE_KEY: f"zone-{POOL[n]}",
                "cloud.google.com/gce-topology-subblock": f"sb-{NODES.index(n) // 2}",
            },
        )
        for n in NODES
    ]
    with sessions() as s, s.begin():
        ingest(s, [e.to_json() for e in events], settings.policy, clock)


@pytest.fixture
def known(sessions: sessionmaker[Session]) -> tuple[Reliability, dict[str, object]]:  # noqa: F811
    settings = engine_settings()
    settings = settings.model_copy(
        update={
            "policy": settings.policy.model_copy(
                update={"faults": settings.policy.faults.model_copy(update={"classify": True})}
            )
        }
    )
    start = datetime(2026, 11, 1, tzinfo=UTC)
    clock = FakeClock(start)
    world = MemoryWorld(nodes=NODES)
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock
    )
    for node in NODES:
        publish(sessions, settings, clock, node, state="IDLE", reason="", kind=EventKind.INVENTORY)
    domains(sessions, settings, clock)
    clock.set(start + timedelta(hours=6))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-1", reason="xid 79"))
    clock.set(start + timedelta(days=1, hours=6))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-1", reason="xid 48"))
    clock.set(start + timedelta(days=2, hours=6))
    with world.mutate() as st:
        st["nodes"]["gpu-node-2"]["vm"]["broken"] = True
    drive(
        engine, clock, publish(sessions, settings, clock, "gpu-node-2", state="DOWN", reason="Not responding")
    )
    with sessions() as s:
        rows = {r.id: r for r in s.scalars(select(Remediation).order_by(Remediation.id))}
        seen = list(s.scalars(select(HardwareSighting).order_by(HardwareSighting.id)))
    until = start + timedelta(days=3)
    with sessions() as s:
        rep = reliability(s, start, until, settings.policy.lemon)
    return rep, {"rows": rows, "sightings": seen, "start": start, "until": until}


def test_every_figure_follows_from_the_history(known: tuple[Reliability, dict[str, object]]) -> None:
    rep, facts = known
    rows: dict[int, Remediation] = facts["rows"]  # type: ignore[assignment]
    r79, r48, rq = rows.values()
    assert [r.status for r in (r79, r48, rq)] == ["succeeded", "succeeded", "quarantined"]
    assert (r79.fault_class, r48.fault_class, rq.fault_class) == ("gpu-hardware", "gpu-memory", "host")
    h = lambda r: (aware(r.closed_at) - aware(r.opened_at)).total_seconds() / 3600  # noqa: E731
    until: datetime = facts["until"]  # type: ignore[assignment]

    pool = {g.name: g for g in rep.trends["pool"].groups}
    assert set(pool) == {"a3", "nd"}
    assert (pool["a3"].nodes, pool["a3"].faults, pool["a3"].by_class) == (
        2,
        2,
        {"gpu-hardware": 1, "gpu-memory": 1},
    )
    assert pool["a3"].repairs == 2
    assert pool["a3"].repair_median_h == pytest.approx((h(r79) + h(r48)) / 2)
    assert pool["a3"].out_h == pytest.approx(h(r79) + h(r48))
    assert pool["a3"].mtbf_h == pytest.approx((2 * 72 - h(r79) - h(r48)) / 2)
    # The quarantined node was never released: out from its fault to the end of the window.
    out_q = (until - aware(rq.opened_at)).total_seconds() / 3600
    assert (pool["nd"].faults, pool["nd"].repairs, pool["nd"].repair_median_h) == (1, 0, None)
    assert pool["nd"].out_h == pytest.approx(out_q)
    assert pool["nd"].mtbf_h == pytest.approx(2 * 72 - out_q)
    assert {g.name for g in rep.trends["zone"].groups} == {"zone-a3", "zone-nd"}
    assert {g.name: g.faults for g in rep.trends["rack"].groups} == {"sb-0": 2, "sb-1": 1}
    assert {g.name: g.faults for g in rep.trends["sku"].groups} == {
        "memory-8gpu": 3,
        "(none)": 0,
    }  # never read: no machine action

    daily = dict(rep.trends["pool"].daily)
    assert [sum(c.values()) for c in daily.values()] == [1, 1, 1]
    assert list(daily.values())[2] == {"host": 1}

    nodes = {m.name: m for m in rep.trends["pool"].nodes}
    assert nodes["gpu-node-1"].faults == 2
    assert nodes["gpu-node-1"].mtbf_h == pytest.approx((72 - h(r79) - h(r48)) / 2)
    assert nodes["gpu-node-0"].mtbf_h is None and nodes["gpu-node-0"].hours == pytest.approx(72)

    # Hardware: each fault's ladder moved its node (stop/start) to another host; the names stayed.
    assert [(m.node, m.before, m.after) for m in rep.moves] == [
        ("gpu-node-1", "host:gpu-node-1-host0", "host:gpu-node-1-host1"),
        ("gpu-node-1", "host:gpu-node-1-host1", "host:gpu-node-1-host2"),
        ("gpu-node-2", "host:gpu-node-2-host0", "host:gpu-node-2-host1"),
    ]
    assert all(m.why.startswith("host changed") for m in rep.moves)
    hw = {m.name: m for m in rep.hardware}
    assert {k: m.faults for k, m in hw.items()} == {
        "host:gpu-node-1-host0": 1,
        "host:gpu-node-1-host1": 1,
        "host:gpu-node-1-host2": 0,
        "host:gpu-node-2-host0": 1,
        "host:gpu-node-2-host1": 0,
    }
    assert hw["host:gpu-node-1-host2"].mtbf_h is None and hw["host:gpu-node-1-host0"].sku == "memory-8gpu"
    assert rep.lemons[0].node == "gpu-node-1"
