"""The checkpoint request through the real workflow engine on Postgres, in the memory world.

The drain signals the jobs it finds once (an intent on the step row, then scancel through the port),
audits it with their ids, goes on the moment they leave, and applies on_jobs_timeout
checkpoint_wait_s after the request rather than after drain_timeout_s. A worker killed after the
intent never signals twice; an urgent class is never asked; a dry run records "would signal". The
real slurmctld version of these is tests/integration/slurm/test_slurm_checkpoint.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.factory import make_adapters
from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.intents import StepIntents
from remediation.db.models import AuditLog, Remediation, RemediationStep
from remediation.domain.checkpoint import CheckpointRequest
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.statemachine import Step
from remediation.domain.step_bodies import STEPS, Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.integration.test_workflow_engine import clock, drive, world  # noqa: F401  (fixtures)

POLL = 5


def make_settings(**workflow: Any) -> Settings:
    """Classification on (the suite turns it off elsewhere): urgency is the fault class's."""
    return Settings(
        policy={"min_restart_gap_s": 0, "faults": {"classify": True}},
        slurm={"backend": "memory"},
        kube={"backend": "memory"},
        machine={"backend": "memory"},
        workflow={
            "poll_interval_s": POLL,
            "drain_timeout_s": 600,
            "verify_timeout_s": 120,
            "lease_s": 30,
            "checkpoint_signal": "USR1",
            "checkpoint_wait_s": 60,
            **workflow,
        },
    )


def make_engine(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock
) -> Workflow:
    adapters = Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), intents=StepIntents(sessions))
    return Workflow(sessions, adapters, settings, clock=clock)


def publish(
    sessions: sessionmaker[Session],
    settings: Settings,
    clock: FakeClock,
    world: MemoryWorld,
    node: str,
    reason: str = "hung training step",
) -> FollowUp:
    """A researcher's ``scontrol update state=fail reason=...`` on ``node``, and the watcher's event for it."""
    world.set_slurm(node, flags=["FAIL"], reason=reason, user="researcher")
    event = NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason=reason,
        observed_at=clock.now(),
    )
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock)
    ((rid, step),) = result.opened
    return FollowUp(rid, step)


def poll_drain(engine: Workflow, clock: FakeClock, f: FollowUp, seconds: float) -> FollowUp:
    """Run the waiting drain for ``seconds`` of clock time; it must still be waiting at the end."""
    end = clock.now().timestamp() + seconds
    while clock.now().timestamp() < end:
        nxt = engine.run(f.remediation_id, f.step)
        assert nxt is not None and nxt.step == "slurm_drain", nxt
        f = nxt
        clock.advance(f.countdown)
    return f


def rem_of(sessions: sessionmaker[Session], rid: int) -> Remediation:
    with sessions() as s:
        rem = s.get(Remediation, rid)
        assert rem is not None
        return rem


def drain_row(sessions: sessionmaker[Session], rid: int) -> RemediationStep:
    with sessions() as s:
        return s.scalars(
            select(RemediationStep).where(
                RemediationStep.remediation_id == rid, RemediationStep.step == "slurm_drain"
            )
        ).one()


def audits(sessions: sessionmaker[Session], action: str) -> list[AuditLog]:
    with sessions() as s:
        return list(s.scalars(select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id)))


def test_jobs_are_signalled_once_audited_and_the_remediation_goes_on_when_they_leave(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings()
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-1", ["4242", "4243"])
    f = publish(sessions, settings, clock, world, "gpu-node-1")
    asked = clock.now()
    f = poll_drain(engine, clock, f, 40)  # 8 looks at the busy node: one request
    # One scancel per job, each recorded on the row before and after it runs.
    assert [(c["jobs"], c["signal"], c["scope"]) for c in world.calls("slurm.signal")] == [
        (["4242"], "USR1", "batch"), (["4243"], "USR1", "batch")]
    (audit,) = audits(sessions, "checkpoint_requested")
    assert audit.detail["jobs"] == ["4242", "4243"] and audit.detail["signal"] == "USR1"
    assert audit.detail["sent"] is True and not audit.dry_run
    request = CheckpointRequest.load(drain_row(sessions, f.remediation_id).provider_op)
    assert request is not None and request.jobs == ("4242", "4243") and request.at == asked and request.sent
    assert (rem_of(sessions, f.remediation_id).wait_reason or "").startswith(
        "asked jobs 4242, 4243 to checkpoint (USR1)"
    )
    assert not world.calls("slurm.requeue") and not audits(sessions, "jobs_timeout")
    world.set_jobs("gpu-node-1", [])  # they saved their work and left: the next look goes on
    drive(engine, clock, [f])
    assert rem_of(sessions, f.remediation_id).status == "succeeded"
    assert len(world.calls("slurm.signal")) == 2


@pytest.mark.parametrize("policy", ["requeue", "hold"])
def test_jobs_that_ignore_the_request_get_on_jobs_timeout_after_checkpoint_wait_s(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock, policy: str
) -> None:
    settings = make_settings(on_jobs_timeout=policy)
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-2", ["77"])
    f = publish(sessions, settings, clock, world, "gpu-node-2")
    start = clock.now()
    f = poll_drain(engine, clock, f, 60)  # up to checkpoint_wait_s (60 s): still waiting, nothing done
    assert not world.calls("slurm.requeue") and not audits(sessions, "jobs_timeout")
    clock.advance(POLL)
    engine.run(f.remediation_id, f.step)
    acted_after = (clock.now() - start).total_seconds()
    assert acted_after < 600  # drain_timeout_s was not waited out
    if policy == "requeue":
        (requeue,) = world.calls("slurm.requeue")
        assert requeue["jobs"] == ["77"]
        (note,) = audits(sessions, "jobs_requeued")
        assert "60s after the checkpoint request (USR1)" in note.reason
    else:
        (page,) = audits(sessions, "jobs_timeout")
        assert page.detail["jobs"] == ["77"] and "after the checkpoint request" in page.reason
        assert world.node("gpu-node-2")["jobs"] == ["77"]  # hold never ends a job
    assert len(world.calls("slurm.signal")) == 1


def test_an_urgent_class_is_never_asked_and_waits_out_drain_timeout(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings(on_jobs_timeout="cancel")
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-3", ["9"])
    f = publish(sessions, settings, clock, world, "gpu-node-3", reason="xid 48 double-bit ECC")  # gpu-memory: urgent
    assert rem_of(sessions, f.remediation_id).ctx.fault_class == "gpu-memory"
    f = poll_drain(engine, clock, f, 120)  # past checkpoint_wait_s: nothing asked, nothing cancelled
    assert not world.calls("slurm.signal") and not world.calls("slurm.cancel")
    assert not audits(sessions, "checkpoint_requested")


def test_a_listed_class_is_asked_even_when_urgent_and_others_are_not(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings(checkpoint_classes=["gpu-memory"])
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-0", ["1"])
    world.set_jobs("gpu-node-1", ["2"])
    memory = publish(sessions, settings, clock, world, "gpu-node-0", reason="xid 48")
    other = publish(sessions, settings, clock, world, "gpu-node-1", reason="hung")  # unknown: not listed
    engine.run(memory.remediation_id, memory.step)
    engine.run(other.remediation_id, other.step)
    assert [c["jobs"] for c in world.calls("slurm.signal")] == [["1"]]


def test_a_worker_killed_after_the_intent_never_signals_twice(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings()
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-2", ["31"])
    f = publish(sessions, settings, clock, world, "gpu-node-2")
    # A worker claims the step, runs it (the intent is committed, scancel sent) and dies before the
    # engine records anything.
    claimed = engine._claim(f.remediation_id, Step.SLURM_DRAIN, token="dead-worker")
    assert isinstance(claimed, tuple)
    inp, _row, governed = claimed  # governed: what the remediation runs under (its recorded policy)
    STEPS[Step.SLURM_DRAIN](inp, governed.adapters, governed.steps, now=clock.now())
    assert len(world.calls("slurm.signal")) == 1
    assert CheckpointRequest.load(drain_row(sessions, f.remediation_id).provider_op) is not None
    clock.advance(31 + 30)  # the lease expires; the sweeper hands the step to a live worker
    (resumed,) = [x for x in engine.sweep() if x.remediation_id == f.remediation_id]
    resumed = poll_drain(engine, clock, resumed, 20)
    assert len(world.calls("slurm.signal")) == 1  # read back from the row: not sent again
    (audit,) = audits(sessions, "checkpoint_requested")
    # The dead worker's scancel was confirmed on the row before it died: sent, and not again.
    assert audit.detail["sent"] is True and "not confirmed" not in audit.reason
    world.set_jobs("gpu-node-2", [])
    drive(engine, clock, [resumed])
    assert rem_of(sessions, f.remediation_id).status == "succeeded"


def test_dry_run_records_would_signal_and_signals_nothing(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings().model_copy(update={"dry_run": True})
    adapters = make_adapters(settings, world, intents=StepIntents(sessions))
    engine = Workflow(sessions, adapters, settings, clock=clock)
    world.set_jobs("gpu-node-3", ["55"])
    f = publish(sessions, settings, clock, world, "gpu-node-3")
    poll_drain(engine, clock, f, 20)
    assert not world.calls("slurm.signal")  # the real world was never signalled
    recorder = adapters.slurm.record  # type: ignore[attr-defined]
    (entry,) = [a for a in recorder.actions if a["would"] == "signal jobs"]
    assert entry["jobs"] == ["55"] and entry["signal"] == "USR1"
    (audit,) = audits(sessions, "checkpoint_requested")
    assert audit.dry_run and audit.reason.startswith("would")
    row = drain_row(sessions, f.remediation_id)
    assert row.dry_run and CheckpointRequest.load(row.provider_op) is not None


def test_without_a_signal_nothing_is_asked(
    sessions: sessionmaker[Session], world: MemoryWorld, clock: FakeClock
) -> None:
    settings = make_settings(checkpoint_signal="")
    engine = make_engine(sessions, world, settings, clock)
    world.set_jobs("gpu-node-0", ["8"])
    f = publish(sessions, settings, clock, world, "gpu-node-0")
    poll_drain(engine, clock, f, 90)
    assert not world.calls("slurm.signal") and not world.calls("slurm.requeue")
    assert rem_of(sessions, f.remediation_id).wait_reason == "waiting for 1 job (8) to leave"


@pytest.mark.parametrize(
    ("pods_on", "reason", "asked"),
    [(True, "hung", True), (False, "hung", False), (True, "xid 79 fell off the bus", False)],
    ids=["pods-on", "pods-off", "urgent-class"],
)
def test_pods_are_asked_only_where_the_site_and_the_class_allow(
    sessions: sessionmaker[Session],
    world: MemoryWorld,
    clock: FakeClock,
    pods_on: bool,
    reason: str,
    asked: bool,
) -> None:
    settings = make_settings(checkpoint_pods=pods_on)
    engine = make_engine(sessions, world, settings, clock)
    world.set_k8s("gpu-node-0", pods=2)
    f = publish(sessions, settings, clock, world, "gpu-node-0", reason=reason)
    for _ in range(6):  # drain, cordon, then 4 looks at the eviction: 15 s, well inside checkpoint_wait_s
        nxt = engine.run(f.remediation_id, f.step)
        assert nxt is not None
        f = nxt
        clock.advance(f.countdown)
    assert len(world.calls("k8s.checkpoint")) == (1 if asked else 0)
    assert bool(world.calls("k8s.evict")) is not asked  # asked pods get checkpoint_wait_s first
    assert len(audits(sessions, "checkpoint_requested")) == (1 if asked else 0)
