"""A site with no machine action (``machine.backend: none``), on real Postgres with the in-memory world:
no machine step is taken or recorded, and with no GPU check either a node is never returned by the
service: held with one page (the default) or quarantined (``workflow.unproven: quarantine``). The real
slurmctld and the GPU check are in test_absence.py."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog
from remediation.domain.step_bodies import Adapters
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.test_workflow_engine import (  # noqa: F401  (fixtures)
    clock,
    drive,
    make_settings,
    publish,
    rem_for,
    steps_of,
    world,
)

NODE = "gpu-node-4"


def no_machine(**workflow: object) -> Settings:
    base = make_settings()
    return Settings(**{**base.model_dump(), "machine": {"backend": "none"},
                       "workflow": {**base.workflow.model_dump(), **workflow}})


@pytest.fixture
def settings() -> Settings:
    return no_machine()


def engine_for(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock) -> Workflow:
    return Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), None), settings, clock=clock)


@pytest.fixture
def engine(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock) -> Workflow:
    return engine_for(sessions, world, settings, clock)


def pages(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(AuditLog.action).where(AuditLog.action == "unproven_hold")))


def test_no_machine_and_no_check_holds_the_drained_node_with_one_page(sessions, engine, world, settings,
                                                                    clock) -> None:
    world.set_slurm(NODE, state="IDLE", flags=["FAIL"], reason="xid 79")
    queue = publish(sessions, settings, clock, NODE, reason="xid 79")
    for _ in range(5):  # the hold looks again after each poll; nothing changes
        (f,) = queue
        clock.advance(f.countdown)
        queue = [engine.run(f.remediation_id, f.step)]
    rem = rem_for(sessions, NODE)
    rows = steps_of(sessions, rem.id)
    assert [(r.step, r.status) for r in rows] == [("slurm_drain", "done"), ("k8s_cordon", "done"),
                                                  ("k8s_evict", "done"), ("return", "waiting")]
    assert rows[-1].outcome.startswith("held for a human: no machine action and no GPU check at this site")
    assert (rem.status, rem.step, rem.action, rem.context["no_machine"]) == ("waiting", "return", "hold", True)
    assert pages(sessions) == ["unproven_hold"]
    assert not [c for c in world.calls(effect=True) if c["op"].startswith("vm.") or c["op"] == "slurm.resume"]
    assert world.node(NODE)["slurm"]["reason"] == "remediation: slurm FAIL: xid 79"

    world.set_slurm(NODE, state="IDLE", flags=[], reason="")  # a human fixed it and resumed it
    drive(engine, clock, queue)
    rem = rem_for(sessions, NODE)
    assert rem.status == "cancelled" and f"a human took {NODE} back" in rem.outcome
    assert not world.calls("slurm.resume")


def test_unproven_quarantine_quarantines_the_node_nothing_can_check(sessions, world, clock) -> None:
    settings = no_machine(unproven="quarantine")
    engine = engine_for(sessions, world, settings, clock)
    world.set_slurm(NODE, state="IDLE", flags=["FAIL"], reason="xid 79")
    drive(engine, clock, publish(sessions, settings, clock, NODE))
    rem = rem_for(sessions, NODE)
    assert [r.step for r in steps_of(sessions, rem.id)] == ["slurm_drain", "k8s_cordon", "k8s_evict", "return",
                                                            "quarantine"]
    assert (rem.status, rem.action) == ("quarantined", "quarantine")
    assert "nothing can prove gpu-node-4 healthy" in rem.context["quarantine_reason"]
    assert not world.calls("slurm.resume") and world.node(NODE)["k8s"]["taint"] is True
