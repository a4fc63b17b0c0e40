"""Fault intelligence on real Postgres with the in-memory world: the cause picks the first
action, application-level XIDs wait for a repeat, a class with no VM action holds for a human, and the
lemon score quarantines. Classification and lemon scoring run with the shipped defaults (the suite's
older tests turn them off; see tests/conftest.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Event, Remediation
from remediation.domain.events import Source
from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings
from tests.faults import show_fault
from tests.integration.test_workflow_engine import clock, drive, engine, publish, rem_for, steps_of, world  # noqa: F401  (fixtures)


def fault_settings(**policy: object) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, "faults": {"classify": True},
                "lemon": {"enabled": True}, **policy},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
    )


@pytest.fixture
def settings() -> Settings:
    """Overrides the engine's settings (the `engine`, `world` and `clock` fixtures are the workflow
    engine tests')."""
    return fault_settings()


def fail(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock, node: str,
         reason: str) -> list[FollowUp]:
    """The node is failed in Slurm with ``reason`` (the world shows it), then the watcher's event for it
    is ingested."""
    show_fault(world, node, "FAIL", reason)
    return publish(sessions, settings, clock, node, reason=reason)


def vm_calls(world: MemoryWorld) -> list[str]:
    return [c["op"] for c in world.calls(effect=True) if c["op"].startswith("vm.")]


def test_xid_48_goes_straight_to_a_new_host(sessions, engine, world, settings, clock) -> None:
    drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-1", reason="Xid 48 on gpu3, DBE"))
    rem = rem_for(sessions, "gpu-node-1")
    assert rem.status == "succeeded"
    assert (rem.fault_class, rem.action) == ("gpu-memory", "move-host")
    assert rem.fault_evidence.startswith("xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE; NVIDIA: WORKFLOW_XID_48)")
    assert vm_calls(world) == ["vm.stop_start"]  # a move to fresh hardware, never a same-host restart
    assert [r.step for r in steps_of(sessions, rem.id)][3:5] == ["vm_restart", "verify"]


def test_xid_48_that_does_not_recover_is_quarantined_for_rma_without_a_restart(sessions, engine, world,
                                                                               settings, clock) -> None:
    with world.mutate() as st:
        st["nodes"]["gpu-node-2"]["vm"]["broken"] = True
    drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-2", reason="xid 48"), limit=2000)
    rem = rem_for(sessions, "gpu-node-2")
    assert rem.status == "quarantined" and rem.action == "quarantine"
    assert vm_calls(world) == ["vm.stop_start"]  # one move-host, then quarantine: not restart twice
    assert "ladder exhausted" in rem.context["quarantine_reason"]
    assert "RMA" in rem.context["quarantine_reason"]
    assert world.node("gpu-node-2")["k8s"]["taint"] is True


def test_unknown_cause_keeps_the_sites_ladder(sessions, engine, world, settings, clock) -> None:
    with world.mutate() as st:
        st["nodes"]["gpu-node-3"]["vm"]["broken"] = True
    drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-3", reason="acting up, ticket 4711"),
          limit=2000)
    rem = rem_for(sessions, "gpu-node-3")
    assert rem.fault_class == "unknown" and rem.status == "quarantined"
    assert vm_calls(world) == ["vm.restart", "vm.reimage"]  # workflow.ladder, as before cause classification


def test_gpu_transient_restarts_then_moves_host(sessions, engine, world, settings, clock) -> None:
    with world.mutate() as st:
        st["nodes"]["gpu-node-4"]["vm"]["broken"] = True
    drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-4", reason="xid 119 GSP timeout"), limit=2000)
    rem = rem_for(sessions, "gpu-node-4")
    assert rem.fault_class == "gpu-transient" and rem.status == "quarantined"
    assert vm_calls(world) == ["vm.restart", "vm.stop_start"]
    with sessions() as s:
        escalations = s.scalars(select(AuditLog.reason).where(AuditLog.target == "gpu-node-4",
                                                              AuditLog.action == "escalate")).all()
    assert len(escalations) == 2


def test_application_xid_is_recorded_and_opens_nothing_until_it_repeats(sessions, engine, world, settings,
                                                                       clock) -> None:
    for i in range(2):
        assert fail(sessions, world, settings, clock, "gpu-node-5", reason=f"xid 13, job {900 + i} crashed") == []
        clock.advance(600)
    with sessions() as s:
        decisions = s.scalars(select(Event.decision).where(Event.node == "gpu-node-5")).all()
        assert decisions == ["app_xid", "app_xid"]
        assert s.scalar(select(Remediation.id).where(Remediation.node == "gpu-node-5")) is None
    followups = fail(sessions, world, settings, clock, "gpu-node-5", reason="xid 13, job 902 crashed")
    assert len(followups) == 1  # the third within the window is a node fault
    drive(engine, clock, followups)
    rem = rem_for(sessions, "gpu-node-5")
    assert rem.fault_class == "software" and rem.status == "succeeded"
    assert "3 times within 1d" in rem.fault_evidence
    assert vm_calls(world) == ["vm.restart"]


def test_fabric_fault_is_drained_paged_and_held_with_no_vm_action(sessions, engine, world, settings,
                                                                 clock) -> None:
    world.set_slurm("gpu-node-6", state="DOWN", reason="leaf switch sw-a3 down")
    followups = publish(sessions, settings, clock, "gpu-node-6", state="DOWN", reason="leaf switch sw-a3 down")
    queue = list(followups)
    for _ in range(6):  # the hold checks again after each poll; nothing changes while the switch is down
        f = queue.pop()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        assert nxt is not None
        queue.append(nxt)
    rem = rem_for(sessions, "gpu-node-6")
    assert (rem.fault_class, rem.action, rem.status, rem.step) == ("fabric", "hold", "waiting", "k8s_evict")
    assert rem.wait_reason.startswith("held for a human: class fabric takes no machine action")
    assert vm_calls(world) == [] and not world.calls("k8s.evict")
    assert world.node("gpu-node-6")["slurm"]["reason"].startswith("remediation:")
    with sessions() as s:
        pages = s.scalars(select(AuditLog.action).where(AuditLog.action == "fault_hold")).all()
    assert pages == ["fault_hold"]  # paged once, not on every check
    world.set_slurm("gpu-node-6", state="IDLE")  # the switch is fixed: slurmd answers again
    drive(engine, clock, queue)
    rem = rem_for(sessions, "gpu-node-6")
    assert rem.status == "cancelled" and "the fault cleared while held" in (rem.outcome or "")
    assert world.node("gpu-node-6")["k8s"]["unschedulable"] is False
    assert vm_calls(world) == []


def test_lemon_score_quarantines_a_node_failing_weekly(sessions, engine, world, settings, clock) -> None:
    for week in range(3):
        drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-7", reason=f"acting up, week {week}"))
        assert rem_for(sessions, "gpu-node-7").status == "succeeded"
        clock.advance(6 * 86400)
    drive(engine, clock, fail(sessions, world, settings, clock, "gpu-node-7", reason="acting up again"))
    rem = rem_for(sessions, "gpu-node-7")
    assert rem.status == "quarantined" and rem.cause.startswith("lemon: 4 failure(s)")
    assert len(world.calls("vm.restart", effect=True)) == 3  # no fourth restart


def test_kubernetes_condition_is_classified_from_its_message(sessions, engine, world, settings, clock) -> None:
    world.set_k8s("gpu-node-8", conditions={"GpuXidError": "True"})
    followups = publish(sessions, settings, clock, "gpu-node-8", state="GpuXidError=True", source=Source.KUBERNETES,
                        reason="Node gpu-node-8: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus")
    with sessions() as s:
        rem = s.get(Remediation, followups[0].remediation_id)
        assert (rem.fault_class, rem.action) == ("gpu-hardware", "move-host")


def test_a_failed_gpu_check_weighs_on_the_lemon_score(sessions, clock) -> None:
    """A GPU check that failed counts as one more failure in the node's history."""
    from remediation.db.fault_history import failure_history
    from remediation.db.models import Node, Validation

    now = clock.now()
    with sessions() as s, s.begin():
        s.add(Node(name="gpu-node-3", status="remediating", status_reason="", first_seen_at=now, updated_at=now))
        s.flush()
        rem = Remediation(node="gpu-node-3", cause="xid 48", source="slurm", status="running", step="validate",
                          opened_at=now, updated_at=now, fault_class="gpu-memory")
        s.add(rem)
        s.flush()
        for outcome in ("failed", "passed"):
            s.add(Validation(remediation_id=rem.id, node="gpu-node-3", backend="slurm", name=f"gate-{outcome}",
                             cause_class="gpu-memory", command="dcgmi diag -r 3", outcome=outcome, exit_code=1,
                             started_at=now, finished_at=now, duration_s=1.0))
    with sessions() as s:
        history = failure_history(s, ["gpu-node-3"], now, horizon=timedelta(days=90))
    # The remediation, and its failed check (the passed one is no evidence against the node).
    assert [f.fault_class for f in history["gpu-node-3"]] == ["gpu-memory", "gpu-memory"]
