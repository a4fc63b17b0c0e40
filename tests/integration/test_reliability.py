"""Reliability figures from the database only: a known history built through ingest and the workflow
(the in-memory world), and every number of the report checked against it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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
from remediation.validation.port import ValidationResult
from tests.integration.history import drive, engine_settings, publish, sessions  # noqa: F401
from tests.scripted_validator import ScriptedValidator

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
        ingest(s, [e.to_json() for e in events], settings.policy, clock=clock)


def gpu_lines(*serials: str) -> str:
    """What the check script prints after its diagnostic: ``nvidia-smi -q``'s serial and UUID lines."""
    return "".join(
        f"GPU 00000000:{18 + i:02X}:00.0\n    Serial Number : {sn}\n"
        f"    GPU UUID : GPU-{i:08d}-0000-0000-0000-{sn[-12:].rjust(12, '0')}\n"
        for i, sn in enumerate(serials)
    )


SHARED = "1650000000777"  # a GPU board seen under gpu-node-1, then (re-seated elsewhere) under gpu-node-3
CHECKS = [
    gpu_lines(SHARED, "1650000000002"),
    gpu_lines("1650000000003", "1650000000004"),
    gpu_lines(SHARED, "1650000000006"),
]


def build_known(sessions: sessionmaker[Session]) -> tuple[Reliability, dict[str, Any]]:
    """gpu-node-1: xid 79 on day 1 and xid 48 on day 2, each moved to a new host and returned;
    gpu-node-3: xid 79 on day 2, moved and returned, and its check names a GPU serial gpu-node-1's did;
    gpu-node-2: its VM never comes back on day 3 and it is quarantined (never released)."""
    base = engine_settings()
    settings = base.model_copy(
        update={
            "policy": base.policy.model_copy(
                update={
                    "faults": base.policy.faults.model_copy(
                        update={"classify": True, "ladders": {"gpu-memory": ["move-host", "quarantine"]}}
                    )
                }
            )
        }
    )
    start = datetime(2026, 11, 1, tzinfo=UTC)
    clock = FakeClock(start)
    world = MemoryWorld(nodes=NODES)
    checks = ScriptedValidator(
        [ValidationResult(done=True, exit_code=0, output=f"PASS\n{c}", state="COMPLETED") for c in CHECKS]
    )
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world),
                           checks), settings, clock=clock
    )
    for node in NODES:
        publish(sessions, settings, clock, node, state="IDLE", reason="", kind=EventKind.INVENTORY)
    domains(sessions, settings, clock)
    clock.set(start + timedelta(hours=6))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-1", reason="xid 79", world=world))
    clock.set(start + timedelta(days=1, hours=6))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-1", reason="xid 48", world=world))
    clock.set(start + timedelta(days=1, hours=12))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-3", reason="xid 79", world=world))
    clock.set(start + timedelta(days=2, hours=6))
    with world.mutate() as st:
        st["nodes"]["gpu-node-2"]["vm"]["broken"] = True
    drive(
        engine, clock, publish(sessions, settings, clock, "gpu-node-2", state="DOWN", reason="Not responding",
                               world=world)
    )
    with sessions() as s:
        rows = dict(enumerate(s.scalars(select(Remediation).order_by(Remediation.id))))
        moved_at = [
            aware(t)
            for t in s.scalars(
                select(HardwareSighting.at)
                .where(HardwareSighting.node == "gpu-node-1", HardwareSighting.action.is_not(None))
                .order_by(HardwareSighting.at)
            )
        ]
    until = start + timedelta(days=3)
    with sessions() as s:
        rep = reliability(s, start, until, lemon=settings.policy.lemon)
    return rep, {"rows": rows, "start": start, "until": until, "settings": settings, "moved_at": moved_at}


@pytest.fixture
def known(sessions: sessionmaker[Session]) -> tuple[Reliability, dict[str, Any]]:  # noqa: F811
    return build_known(sessions)


def hours(r: Remediation) -> float:
    return (aware(r.closed_at) - aware(r.opened_at)).total_seconds() / 3600  # type: ignore[operator]


def test_every_figure_follows_from_the_history(known: tuple[Reliability, dict[str, Any]]) -> None:
    rep, facts = known
    r79, r48, r3, rq = facts["rows"].values()
    assert [(r.node, r.status, r.fault_class) for r in (r79, r48, r3, rq)] == [
        ("gpu-node-1", "succeeded", "gpu-hardware"),
        ("gpu-node-1", "succeeded", "gpu-memory"),
        ("gpu-node-3", "succeeded", "gpu-hardware"),
        ("gpu-node-2", "quarantined", "host"),
    ]
    until: datetime = facts["until"]
    out_q = (until - rq.opened_at.replace(tzinfo=UTC)).total_seconds() / 3600  # never released: out to the end

    for dim, names in (("pool", ("a3", "nd")), ("zone", ("zone-a3", "zone-nd")), ("rack", ("sb-0", "sb-1"))):
        got = {g.name: g for g in rep.trends[dim].groups}
        assert set(got) == set(names)
        a, b = got[names[0]], got[names[1]]
        assert (a.nodes, a.faults, a.by_class, a.repairs) == (2, 2, {"gpu-hardware": 1, "gpu-memory": 1}, 2)
        assert a.repair_median_h == pytest.approx((hours(r79) + hours(r48)) / 2)
        assert a.repair_mean_h == pytest.approx((hours(r79) + hours(r48)) / 2)
        assert a.out_h == pytest.approx(hours(r79) + hours(r48))
        assert a.mtbf_h == pytest.approx((2 * 72 - hours(r79) - hours(r48)) / 2)
        assert (b.nodes, b.faults, b.by_class, b.repairs) == (2, 2, {"gpu-hardware": 1, "host": 1}, 1)
        assert b.repair_median_h == pytest.approx(hours(r3))
        assert b.out_h == pytest.approx(hours(r3) + out_q)
        assert b.mtbf_h == pytest.approx((2 * 72 - hours(r3) - out_q) / 2)
    # gpu-node-0 never had a machine action: its SKU was never read.
    assert {g.name: (g.nodes, g.faults) for g in rep.trends["sku"].groups} == {
        "memory-8gpu": (3, 4),
        "(none)": (1, 0),
    }

    t = rep.trends["pool"]
    assert t.classes == ["gpu-hardware", "gpu-memory", "host"]
    assert [(d.isoformat(), c) for d, c in t.daily] == [
        ("2026-11-01", {"gpu-hardware": 1}),
        ("2026-11-02", {"gpu-memory": 1, "gpu-hardware": 1}),
        ("2026-11-03", {"host": 1}),
    ]
    nodes = {m.name: m for m in t.nodes}
    assert (nodes["gpu-node-1"].faults, nodes["gpu-node-3"].faults, nodes["gpu-node-2"].faults) == (2, 1, 1)
    assert nodes["gpu-node-1"].mtbf_h == pytest.approx((72 - hours(r79) - hours(r48)) / 2)
    assert nodes["gpu-node-2"].mtbf_h == pytest.approx(72 - out_q)
    assert (nodes["gpu-node-0"].faults, nodes["gpu-node-0"].mtbf_h, nodes["gpu-node-0"].hours) == (
        0,
        None,
        72,
    )

    # Hardware: each repair moved its node (a stop/start) to another host; the name stayed.
    moved = [(m.node, m.before, m.after) for m in rep.moves]
    assert moved[:3] == [
        ("gpu-node-1", "host:gpu-node-1-host0", "host:gpu-node-1-host1"),
        ("gpu-node-1", "host:gpu-node-1-host1", "host:gpu-node-1-host2"),
        ("gpu-node-3", "host:gpu-node-3-host0", "host:gpu-node-3-host1"),
    ]
    assert all(m.why.startswith("host changed") for m in rep.moves)
    hw = {m.name: m for m in rep.hardware}
    assert [(k, hw[k].faults) for k in sorted(hw) if hw[k].faults] == [
        ("host:gpu-node-1-host0", 1),
        ("host:gpu-node-1-host1", 1),
        ("host:gpu-node-2-host0", 1),
        ("host:gpu-node-3-host0", 1),
    ]
    assert hw["host:gpu-node-1-host2"].mtbf_h is None and hw["host:gpu-node-1-host0"].sku == "memory-8gpu"
    # In service on each host: from the name's first sighting (or the move onto it) to the next move,
    # less the time out of service for the faults that happened on it.
    first, second = facts["moved_at"]
    assert hw["host:gpu-node-1-host0"].hours == pytest.approx(
        (first - facts["start"]).total_seconds() / 3600 - hours(r79)
    )
    assert hw["host:gpu-node-1-host1"].hours == pytest.approx(
        (second - first).total_seconds() / 3600 - hours(r48)
    )
    assert hw["host:gpu-node-1-host2"].hours == pytest.approx((until - second).total_seconds() / 3600)
    assert hw["host:gpu-node-1-host0"].mtbf_h == hw["host:gpu-node-1-host0"].hours
    # The GPU board the first check read under gpu-node-1 failed again under gpu-node-3.
    assert rep.shared_gpus == {SHARED: ["gpu-node-1", "gpu-node-3"]}
    assert rep.lemons[0].node == "gpu-node-1"
