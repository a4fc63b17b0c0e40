"""The workflow engine on real Postgres with the in-memory world: every path of the state machine.

Steps are driven synchronously here (the Celery-driven runs are in test_celery_pipeline.py); the
fake clock makes countdowns, timeouts and windows instant.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock, aware
from remediation.db.models import AuditLog, Event, Node, Remediation, RemediationStep
from remediation.db.queries import PAUSED, control_set
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.breaker import state as breaker_state
from remediation.services.ingest import ingest
from remediation.services.workflow import RetryLater, Workflow
from remediation.settings import Settings
from tests.faults import SOFTWARE_FAULT, show_fault

NODES = [f"gpu-node-{i}" for i in range(20)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 3, 1, tzinfo=UTC))


@pytest.fixture
def world() -> MemoryWorld:
    return MemoryWorld(nodes=NODES)


def make_settings(**policy: object) -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3, **policy},
        workflow={"poll_interval_s": 5, "drain_timeout_s": 600, "verify_timeout_s": 120, "lease_s": 30},
    )


@pytest.fixture
def settings() -> Settings:
    return make_settings()


@pytest.fixture
def engine(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock
) -> Workflow:
    return Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                    clock=clock)


def publish(
    sessions: sessionmaker[Session],
    settings: Settings,
    clock: FakeClock,
    node: str,
    state: str = "FAIL",
    reason: str = SOFTWARE_FAULT,
    kind: EventKind = EventKind.UNHEALTHY,
    source: Source = Source.SLURM,
    world: MemoryWorld | None = None,
) -> list[FollowUp]:
    """Ingest a watcher's event; given the ``world``, it first shows the fault the event reports, as
    Slurm would before its watcher saw it (the workflow confirms the event there before acting)."""
    if world is not None:
        show_fault(world, node, state, reason)
    event = NodeEvent(
        source=source, node=node, kind=kind, state=state, reason=reason, observed_at=clock.now()
    )
    with sessions() as s, s.begin():
        result = ingest(s, [event.to_json()], settings.policy, clock=clock)
    return [FollowUp(rid, step) for rid, step in result.opened]


def drive(engine: Workflow, clock: FakeClock, todo: list[FollowUp], limit: int = 500) -> None:
    queue = deque(todo)
    for _ in range(limit):
        if not queue:
            return
        f = queue.popleft()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        if nxt is not None:
            queue.append(nxt)
    raise AssertionError("workflow did not settle")


def rem_for(sessions: sessionmaker[Session], node: str) -> Remediation:
    with sessions() as s:
        return s.scalars(
            select(Remediation).where(Remediation.node == node).order_by(Remediation.id.desc())
        ).first()


def steps_of(sessions: sessionmaker[Session], rid: int) -> list[RemediationStep]:
    with sessions() as s:
        return list(
            s.scalars(
                select(RemediationStep)
                .where(RemediationStep.remediation_id == rid)
                .order_by(RemediationStep.id)
            )
        )


def test_one_event_runs_every_step_and_records_keys(sessions, engine, world, settings, clock) -> None:
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-3", world=world))
    rem = rem_for(sessions, "gpu-node-3")
    assert rem.status == "succeeded"
    rows = steps_of(sessions, rem.id)
    assert [r.step for r in rows] == [
        "slurm_drain",
        "k8s_cordon",
        "k8s_evict",
        "vm_restart",
        "verify",
        "return",
    ]
    assert all(r.status == "done" and r.finished_at is not None for r in rows)
    assert [r.idempotency_key for r in rows][3] == f"r{rem.id}:vm_restart:1"
    assert rows[3].provider_op is not None and rows[3].provider_op["action"] == "restart"
    assert len(world.calls("vm.restart", effect=True)) == 1
    node = world.node("gpu-node-3")
    assert node["slurm"]["flags"] == [] and node["k8s"]["unschedulable"] is False
    with sessions() as s:
        assert s.get(Node, ("default", "gpu-node-3")).status == "healthy"
        ev = s.scalars(select(Event).where(Event.node == "gpu-node-3")).one()
        assert ev.decision == "open" and ev.remediation_id == rem.id


def test_duplicate_and_resync_events_are_recorded_once(sessions, settings, clock) -> None:
    e = NodeEvent(
        source=Source.SLURM,
        node="gpu-node-1",
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason="x",
        observed_at=clock.now(),
        dedupe_key="slurm:gpu-node-1:FAIL:t0",
    )
    with sessions() as s, s.begin():
        first = ingest(s, [e.to_json(), e.to_json()], settings.policy, clock=clock)
    with sessions() as s, s.begin():
        again = ingest(s, [e.to_json()], settings.policy, clock=clock)
    assert (first.recorded, first.duplicates, len(first.opened)) == (1, 1, 1)
    assert (again.recorded, again.duplicates, again.opened) == (0, 1, [])


def test_malformed_payload_is_kept_with_its_error(sessions, settings, clock) -> None:
    good = NodeEvent(
        source=Source.SLURM,
        node="gpu-node-2",
        kind=EventKind.UNHEALTHY,
        state="DOWN",
        observed_at=clock.now(),
    )
    with sessions() as s, s.begin():
        result = ingest(
            s,
            [b"{not json", '{"source":"slurm","node":"bad name;rm -rf"}', good.to_json()],
            settings.policy,
            clock=clock,
        )
    assert (result.rejected, result.recorded) == (2, 1)
    from remediation.db.models import RejectedEvent

    with sessions() as s:
        rows = s.scalars(select(RejectedEvent).order_by(RejectedEvent.id)).all()
    assert rows[0].payload == "{not json" and "invalid event" in rows[0].error
    assert "node" in rows[1].error and "not a valid node name" in rows[1].error


def test_drain_waits_for_jobs(sessions, engine, world, settings, clock) -> None:
    world.set_slurm("gpu-node-4", state="ALLOCATED")
    world.set_jobs("gpu-node-4", 2)
    (f,) = publish(sessions, settings, clock, "gpu-node-4", state="DRAIN", reason="ecc errors", world=world)
    nxt = engine.run(f.remediation_id, f.step)
    assert nxt is not None and nxt.step == "slurm_drain" and nxt.countdown == 5
    rem = rem_for(sessions, "gpu-node-4")
    assert rem.status == "waiting" and rem.wait_reason == "waiting for 2 jobs (1000, 1001) to leave"
    assert world.node("gpu-node-4")["slurm"]["reason"].startswith("remediation:")
    for _ in range(3):  # still busy: keeps waiting, same attempt, more checks
        clock.advance(5)
        nxt = engine.run(f.remediation_id, "slurm_drain")
        assert nxt.step == "slurm_drain"
    assert [(r.attempt, r.checks) for r in steps_of(sessions, rem.id)] == [(1, 4)]
    world.set_jobs("gpu-node-4", 0)
    drive(engine, clock, [nxt])
    assert rem_for(sessions, "gpu-node-4").status == "succeeded"


def test_drain_timeout_holds_drained_and_pages_once_never_quarantines(sessions, engine, world, settings,
                                                                      clock) -> None:
    """workflow.on_jobs_timeout=hold (the default): past drain_timeout_s the node stays drained, one
    jobs_timeout audit row pages on-call, and the step keeps waiting; no verdict, no VM action."""
    world.set_jobs("gpu-node-5", 1)
    (f,) = publish(sessions, settings, clock, "gpu-node-5", state="DRAIN", reason="bad", world=world)
    for _ in range(130):  # 130 checks, 5 s apart: past drain_timeout_s (600 s here)
        f = engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == "slurm_drain"
        clock.advance(f.countdown)
    rem = rem_for(sessions, "gpu-node-5")
    assert rem.status == "waiting" and rem.wait_reason.startswith("held: 1 job (1000) still on gpu-node-5 600s")
    with sessions() as s:
        pages = s.scalars(select(AuditLog).where(AuditLog.action == "jobs_timeout")).all()
    assert len(pages) == 1 and pages[0].detail["jobs"] == ["1000"] and pages[0].detail["policy"] == "hold"
    assert world.node("gpu-node-5")["slurm"]["reason"].startswith("remediation: slurm DRAIN")
    assert world.node("gpu-node-5")["jobs"] == ["1000"]
    assert not world.calls("vm.restart") and not world.calls("k8s.evict")
    world.set_jobs("gpu-node-5", 0)  # the job ends by itself: the remediation goes on
    drive(engine, clock, [f])
    assert rem_for(sessions, "gpu-node-5").status == "succeeded"


def test_crash_mid_restart_resumes_without_second_restart(sessions, engine, world, settings, clock) -> None:
    (f,) = publish(sessions, settings, clock, "gpu-node-6", world=world)
    f = engine.run(f.remediation_id, f.step)  # drain
    f = engine.run(f.remediation_id, f.step)  # cordon
    f = engine.run(f.remediation_id, f.step)  # evict
    assert f.step == "vm_restart"
    # The worker claims the step and calls the provider, then dies before recording the operation.
    claimed = engine._claim(f.remediation_id, engine_step("vm_restart"), token="dead-worker")
    inp = claimed[0]
    world_vm = MemoryVM(world)
    from remediation.domain.providerid import parse_provider_id

    world_vm.start(parse_provider_id(inp.context.provider_id or ""), "restart", inp.key)
    # Its message is redelivered at once: the lease is still held, so nothing runs.
    assert engine.run(f.remediation_id, "vm_restart") is None
    clock.advance(31 + 30)  # the lease (30 s) expires, then the sweeper's grace: a live worker takes over
    (resumed,) = [x for x in engine.sweep() if x.remediation_id == f.remediation_id]
    drive(engine, clock, [resumed])
    assert rem_for(sessions, "gpu-node-6").status == "succeeded"
    assert len(world.calls("vm.restart", effect=True)) == 1
    assert len(world.calls("vm.restart", effect=False)) == 1  # the repeat was recognised by its key
    rows = [r for r in steps_of(sessions, f.remediation_id) if r.step == "vm_restart"]
    assert len(rows) == 1 and rows[0].status == "done"


def engine_step(name: str):  # noqa: ANN201
    from remediation.domain.statemachine import Step

    return Step(name)


def test_verify_failure_climbs_the_ladder_then_quarantines(sessions, engine, world, settings, clock) -> None:
    with world.mutate() as st:
        st["nodes"]["gpu-node-8"]["vm"]["broken"] = True
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-8", world=world), limit=2000)
    rem = rem_for(sessions, "gpu-node-8")
    assert rem.status == "quarantined" and rem.ladder == 1
    assert "ladder exhausted" in rem.context["quarantine_reason"]
    actions = [c["op"] for c in world.calls(effect=True) if c["op"].startswith("vm.")]
    assert actions == ["vm.restart", "vm.reimage"]
    with sessions() as s:
        node = s.get(Node, ("default", "gpu-node-8"))
        assert node.status == "quarantined"
        assert (
            s.scalars(select(AuditLog.action).where(AuditLog.target == "gpu-node-8")).all().count("escalate")
            == 2
        )
    assert world.node("gpu-node-8")["k8s"]["taint"] is True


def test_repeat_offender_is_quarantined_on_the_nth_failure(sessions, engine, world, settings, clock) -> None:
    for i in range(2):
        drive(engine, clock, publish(sessions, settings, clock, "gpu-node-9", reason=f"xid {i}", world=world))
        clock.advance(3600)
    assert rem_for(sessions, "gpu-node-9").status == "succeeded"
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-9", reason="xid 3", world=world))
    rem = rem_for(sessions, "gpu-node-9")
    assert rem.status == "quarantined" and rem.cause.startswith("repeat offender: 3 failures")
    assert len(world.calls("vm.restart", effect=True)) == 2  # no third restart
    assert world.node("gpu-node-9")["slurm"]["reason"].startswith("remediation: quarantined: repeat offender")


def test_breaker_latches_past_the_window_until_a_human_closes_it(sessions, world, clock) -> None:
    """The breaker drains but holds VM actions, and stays open after the window slides (it used to
    close by itself and let every held node go to its VM action). A human's close makes each held
    remediation re-confirm: nodes resumed meanwhile are cancelled with our cordon given back, the rest
    proceed."""
    settings = make_settings(breaker_max_fraction=0.10, breaker_window_s=600)
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )
    todo = []
    for i in range(5):  # 5 of 20 nodes = 25% > 10%
        todo += publish(sessions, settings, clock, f"gpu-node-{i}", world=world)
    queue = deque(todo)
    for _ in range(60):
        f = queue.popleft()
        nxt = engine.run(f.remediation_id, f.step)
        if nxt:
            queue.append(nxt)
    assert all(world.node(f"gpu-node-{i}")["slurm"]["reason"].startswith("remediation:") for i in range(5))
    assert not world.calls("vm.restart")
    with sessions() as s:
        waiting = s.scalars(select(Remediation.wait_reason).where(Remediation.status == "waiting")).all()
        assert waiting and all("storm breaker open" in w for w in waiting)
        assert s.scalars(select(AuditLog.action)).all().count("breaker_open") == 1
    clock.advance(601)  # the storm leaves the window: the breaker stays open
    checks = 0
    for _ in range(50):  # every held remediation looks 10 more times: none reaches the VM step
        f = queue.popleft()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        checks += 1
        assert nxt is not None
        queue.append(nxt)
    assert checks == 50 and not world.calls("vm.restart")
    with sessions() as s:
        assert "breaker_closed" not in s.scalars(select(AuditLog.action)).all()
        waiting = s.scalars(select(Remediation.wait_reason).where(Remediation.status == "waiting")).all()
        assert len(waiting) == 5 and all("until a human closes it" in w for w in waiting)
    # Meanwhile a human resumed two of the nodes in Slurm (the fault was the switch, now fixed).
    for name in ("gpu-node-0", "gpu-node-1"):
        world.set_slurm(name, state="IDLE", flags=[], reason="")
    with sessions() as s, s.begin():
        held = lever_rules.close_breaker(s, "alice", "leaf switch replaced", now=clock.now())
    assert len(held) == 5
    drive(engine, clock, held, limit=2000)
    by_node = {f"gpu-node-{i}": rem_for(sessions, f"gpu-node-{i}") for i in range(5)}
    assert {n: r.status for n, r in by_node.items()} == {
        "gpu-node-0": "cancelled", "gpu-node-1": "cancelled",
        "gpu-node-2": "succeeded", "gpu-node-3": "succeeded", "gpu-node-4": "succeeded"}
    assert "healthy again" in by_node["gpu-node-0"].outcome
    assert sorted(c["node"] for c in world.calls("vm.restart", effect=True)) == ["gpu-node-2", "gpu-node-3",
                                                                                 "gpu-node-4"]
    for name in ("gpu-node-0", "gpu-node-1"):  # our cordon given back; the human's resume stands
        assert world.node(name)["k8s"]["unschedulable"] is False
        assert world.node(name)["slurm"]["flags"] == []
    with sessions() as s:
        closed = s.scalars(select(AuditLog).where(AuditLog.action == "breaker_closed")).all()
        assert [(a.actor, a.reason) for a in closed] == [("alice", "leaf switch replaced")]


def test_breaker_auto_close_is_opt_in_after_a_quiet_period(sessions, world, clock) -> None:
    settings = make_settings(breaker_max_fraction=0.10, breaker_window_s=600, breaker_auto_close_s=900)
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )
    todo = []
    for i in range(5):
        todo += publish(sessions, settings, clock, f"gpu-node-{i}", world=world)
    queue = deque(todo)
    for _ in range(20):
        f = queue.popleft()
        nxt = engine.run(f.remediation_id, f.step)
        if nxt:
            queue.append(nxt)
    clock.advance(700)  # past the window but not quiet for 900 s yet: still open
    engine.sweep()
    with sessions() as s:
        assert breaker_state(s)["open"] is True
    clock.advance(250)  # 950 s without a new failure: the system closes it, audited as such
    engine.sweep()
    with sessions() as s:
        assert breaker_state(s)["open"] is False
        (closed,) = s.scalars(select(AuditLog).where(AuditLog.action == "breaker_closed")).all()
        assert closed.actor == "remediation" and "auto-close" in closed.reason
    drive(engine, clock, list(queue), limit=2000)
    assert len(world.calls("vm.restart", effect=True)) == 5


def test_max_concurrent_limits_vm_actions(sessions, world, clock) -> None:
    settings = make_settings(max_concurrent=1, breaker_max_fraction=1.0)
    world.op_polls = 3
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )
    queue = deque(
        publish(sessions, settings, clock, "gpu-node-10", world=world)
        + publish(sessions, settings, clock, "gpu-node-11", world=world)
    )
    peak = 0
    for _ in range(400):
        if not queue:
            break
        f = queue.popleft()
        nxt = engine.run(f.remediation_id, f.step)
        if nxt:
            queue.append(nxt)
        with sessions() as s:
            active = s.scalars(select(Remediation).where(Remediation.step.in_(("verify",)))).all()
            in_restart = s.scalars(
                select(RemediationStep).where(
                    RemediationStep.step == "vm_restart", RemediationStep.status.in_(("started", "waiting"))
                )
            ).all()
            peak = max(peak, len(active) + len(in_restart))
    assert peak == 1
    assert len(world.calls("vm.restart", effect=True)) == 2


def test_min_gap_spaces_vm_actions(sessions, world, clock) -> None:
    settings = make_settings(min_restart_gap_s=300, breaker_max_fraction=1.0)
    engine = Workflow(
        sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings, clock=clock
    )
    drive(
        engine,
        clock,
        publish(sessions, settings, clock, "gpu-node-12", world=world)
        + publish(sessions, settings, clock, "gpu-node-13", world=world),
        limit=3000,
    )
    starts = [c["at"] for c in world.calls("vm.restart", effect=True)]
    assert len(starts) == 2
    with sessions() as s:
        rows = s.scalars(
            select(RemediationStep)
            .where(RemediationStep.step == "vm_restart")
            .order_by(RemediationStep.started_at)
        ).all()
    gap = (rows[1].started_at - rows[0].started_at).total_seconds()
    assert gap >= 300


def test_pause_all_stops_every_step_until_resumed(sessions, engine, world, settings, clock) -> None:
    with sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": True}, now=clock.now())
    (f,) = publish(sessions, settings, clock, "gpu-node-14", world=world)
    nxt = engine.run(f.remediation_id, f.step)
    assert nxt.step == "slurm_drain"
    assert rem_for(sessions, "gpu-node-14").wait_reason == "automation is paused"
    assert world.calls() == []
    with sessions() as s, s.begin():
        control_set(s, PAUSED, {"paused": False}, now=clock.now())
    drive(engine, clock, [nxt])
    assert rem_for(sessions, "gpu-node-14").status == "succeeded"


def test_human_drain_placed_mid_remediation_is_not_resumed(sessions, engine, world, settings, clock) -> None:
    (f,) = publish(sessions, settings, clock, "gpu-node-15", world=world)
    while f.step != "return":  # through verify
        f = engine.run(f.remediation_id, f.step)
    world.set_slurm("gpu-node-15", flags=["DRAIN"], reason="maintenance: PSU swap", user="alice")
    drive(engine, clock, [f])
    rem = rem_for(sessions, "gpu-node-15")
    assert rem.status == "succeeded"
    assert world.node("gpu-node-15")["slurm"]["reason"] == "maintenance: PSU swap"
    assert not world.calls("slurm.resume")
    assert "left for its owner" in steps_of(sessions, rem.id)[-1].outcome


def test_human_cordon_is_never_undone(sessions, engine, world, settings, clock) -> None:
    world.set_k8s("gpu-node-16", unschedulable=True, ours=False)
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-16", world=world))
    assert world.node("gpu-node-16")["k8s"]["unschedulable"] is True
    assert not world.calls("k8s.uncordon", effect=True)


def test_transient_error_is_recorded_and_raised_with_backoff(sessions, world, settings, clock) -> None:
    from remediation.ports.errors import TransientError

    class Flaky(MemoryVM):
        def start(self, vm, action, key):  # noqa: ANN001, ANN201
            raise TransientError("503 Service Unavailable", retry_after=7)

    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), Flaky(world)), settings,
                      clock=clock)
    (f,) = publish(sessions, settings, clock, "gpu-node-17", world=world)
    for _ in range(3):
        f = engine.run(f.remediation_id, f.step)
    f = engine.run(f.remediation_id, "vm_restart")  # slurmd's start from before the action is recorded
    with pytest.raises(RetryLater) as info:
        engine.run(f.remediation_id, "vm_restart")
    assert info.value.countdown == 7
    assert info.value.due == aware(rem_for(sessions, "gpu-node-17").next_run_at)  # the retry is the schedule
    row = [r for r in steps_of(sessions, f.remediation_id) if r.step == "vm_restart"][0]
    assert (row.status, row.retries, row.error_kind) == ("waiting", 1, "TransientError")
    assert row.detail["streak"] == 1 and rem_for(sessions, "gpu-node-17").ladder == 0


class SlowNoisyVM(MemoryVM):
    """A VM operation that needs ``polls`` successful polls, behind an API that answers the calls whose
    number is in ``errors`` with a 503."""

    def __init__(self, world: MemoryWorld, polls: int, errors: set[int]) -> None:
        super().__init__(world)
        world.op_polls = polls
        self.errors, self.calls, self.answered = errors, 0, 0

    def poll(self, op):  # noqa: ANN001, ANN201
        from remediation.ports.errors import TransientError

        self.calls += 1
        if self.calls in self.errors:
            raise TransientError("503 Service Unavailable")
        self.answered += 1
        return super().poll(op)


def run_to_end(engine: Workflow, clock: FakeClock, todo: list[FollowUp], limit: int = 1000) -> list[str]:
    """Like ``drive``, but a transient error is retried after its countdown, as the Celery task does.
    Returns the steps run, in order."""
    queue, ran = deque(todo), []
    for _ in range(limit):
        if not queue:
            return ran
        f = queue.popleft()
        clock.advance(f.countdown)
        ran.append(f.step)
        try:
            nxt = engine.run(f.remediation_id, f.step)
        except RetryLater as exc:
            nxt = FollowUp(f.remediation_id, f.step, exc.countdown)
        if nxt is not None:
            queue.append(nxt)
    raise AssertionError("workflow did not settle")


def test_transient_errors_spread_over_a_long_operation_do_not_escalate(sessions, world, settings, clock) -> None:
    """20 errors among 80 polls (more than twice transient_retries in all, never more than one in a
    row): the restart that was going well completes, and nothing climbs the ladder."""
    vm = SlowNoisyVM(world, polls=60, errors={i for i in range(1, 81) if i % 4 == 2})
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), vm), settings, clock=clock)
    run_to_end(engine, clock, publish(sessions, settings, clock, "gpu-node-17", world=world))
    rem = rem_for(sessions, "gpu-node-17")
    assert (vm.calls, vm.answered) == (80, 60)
    assert 20 > 2 * settings.workflow.transient_retries
    assert (rem.status, rem.ladder) == ("succeeded", 0)
    (row,) = [r for r in steps_of(sessions, rem.id) if r.step == "vm_restart"]
    assert (row.status, row.retries) == ("done", 20) and "streak" not in row.detail
    assert len(world.calls("vm.restart", effect=True)) == 1


def test_transient_retries_plus_one_errors_in_a_row_escalate(sessions, world, settings, clock) -> None:
    """With the default backoff, ``transient_retries`` errors in a row take the default budget (240 s);
    one more gives up and climbs the ladder, recording why on the step."""
    wf = settings.workflow
    assert (wf.transient_retries, wf.transient_budget_s, wf.backoff_base_s, wf.max_wait_s) == (8, 240, 2, 60)
    vm = SlowNoisyVM(world, polls=1, errors=set(range(1, 100)))
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), vm), settings, clock=clock)
    f = publish(sessions, settings, clock, "gpu-node-17", world=world)[0]
    while f.step != "vm_restart":
        f = engine.run(f.remediation_id, f.step)
    f = engine.run(f.remediation_id, f.step)  # slurmd's start from before the action is recorded
    f = engine.run(f.remediation_id, f.step)  # the restart is issued; its polls all fail from here on
    for n in range(1, wf.transient_retries + 1):
        clock.advance(f.countdown)
        with pytest.raises(RetryLater) as info:
            engine.run(f.remediation_id, "vm_restart")
        f = FollowUp(f.remediation_id, "vm_restart", info.value.countdown)
        assert rem_for(sessions, "gpu-node-17").ladder == 0, f"gave up after {n} errors"
    clock.advance(f.countdown)
    nxt = engine.run(f.remediation_id, "vm_restart")  # error number transient_retries + 1
    assert nxt is not None and nxt.step == "vm_restart"  # the ladder's next rung
    rem = rem_for(sessions, "gpu-node-17")
    assert rem.ladder == 1
    failed = [r for r in steps_of(sessions, rem.id) if r.step == "vm_restart" and r.status == "failed"]
    assert len(failed) == 1 and failed[0].error.startswith("gave up after 9 transient errors in a row over 242s")
    assert vm.calls == wf.transient_retries + 1


def test_unparseable_provider_id_fails_that_remediation_clearly(
    sessions, engine, world, settings, clock
) -> None:
    class BadIds(MemoryKube):
        def get(self, name):  # noqa: ANN001, ANN201
            from dataclasses import replace

            return replace(super().get(name), provider_id="openstack:///abc")

    engine.adapters = Adapters(MemorySlurm(world), BadIds(world), MemoryVM(world))
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-18", world=world))
    rem = rem_for(sessions, "gpu-node-18")
    assert rem.status == "quarantined"
    assert "unsupported providerID 'openstack:///abc'" in rem.context["quarantine_reason"]


def test_a_backlogs_re_sends_never_start_a_second_chain_of_polls(sessions, engine, world, settings, clock) -> None:
    world.op_polls = 10**6  # the restart never ends here: vm_restart waits on it, poll after poll
    (f,) = publish(sessions, settings, clock, "gpu-node-15", world=world)
    while not world.calls("vm.restart", effect=True):
        f = engine.run(f.remediation_id, f.step, due=f.due)
    rid, queued = f.remediation_id, f
    assert queued.step == "vm_restart" and queued.due == aware(rem_for(sessions, "gpu-node-15").next_run_at)

    def polls() -> int:
        return sum(op["data"]["polls"] for op in world.snapshot()["ops"].values())

    # A backlog: the poll sits in the queue past its time and the sweeper's grace, and is re-sent.
    clock.advance(queued.countdown + settings.workflow.sweep_interval_s + 1)
    (resent,) = [x for x in engine.sweep() if x.remediation_id == rid]
    assert resent.due is not None and resent.due != queued.due
    before = polls()
    assert engine.run(rid, queued.step, due=queued.due) is None  # the queued one comes out first: superseded
    assert polls() == before and engine.sweep() == []  # nothing ran, and nothing is overdue yet
    nxt = engine.run(rid, resent.step, due=resent.due)  # the re-send is the one that counts
    assert nxt is not None and nxt.step == "vm_restart" and polls() == before + 1
    assert engine.run(rid, resent.step, due=resent.due) is None  # a second copy of it: dropped too
    assert polls() == before + 1
    clock.advance(nxt.countdown)
    assert engine.run(rid, nxt.step, due=nxt.due) is not None and polls() == before + 2  # one chain goes on
    assert len(world.calls("vm.restart", effect=True)) == 1


def test_stale_delivery_for_a_passed_step_does_nothing(sessions, engine, world, settings, clock) -> None:
    (f,) = publish(sessions, settings, clock, "gpu-node-19", world=world)
    drive(engine, clock, [f])
    calls = len(world.calls())
    assert engine.run(f.remediation_id, "vm_restart") is None
    assert len(world.calls()) == calls


def test_human_uncordon_mid_remediation_cancels_cleanly(sessions, engine, world, settings, clock) -> None:
    world.set_k8s("gpu-node-11", pods=2, blocked=2)  # eviction stays blocked: the workflow waits
    (f,) = publish(sessions, settings, clock, "gpu-node-11", world=world)
    while f.step != "k8s_evict":
        f = engine.run(f.remediation_id, f.step)
    f = engine.run(f.remediation_id, f.step)
    assert f.step == "k8s_evict"
    world.set_k8s("gpu-node-11", unschedulable=False)  # a human: kubectl uncordon
    assert engine.run(f.remediation_id, f.step) is None
    rem = rem_for(sessions, "gpu-node-11")
    assert rem.status == "cancelled" and "a human uncordoned gpu-node-11" in rem.outcome
    assert world.node("gpu-node-11")["k8s"]["unschedulable"] is False  # never re-cordoned
    assert world.calls("k8s.cordon", effect=True).__len__() == 1
    assert world.node("gpu-node-11")["slurm"]["flags"] == []  # our drain given back
    assert not world.calls("vm.restart")


def test_never_claims_a_cordon_a_human_placed_first(sessions, engine, world, settings, clock) -> None:
    world.set_k8s("gpu-node-10", unschedulable=True, ours=False)
    drive(engine, clock, publish(sessions, settings, clock, "gpu-node-10", world=world))
    rem = rem_for(sessions, "gpu-node-10")
    assert rem.status == "succeeded" and rem.context["we_cordoned"] is False
    assert world.node("gpu-node-10")["k8s"]["unschedulable"] is True


def test_database_allows_one_open_remediation_per_node(sessions, settings, clock) -> None:
    from sqlalchemy.exc import IntegrityError

    (f,) = publish(sessions, settings, clock, "gpu-node-2")
    row = dict(node="gpu-node-2", cause="x", source="slurm", status="waiting", step="slurm_drain", ladder=0,
               opened_at=clock.now(), updated_at=clock.now(), context={})
    with pytest.raises(IntegrityError, match="uq_remediations_one_open_per_node"):
        with sessions() as s, s.begin():
            s.add(Remediation(**row))
    with sessions() as s, s.begin():  # a closed one alongside the open one is fine
        s.add(Remediation(**{**row, "status": "succeeded"}))
