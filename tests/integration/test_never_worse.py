"""Never worse, on Postgres with the in-memory world: job safety, proven recovery, cancel --give-back and
honest dry-run. (The real-slurmctld cases are in tests/integration/slurm/test_job_safety.py; the
latching breaker in test_workflow_engine.py and the reliability suite.)"""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopKube, NoopMachine, NoopSlurm, Recorder
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Remediation, RemediationStep
from remediation.db.queries import cluster_view, recent_failure_counts
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.ownership import give_back
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.ingest import IngestRules, ingest
from remediation.services.notify import run_pass
from remediation.services.readmodels import node_detail
from remediation.services.workflow import Workflow
from remediation.settings import NotifySettings, Settings
from tests.faults import show_fault
from tests.integration.history import drive

NODES = [f"gpu-node-{i}" for i in range(20)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world() -> MemoryWorld:
    return MemoryWorld(nodes=NODES)


def make_settings(dry_run: bool = False, **workflow: object) -> Settings:
    return Settings(
        dry_run=dry_run,
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, "breaker_max_fraction": 0.10},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30,
                  **workflow},
    )


def engine_for(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock) -> Workflow:
    return Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                    clock=clock)


def publish(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock, node: str, state: str = "FAIL",
            reason: str = "xid 79", source: Source = Source.SLURM, world: MemoryWorld | None = None) -> list[FollowUp]:
    """Ingest the watcher's event for ``node``; with ``world``, the world shows the fault first (a test
    that set the node up itself passes none)."""
    if world is not None:
        show_fault(world, node, state, reason, source)
    event = NodeEvent(source=source, node=node, kind=EventKind.UNHEALTHY, state=state, reason=reason,
                      observed_at=clock.now())
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock,
                        rules=IngestRules(dry_run=settings.dry_run))
    return [FollowUp(rid, step) for rid, step in result.opened]


def rem_for(sessions: sessionmaker[Session], node: str) -> Remediation:
    with sessions() as s:
        rem = s.scalars(select(Remediation).where(Remediation.node == node).order_by(Remediation.id.desc())).first()
        assert rem is not None
        return rem


def steps_of(sessions: sessionmaker[Session], rid: int) -> list[RemediationStep]:
    with sessions() as s:
        return list(s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)
                              .order_by(RemediationStep.id)))


def audits(sessions: sessionmaker[Session], action: str | None = None) -> list[AuditLog]:
    with sessions() as s:
        q = select(AuditLog).order_by(AuditLog.id)
        return list(s.scalars(q.where(AuditLog.action == action) if action else q))


# ------------------------------------------------------------------------------------- job safety


@pytest.mark.parametrize("state,flags", [("MIXED", ["FAIL"]), ("ALLOCATED", ["FAIL"]), ("ALLOCATED", ["FAILING"])],
                         ids=["mixed+fail", "allocated+fail", "failing"])
def test_researcher_fail_on_a_busy_node_waits_for_the_job(sessions, world, clock, state, flags) -> None:
    """A FAIL on an allocated node still has its job: no eviction and no VM action until it leaves;
    `nodes show` says which job is awaited."""
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    world.set_slurm("gpu-node-1", state=state, flags=flags, reason="bad gpu", user="alice")
    world.set_jobs("gpu-node-1", ["12345"])
    (f,) = publish(sessions, settings, clock, "gpu-node-1", state=f"{state}+{flags[0]}", reason="bad gpu")
    for _ in range(6):
        f = engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == "slurm_drain"
        clock.advance(f.countdown)
    (row,) = steps_of(sessions, f.remediation_id)
    assert row.checks == 6 and row.detail["jobs"] == ["12345"]
    with sessions() as s:
        assert node_detail(s, "gpu-node-1", 50).node.wait_reason == "waiting for 1 job (12345) to leave"
    assert not world.calls("k8s.evict") and not world.calls("vm.restart")
    world.set_jobs("gpu-node-1", [])  # the job ends (the node drops to IDLE+FAIL+DRAIN)
    drive(engine, clock, [f])
    assert rem_for(sessions, "gpu-node-1").status == "succeeded"
    assert len(world.calls("vm.restart", effect=True)) == 1


def test_no_vm_action_if_a_job_is_back_on_the_node(sessions, world, clock) -> None:
    """The guard of the destructive steps: jobs seen at vm_restart (someone resumed the node) hold it."""
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    (f,) = publish(sessions, settings, clock, "gpu-node-2", world=world)
    for expected in ("k8s_cordon", "k8s_evict", "vm_restart"):
        f = engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == expected
    world.set_jobs("gpu-node-2", ["777"])
    for _ in range(3):
        f = engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == "vm_restart"
        clock.advance(f.countdown)
    assert not world.calls("vm.restart")
    assert rem_for(sessions, "gpu-node-2").wait_reason == \
        "no machine action while jobs remain: waiting for 1 job (777) to leave"
    world.set_jobs("gpu-node-2", [])
    drive(engine, clock, [f])
    assert rem_for(sessions, "gpu-node-2").status == "succeeded"


@pytest.mark.policy("naive-ladder", why="the jobs are requeued or cancelled before the restart rung it waits for")
@pytest.mark.parametrize("policy,action,op", [("requeue", "jobs_requeued", "slurm.requeue"),
                                              ("cancel", "jobs_cancelled", "slurm.cancel")],
                         ids=["requeue", "cancel"])
def test_on_jobs_timeout_requeue_or_cancel_names_the_jobs(sessions, world, clock, policy, action, op) -> None:
    settings = make_settings(on_jobs_timeout=policy, drain_timeout_s=60)
    engine = engine_for(sessions, world, settings, clock)
    world.set_slurm("gpu-node-3", state="ALLOCATED")
    world.set_jobs("gpu-node-3", ["501", "502"])
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-3", state="DRAIN", reason="ecc", world=world))
    assert rem_for(sessions, "gpu-node-3").status == "succeeded"
    (row,) = audits(sessions, action)
    assert row.target == "gpu-node-3" and row.detail["jobs"] == ["501", "502"] and "501, 502" in row.reason
    assert [c["jobs"] for c in world.calls(op)] == [["501", "502"]]
    # The VM action came only after the jobs were gone.
    calls = world.calls()
    assert calls.index(world.calls(op)[0]) < calls.index(world.calls("vm.restart")[0])


# -------------------------------------------------------------------------------- proven recovery


@pytest.mark.policy("naive-ladder", why="counts restarts of a node whose GPU condition stays true; the shipped ladder moves it instead")
def test_gpu_condition_still_true_after_a_new_boot_id_is_not_returned(sessions, world, clock) -> None:
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    world.set_k8s("gpu-node-4", conditions={"GpuXidError": "True"})
    (f,) = publish(sessions, settings, clock, "gpu-node-4", state="GpuXidError=True", reason="xid 79",
                   source=Source.KUBERNETES)
    drive(engine, clock, [f], limit=2000)
    rem = rem_for(sessions, "gpu-node-4")
    assert rem.status == "quarantined"  # restart, then reimage, then quarantine: never returned
    verifies = [r for r in steps_of(sessions, rem.id) if r.step == "verify"]
    assert verifies and all(r.status == "failed" for r in verifies)
    assert all("trigger still present: GpuXidError is True" in (r.error or "") for r in verifies)
    assert not any(r.step == "return" for r in steps_of(sessions, rem.id))
    assert len(world.calls("vm.restart", effect=True)) + len(world.calls("vm.reimage", effect=True)) >= 2
    assert world.node("gpu-node-4")["slurm"]["reason"].startswith("remediation: quarantined")


def test_gpu_condition_cleared_after_the_restart_returns_the_node(sessions, world, clock) -> None:
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    world.set_k8s("gpu-node-5", conditions={"GpuXidError": "True"})
    (f,) = publish(sessions, settings, clock, "gpu-node-5", state="GpuXidError=True", reason="xid 79",
                   source=Source.KUBERNETES)
    while f.step != "verify":
        f = engine.run(f.remediation_id, f.step)
        clock.advance(f.countdown)
    f = engine.run(f.remediation_id, f.step)  # new bootID, slurmd restarted, but the GPU still bad
    assert f.step == "verify" and "trigger still present" in rem_for(sessions, "gpu-node-5").wait_reason
    world.set_k8s("gpu-node-5", conditions={"GpuXidError": "False"})
    drive(engine, clock, [f])
    rem = rem_for(sessions, "gpu-node-5")
    assert rem.status == "succeeded"
    (verify,) = [r for r in steps_of(sessions, rem.id) if r.step == "verify"]
    assert "trigger cleared" in verify.outcome and "slurmd registered at" in verify.outcome


def test_verify_needs_slurmd_started_after_the_action_not_a_missing_flag(sessions, world, clock) -> None:
    """A new bootID with an old slurmd (start time before the action) is not proof: slurmd has not
    re-registered. The node waits, and is not returned."""
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    (f,) = publish(sessions, settings, clock, "gpu-node-6", world=world)
    while f.step != "verify":
        f = engine.run(f.remediation_id, f.step)
        clock.advance(f.countdown)
    with world.mutate() as st:  # the reboot happened, but slurmd's start is the old one
        st["nodes"]["gpu-node-6"]["slurm"]["slurmd_start"] = 1_000_000_000.0
    f = engine.run(f.remediation_id, f.step)
    assert f is not None and f.step == "verify"
    assert "slurmd started after the action=False" in rem_for(sessions, "gpu-node-6").wait_reason
    with world.mutate() as st:
        st["nodes"]["gpu-node-6"]["slurm"]["slurmd_start"] = clock.now().timestamp() + 1
    drive(engine, clock, [f])
    assert rem_for(sessions, "gpu-node-6").status == "succeeded"


# ------------------------------------------------------------------------------ cancel --give-back


@pytest.mark.parametrize("give", [True, False], ids=["give-back", "keep"])
def test_cancel_give_back_undoes_what_is_ours_and_only_that(sessions, world, clock, give) -> None:
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    (f,) = publish(sessions, settings, clock, "gpu-node-7", world=world)
    f = engine.run(f.remediation_id, f.step)  # drained
    f = engine.run(f.remediation_id, f.step)  # cordoned
    assert world.node("gpu-node-7")["k8s"]["unschedulable"] and "DRAIN" in world.node("gpu-node-7")["slurm"]["flags"]
    with sessions() as s, s.begin():
        rem = lever_rules.cancel(s, f.remediation_id, "bob", reason="false alarm", now=clock.now(),
                                 give_back=give).remediation
        node = rem.node
    if give:  # what the release task does for the dispatcher
        note = give_back(Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), node, "remediation:")
        assert note == "uncordoned; resumed in Slurm"
    n = world.node("gpu-node-7")
    assert n["k8s"]["unschedulable"] is (not give)
    assert ("DRAIN" in n["slurm"]["flags"]) is (not give)
    (row,) = audits(sessions, "cancel")
    assert row.actor == "bob" and row.detail["give_back"] is give


def test_give_back_leaves_a_humans_drain(sessions, world, clock) -> None:
    settings = make_settings()
    engine = engine_for(sessions, world, settings, clock)
    (f,) = publish(sessions, settings, clock, "gpu-node-8", world=world)
    f = engine.run(f.remediation_id, f.step)
    world.set_slurm("gpu-node-8", reason="maint: PSU swap", user="carol")  # a human took the drain over
    note = give_back(Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), "gpu-node-8", "remediation:")
    assert "left for its owner" in note
    assert world.node("gpu-node-8")["slurm"]["reason"] == "maint: PSU swap"


# ------------------------------------------------------------------------------------ honest dry-run


def test_dry_run_rows_say_would_and_never_count(sessions, world, clock) -> None:
    """Five nodes fail in dry-run: every step and audit row says "would" and carries dry_run; the
    repeat-offender count and the breaker do not move; notifications are marked DRY-RUN."""
    settings = make_settings(dry_run=True)
    recorder = Recorder()
    dry = Workflow(sessions, Adapters(NoopSlurm(MemorySlurm(world), recorder), NoopKube(MemoryKube(world), recorder),
                                    NoopMachine(recorder)), settings, clock=clock)
    names = [f"gpu-node-{i}" for i in range(10, 15)]  # 5 of 20 = 25%: would trip a 10% breaker
    with sessions() as s:
        before = recent_failure_counts(s, names, clock.now(), window=settings.policy.repeat_offender_window)
    for name in names:
        drive(dry, clock, publish(sessions, settings, clock, name, world=world))
    with sessions() as s:
        rems = list(s.scalars(select(Remediation).where(Remediation.node.in_(names))))
        assert len(rems) == 5 and all(r.dry_run and r.status == "succeeded" for r in rems)
        assert all(r.outcome.startswith("would") for r in rems)
        rows = list(s.scalars(select(RemediationStep).where(RemediationStep.remediation_id.in_([r.id for r in rems]))))
        assert len(rows) == 30 and all(r.dry_run and (r.outcome or "").startswith("would") for r in rows)
        restarts = [r.outcome for r in rows if r.step == "vm_restart"]
        # No row says that an action that never happened completed.
        assert restarts and all("recorded, not issued" in o and "completed" not in o for o in restarts)
        logged = list(s.scalars(select(AuditLog).where(AuditLog.target.in_(names))))
        assert logged and all(a.dry_run and a.reason.startswith("would") for a in logged)
        assert recent_failure_counts(s, names, clock.now(),
                                     window=settings.policy.repeat_offender_window) == before == {}
        view = cluster_view(s, clock.now(), settings.policy.breaker_window, exclude=None)
        assert view.failed_in_window == 0 and not view.breaker_latched
        assert not s.scalars(select(AuditLog).where(AuditLog.action == "breaker_open")).all()
    assert not world.calls("slurm.drain") and not world.calls("vm.restart")  # nothing was touched
    assert [a["would"] for a in recorder.actions if a.get("node") == "gpu-node-10"][:2] == ["drain", "cordon"]
    # A sixth failure of the same node later, for real: dry-run history did not make it an offender.
    real = make_settings()
    (f,) = publish(sessions, real, clock, "gpu-node-10")
    assert f.step == "slurm_drain"


def test_dry_run_notifications_are_marked(sessions, clock) -> None:
    from remediation.services.audit import audit

    with sessions() as s, s.begin():
        audit(s, clock.now(), "remediation", action="escalate", target="gpu-node-1", reason="verify failed",
              detail={"remediation": 1},
              dry_run=True)
        audit(s, clock.now(), "remediation", action="escalate", target="gpu-node-2", reason="verify failed",
              detail={"remediation": 2})
    posted: list[str] = []
    result = run_pass(sessions, NotifySettings(webhook_url="http://hook.invalid/x", max_age_s=10**9),
                      post=lambda url, payload: posted.append(payload["text"]), clock=clock)
    assert result.sent == 2
    assert "[DRY-RUN]" in posted[0] and "would (dry-run): verify failed" in posted[0]
    assert "DRY-RUN" not in posted[1]
