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
from remediation.profiles.service import governance
from remediation.services import lever_rules
from remediation.services.breaker import latches as breaker_latches
from remediation.services.holds import automation_status
from remediation.services.ingest import IngestRules, ingest
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.faults import UNKNOWN_FAULT, show_fault
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
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )


def publish(
    sessions: sessionmaker[Session],
    settings: Settings,
    clock: FakeClock,
    node: str,
    kind: EventKind = EventKind.UNHEALTHY,
    world: MemoryWorld | None = None,
    **facts: list[str],
) -> list[FollowUp]:
    """Ingest the Slurm watcher's event; given the ``world``, a fault is first shown there (a
    researcher's ``state=fail``), as Slurm shows it before the workflow confirms the event."""
    state = "IDLE" if kind is EventKind.INVENTORY else "FAIL"
    if world is not None and kind is EventKind.UNHEALTHY:
        show_fault(world, node, state, UNKNOWN_FAULT)
    event = NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=kind,
        state=state,
        reason=UNKNOWN_FAULT,  # class unknown: the profile's workflow.ladder decides
        observed_at=clock.now(),
        **facts,
    )
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock,
                        rules=IngestRules(incidents=settings.incidents, governance=governance(settings)))
    return [FollowUp(rid, step) for rid, step in result.opened]


def machine_calls(world: MemoryWorld, node: str) -> list[str]:
    return [c["op"] for c in world.calls(effect=True) if c["op"].startswith("vm.") and c["node"] == node]


def test_a_node_is_governed_by_the_profile_its_partition_selects(sessions, world, settings, clock) -> None:
    publish(
        sessions, settings, clock, "gpu-node-1", EventKind.INVENTORY, partitions=["train"], features=["h100"]
    )
    with sessions() as s:
        node = s.get(Node, ("default", "gpu-node-1"))
        assert (node.partitions, node.features) == (["train"], ["h100"])
    drive(
        engine_for(sessions, world, settings, clock),
        clock,
        publish(sessions, settings, clock, "gpu-node-1", world=world),
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
        publish(sessions, settings, clock, "gpu-node-3", world=world)
        + publish(sessions, settings, clock, "gpu-node-6", world=world),
    )
    acted, shadow = rem_for(sessions, "gpu-node-3"), rem_for(sessions, "gpu-node-6")
    assert (acted.profile, acted.dry_run, acted.status) == (None, False, "succeeded")
    assert (shadow.profile, shadow.dry_run, shadow.status) == ("serve", True, "succeeded")
    assert machine_calls(world, "gpu-node-3") == ["vm.restart"] and machine_calls(world, "gpu-node-6") == []
    shadowed = world.snapshot()["nodes"]["gpu-node-6"]["slurm"]
    # Never drained, only recorded: Slurm still shows the researcher's fail, nothing of ours.
    assert (shadowed["reason"], shadowed["flags"]) == (UNKNOWN_FAULT, ["FAIL"])
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
    (f,) = publish(sessions, settings, clock, "gpu-node-10", world=world)
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
        assert s.get(Node, ("default", "gpu-node-13")).status == "unhealthy"


def test_a_profile_hammer_overrides_the_site(sessions, world, settings, clock) -> None:
    """machine.backend none for one node: no machine step, the node held for want of evidence."""
    (f,) = publish(sessions, settings, clock, "gpu-node-15", world=world)
    run_steps(engine_for(sessions, world, settings, clock), clock, f, 6)
    rem = rem_for(sessions, "gpu-node-15")
    assert rem.profile == "bare" and rem.policy["machine"] == {"backend": "none"}
    assert (rem.step, rem.status) == ("return", "waiting") and "no machine action" in rem.wait_reason
    assert "vm_restart" not in [r.step for r in steps_of(sessions, rem.id)]
    assert machine_calls(world, "gpu-node-15") == [] and rem.context.get("no_machine")


def test_a_config_change_does_not_rewrite_an_open_ladder(sessions, world, settings, clock) -> None:
    publish(sessions, settings, clock, "gpu-node-2", EventKind.INVENTORY, partitions=["train"])
    (f,) = publish(sessions, settings, clock, "gpu-node-2", world=world)
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
    publish(sessions, changed, clock, "gpu-node-2", world=world)  # the next one opens under the new config
    assert rem_for(sessions, "gpu-node-2").policy["workflow"]["ladder"] == ["restart"]


STORM_PROFILES = [
    {
        "name": "pool-a",
        "select": {"hostlist": "gpu-node-[0-9]"},
        "policy": {"breaker_min_failures": 3, "breaker_max_fraction": 0.2},
    },
    {"name": "pool-b", "select": {"hostlist": "gpu-node-[10-19]"}, "policy": {"breaker_max_fraction": 0.5}},
]


def storm_settings(fleet_fraction: float) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, "breaker_max_fraction": fleet_fraction},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
        profiles=STORM_PROFILES,
    )


def inventory_events(clock: FakeClock, facts: dict[str, tuple[list[str], list[str]]]) -> list[str]:
    """The Slurm watcher's inventory events: each node with its partitions and features."""
    return [
        NodeEvent(
            source=Source.SLURM,
            node=n,
            kind=EventKind.INVENTORY,
            state="IDLE",
            observed_at=clock.now(),
            partitions=p,
            features=f,
        ).to_json()
        for n, (p, f) in facts.items()
    ]


def inventory(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock) -> None:
    """The Slurm watcher's first resync: every node, each then in its profile's pool."""
    with sessions() as s, s.begin():
        ingest(s, inventory_events(clock, {n: (["gpu"], []) for n in NODES}), settings.policy, clock=clock,
               rules=IngestRules(governance=governance(settings)))
        pools = dict(s.execute(select(Node.name, Node.profile)).all())
    assert pools["gpu-node-3"] == "pool-a" and pools["gpu-node-13"] == "pool-b"


def test_a_storm_latches_its_own_pool_and_the_other_goes_on(sessions, world, clock) -> None:
    settings = storm_settings(fleet_fraction=0.5)
    inventory(sessions, settings, clock)
    engine = engine_for(sessions, world, settings, clock)
    storm = [
        f for n in range(4) for f in publish(sessions, settings, clock, f"gpu-node-{n}", world=world)
    ]  # 4/10 of pool-a
    other = publish(sessions, settings, clock, "gpu-node-12", world=world)
    run_steps_all(engine, clock, storm + other, rounds=12)
    assert rem_for(sessions, "gpu-node-12").status == "succeeded"  # pool-b's remediation went on
    assert machine_calls(world, "gpu-node-12") == ["vm.restart"]
    held = [rem_for(sessions, f"gpu-node-{n}") for n in range(4)]
    assert {(r.step, r.status) for r in held} == {("k8s_evict", "waiting")}
    assert "profile pool-a's storm breaker open" in held[0].wait_reason
    assert all(machine_calls(world, f"gpu-node-{n}") == [] for n in range(4))
    with sessions() as s:
        latches = breaker_latches(s)
        status = automation_status(s)
    assert latches["pool-a"]["open"] and not latches.get(None, {}).get("open")
    assert list(status["profile_breakers"]) == ["pool-a"] and not status["breaker"].get("open")

    # A human closes pool-a's breaker: its remediations re-check their trigger and go on.
    with sessions() as s, s.begin():
        followups = lever_rules.close_breaker(s, "alice", "switch replaced", now=clock.now(),
                                              profile="pool-a")
    assert sorted(f.remediation_id for f in followups) == sorted(r.id for r in held)
    drive(engine, clock, followups)
    assert {rem_for(sessions, f"gpu-node-{n}").status for n in range(4)} == {"succeeded"}


def test_the_fleet_latch_stays_above_every_pool(sessions, world, clock) -> None:
    settings = storm_settings(fleet_fraction=0.1)  # 3 of 20 failing is more than 10% of the fleet
    inventory(sessions, settings, clock)
    engine = engine_for(sessions, world, settings, clock)
    # 3 of pool-b's 10 is within its own limit (50%).
    todo = [f for n in (10, 11, 12) for f in publish(sessions, settings, clock, f"gpu-node-{n}", world=world)]
    run_steps_all(engine, clock, todo, rounds=6)
    held = [rem_for(sessions, f"gpu-node-{n}") for n in (10, 11, 12)]
    assert {r.status for r in held} == {"waiting"}
    assert held[0].wait_reason.startswith("storm breaker open")  # the fleet's, not a pool's
    with sessions() as s:
        latches = breaker_latches(s)
    assert latches[None]["open"] and not latches.get("pool-b", {}).get("open")


def run_steps_all(engine: Workflow, clock: FakeClock, todo: list[FollowUp], rounds: int) -> None:
    """Deliver every remediation's next step, ``rounds`` times over (held ones are delivered again)."""
    for _ in range(rounds):
        clock.advance(max((f.countdown for f in todo), default=0))
        todo = [engine.run(f.remediation_id, f.step) or f for f in todo]


def test_a_human_quarantine_records_the_profile_too(sessions, world, settings, clock) -> None:
    publish(sessions, settings, clock, "gpu-node-7", EventKind.INVENTORY, partitions=["gpu"])
    with sessions() as s, s.begin():
        f = lever_rules.quarantine(s, "gpu-node-7", "alice", reason="fan noise", now=clock.now(),
                                   governance=governance(settings))
    drive(engine_for(sessions, world, settings, clock), clock, [f])
    rem = rem_for(sessions, "gpu-node-7")
    # A human's lever is real even in a shadow profile: the node is quarantined, the row is not dry-run.
    assert (rem.status, rem.profile, rem.dry_run, rem.policy["mode"]) == (
        "quarantined",
        "serve",
        False,
        "shadow",
    )


def test_a_profile_sets_its_own_job_timeout_and_repeat_offender_count(sessions, world, clock) -> None:
    """drain_timeout_s, on_jobs_timeout and N per profile: the batch pool requeues its jobs at once, the
    strict pool quarantines on the first fault, the base policy holds for its jobs."""
    settings = make_settings(
        [
            {
                "name": "batch",
                "select": {"hostlist": "gpu-node-[0-1]"},
                "workflow": {"drain_timeout_s": 0, "on_jobs_timeout": "requeue"},
            },
            {"name": "strict", "select": {"hostlist": "gpu-node-2"}, "policy": {"repeat_offender_count": 1}},
        ]
    )
    engine = engine_for(sessions, world, settings, clock)
    world.set_jobs("gpu-node-0", ["1001"])
    world.set_jobs("gpu-node-9", ["2002"])
    batch = publish(sessions, settings, clock, "gpu-node-0", world=world)
    base = publish(sessions, settings, clock, "gpu-node-9", world=world)
    (strict,) = publish(sessions, settings, clock, "gpu-node-2", world=world)
    assert strict.step == "quarantine"  # N = 1: this failure is the Nth
    run_steps_all(engine, clock, batch + base, rounds=4)
    assert [c["node"] for c in world.calls("slurm.requeue", effect=True)] == ["gpu-node-0"]
    held = rem_for(sessions, "gpu-node-9")
    assert (held.step, held.status) == ("slurm_drain", "waiting") and "1 job" in held.wait_reason
