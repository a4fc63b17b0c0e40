"""Profiles through the real ingest and workflow engine (Postgres, the in-memory world): each node is
decided, opened and run under its own profile, and a remediation keeps the policy it opened with."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Event, Node, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import ingest
from remediation.services.profiles import governance
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.test_workflow_engine import clock, drive, rem_for, steps_of, world  # noqa: F401

NODES = [f"gpu-node-{i}" for i in range(20)]
PROFILES = [
    {"name": "train", "select": {"partitions": ["train"]}, "workflow": {"ladder": ["reimage"]}},
    {"name": "serve", "select": {"hostlist": "gpu-node-[5-9]"}, "mode": "shadow"},
    {"name": "hold", "select": {"hostlist": "gpu-node-[10-12]"}, "mode": "drain-only"},
    {"name": "dark", "select": {"hostlist": "gpu-node-[13-14]"}, "mode": "off"},
    {"name": "bare", "select": {"hostlist": "gpu-node-15"}, "machine": {"backend": "none"}},
]


def make_settings(profiles: list[dict[str, object]]) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
        profiles=profiles,
    )


@pytest.fixture
def settings() -> Settings:
    return make_settings(PROFILES)


def engine_for(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock
) -> Workflow:
    return Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock
    )


def publish(
    sessions: sessionmaker[Session],
    settings: Settings,
    clock: FakeClock,
    node: str,
    kind: EventKind = EventKind.UNHEALTHY,
    **facts: list[str],
) -> list[FollowUp]:
    state = "IDLE" if kind is EventKind.INVENTORY else "FAIL"
    event = NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=kind,
        state=state,
        reason="xid 79",
        observed_at=clock.now(),
        **facts,
    )
    with sessions() as s, s.begin():
        result = ingest(
            s,
            [event.to_json()],
            settings.policy,
            clock,
            incidents=settings.incidents,
            governance=governance(settings),
        )
    return [FollowUp(rid, step) for rid, step in result.opened]


def machine_calls(world: MemoryWorld, node: str) -> list[str]:
    return [c["op"] for c in world.calls(effect=True) if c["op"].startswith("vm.") and c["node"] == node]


def test_a_node_is_governed_by_the_profile_its_partition_selects(sessions, world, settings, clock) -> None:
    publish(
        sessions, settings, clock, "gpu-node-1", EventKind.INVENTORY, partitions=["train"], features=["h100"]
    )
    with sessions() as s:
        node = s.get(Node, "gpu-node-1")
        assert (node.partitions, node.features) == (["train"], ["h100"])
    drive(
        engine_for(sessions, world, settings, clock), clock, publish(sessions, settings, clock, "gpu-node-1")
    )
    rem = rem_for(sessions, "gpu-node-1")
    assert (rem.status, rem.profile, rem.dry_run) == ("succeeded", "train", False)
    assert rem.policy["profile"] == "train" and rem.policy["workflow"]["ladder"] == ["reimage"]
    assert machine_calls(world, "gpu-node-1") == [
        "vm.reimage"
    ]  # the profile's ladder, not the base's restart


def test_shadow_records_what_it_would_do_beside_a_pool_that_acts(sessions, world, settings, clock) -> None:
    engine = engine_for(sessions, world, settings, clock)
    drive(
        engine,
        clock,
        publish(sessions, settings, clock, "gpu-node-3") + publish(sessions, settings, clock, "gpu-node-6"),
    )
    acted, shadow = rem_for(sessions, "gpu-node-3"), rem_for(sessions, "gpu-node-6")
    assert (acted.profile, acted.dry_run, acted.status) == (None, False, "succeeded")
    assert (shadow.profile, shadow.dry_run, shadow.status) == ("serve", True, "succeeded")
    assert machine_calls(world, "gpu-node-3") == ["vm.restart"] and machine_calls(world, "gpu-node-6") == []
    assert world.snapshot()["nodes"]["gpu-node-6"]["slurm"]["reason"] == ""  # never drained: only recorded
    assert all(r.dry_run for r in steps_of(sessions, shadow.id))
    assert not any(r.dry_run for r in steps_of(sessions, acted.id))
    with sessions() as s:
        opened = {a.target: a for a in s.scalars(select(AuditLog).where(AuditLog.action == "open"))}
    assert opened["gpu-node-6"].dry_run and opened["gpu-node-6"].reason.startswith("would ")
    assert opened["gpu-node-6"].detail["profile"] == "serve" and not opened["gpu-node-3"].dry_run


def run_steps(engine: Workflow, clock: FakeClock, f: FollowUp, steps: int) -> None:
    """Run ``steps`` deliveries, whatever they decide (a remediation held for a human never ends)."""
    for _ in range(steps):
        clock.advance(f.countdown)
        f = engine.run(f.remediation_id, f.step) or f


def test_drain_only_drains_and_holds_for_a_human(sessions, world, settings, clock) -> None:
    (f,) = publish(sessions, settings, clock, "gpu-node-10")
    run_steps(engine_for(sessions, world, settings, clock), clock, f, 6)
    rem = rem_for(sessions, "gpu-node-10")
    assert rem.status == "waiting" and "held for a human" in (rem.wait_reason or "")
    assert world.snapshot()["nodes"]["gpu-node-10"]["slurm"]["reason"].startswith("remediation:")
    assert machine_calls(world, "gpu-node-10") == []


def test_off_opens_nothing(sessions, settings, clock) -> None:
    assert publish(sessions, settings, clock, "gpu-node-13") == []
    with sessions() as s:
        (event,) = s.scalars(select(Event).where(Event.node == "gpu-node-13")).all()
        assert event.decision == "record" and event.decision_reason.startswith("profile dark is off")
        assert s.scalars(select(Remediation)).all() == []
        assert s.get(Node, "gpu-node-13").status == "unhealthy"


def test_a_profile_hammer_overrides_the_site(sessions, world, settings, clock) -> None:
    """machine.backend none for one node: no machine step, the node held for want of evidence."""
    (f,) = publish(sessions, settings, clock, "gpu-node-15")
    run_steps(engine_for(sessions, world, settings, clock), clock, f, 6)
    rem = rem_for(sessions, "gpu-node-15")
    assert rem.profile == "bare" and rem.policy["machine"] == {"backend": "none"}
    assert (rem.step, rem.status) == ("return", "waiting") and "no machine action" in rem.wait_reason
    assert "vm_restart" not in [r.step for r in steps_of(sessions, rem.id)]
    assert machine_calls(world, "gpu-node-15") == [] and rem.context.get("no_machine")


def test_a_config_change_does_not_rewrite_an_open_ladder(sessions, world, settings, clock) -> None:
    publish(sessions, settings, clock, "gpu-node-2", EventKind.INVENTORY, partitions=["train"])
    (f,) = publish(sessions, settings, clock, "gpu-node-2")
    f = engine_for(sessions, world, settings, clock).run(f.remediation_id, f.step)  # drained under [reimage]
    changed = make_settings(
        [{**PROFILES[0], "workflow": {"ladder": ["restart"]}, "policy": {"max_concurrent": 1}}]
    )
    restarted = engine_for(sessions, world, changed, clock)  # a service restarted with the new config
    drive(restarted, clock, [f])
    rem = rem_for(sessions, "gpu-node-2")
    assert rem.status == "succeeded" and machine_calls(world, "gpu-node-2") == ["vm.reimage"]
    assert rem.policy["workflow"]["ladder"] == ["reimage"] and rem.policy["policy"]["max_concurrent"] == 4
    clock.advance(3600)
    publish(sessions, changed, clock, "gpu-node-2")  # the next one opens under the new config
    assert rem_for(sessions, "gpu-node-2").policy["workflow"]["ladder"] == ["restart"]
