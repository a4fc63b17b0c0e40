"""Scenarios 6-8: flapping nodes, human overrides and stale replays, on Postgres with simulated time.

The workflow runs through the real ingest and Workflow against the in-memory world; the fake clock makes
ten minutes of flapping or a week of history instant. Each scenario records its figures.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Event, Node, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.flap import Condition, FlapFilter
from remediation.domain.ownership import release_node
from remediation.domain.step_bodies import Adapters
from remediation.ports.cluster import Operation, VMAction, VMRef
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import TransientError
from remediation.services.ingest import ingest
from remediation.services.lever_rules import HumanReport, release, report
from remediation.services.workflow import RetryLater, Workflow
from remediation.settings import Settings
from tests.scenario_table import Figures, Table

NODES = [f"gpu-node-{i}" for i in range(16)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 6, 1, tzinfo=UTC))


@pytest.fixture
def world() -> MemoryWorld:
    return MemoryWorld(nodes=NODES)


@pytest.fixture
def settings() -> Settings:
    # Three nodes of sixteen fail within minutes here; the storm breaker (scenario 12) is not what these
    # scenarios are about, so it opens only past half the pool.
    return Settings(policy={"min_restart_gap_s": 0, "repeat_offender_count": 3, "breaker_max_fraction": 0.5},
                    workflow={"poll_interval_s": 5}, kube={"min_condition_s": 300})


@pytest.fixture
def engine(sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock) -> Workflow:
    return Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), settings,
                    clock=clock)


@pytest.fixture(autouse=True)
def inventory(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock) -> None:
    """The Slurm watcher's first snapshot: every node joins the inventory, the storm breaker's pool."""
    publish(sessions, settings, clock, [
        slurm_event(n, "IDLE", "", clock.now(), f"slurm:{n}:inventory", kind=EventKind.INVENTORY) for n in NODES
    ])


def publish(sessions: sessionmaker[Session], settings: Settings, clock: FakeClock, events: list[NodeEvent],
            figures: Figures | None = None) -> list[FollowUp]:
    """Hand ``events`` to the ingest, as the worker does; ``figures`` counts them as published."""
    if figures is not None:
        figures.sent(events)
    with sessions() as s, s.begin():
        opened = ingest(s, [e.to_json() for e in events], settings.policy, clock=clock).opened
    return [FollowUp(rid, step) for rid, step in opened]


def settle(engine: Workflow, clock: FakeClock, todo: list[FollowUp], limit: int = 3000) -> None:
    queue = deque(todo)
    for _ in range(limit):
        if not queue:
            return
        f = queue.popleft()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        if nxt:
            queue.append(nxt)
    raise AssertionError("did not settle")


def count(sessions: sessionmaker[Session], *where: object) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Remediation).where(*where)) or 0


def slurm_event(node: str, state: str, reason: str, at: datetime, key: str | None = None,
                kind: EventKind = EventKind.UNHEALTHY) -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node=node, kind=kind, state=state, reason=reason, observed_at=at,
                     dedupe_key=key or f"slurm:{node}:{state}:{at.isoformat()}")


@pytest.mark.scenario("6 flapping node (10 min fast, 72 min slow)")
def test_flapping_node_never_opens_before_the_hold_and_never_loops(sessions, engine, world, settings, clock,
                                                                   scenario_figures) -> None:
    flap = FlapFilter(settings.policy.kube_conditions, settings.kube.min_condition_s, clock.now)
    node = "gpu-node-1"

    def observe(status: str) -> list[FollowUp]:
        changes = flap.observe(node, [Condition("Ready", status, "kubelet", clock.now())]) + flap.due()
        events = [NodeEvent(source=Source.KUBERNETES, node=c.node, kind=c.kind, state=c.state, reason=c.message,
                            observed_at=clock.now(), dedupe_key=c.key) for c in changes]
        if status == "False":
            world.set_k8s(node, ready="False")
        return publish(sessions, settings, clock, events, scenario_figures)

    # Ready flips every 10 s for 10 minutes: never holds 5 minutes, so nothing is published or opened.
    opened = []
    for i in range(60):
        opened += observe("False" if i % 2 == 0 else "True")
        clock.advance(10)
    fast = count(sessions)
    assert opened == [] and fast == 0
    # Then it flaps slowly (bad 6 min, good 6 min) for hours: every bad spell is published once, the
    # repeat-offender rule ends the loop after N, and the node stays quarantined.
    for _cycle in range(6):
        for _ in range(36):
            opened = observe("False")
            settle(engine, clock, opened)
            clock.advance(10)
        for _ in range(36):
            world.set_k8s(node, ready="True")
            settle(engine, clock, observe("True"))
            clock.advance(10)
    total = count(sessions)
    quarantined = count(sessions, Remediation.status == "quarantined")
    assert quarantined == 1
    assert total == settings.policy.repeat_offender_count
    restarts = len(world.calls("vm.restart", effect=True))
    assert restarts == settings.policy.repeat_offender_count - 1
    lost = scenario_figures.record(db=sessions, duplicate_actions=world.double_vm_actions(),
                            notes=f"fast flaps: {fast} remediations; slow flaps: {total} opened "
                                  f"(repeat-offender count {settings.policy.repeat_offender_count}), "
                                  f"{restarts} restarts, {quarantined} quarantined")
    assert lost == 0, f"{lost} published events are not in Postgres"


@pytest.mark.scenario("7 human overrides (drain, uncordon, release)")
def test_human_overrides_are_never_undone(sessions, engine, world, settings, clock, scenario_figures) -> None:
    now = clock.now()
    # A maintenance drain: recorded, and even a manual report on the node leaves the human's drain alone.
    world.set_slurm("gpu-node-2", flags=["DRAIN"], reason="maintenance: PSU swap", user="alice")
    assert publish(sessions, settings, clock, [slurm_event("gpu-node-2", "DRAIN", "maintenance: PSU swap", now)], scenario_figures) == []
    with sessions() as s, s.begin():  # a human's report: through the lever, never the stream
        reported = report(s, HumanReport("gpu-node-2", "dana", "gpu looks slow"), now=clock.now(),
                          policy=settings.policy)
    settle(engine, clock, reported)
    checks = {"maintenance drain kept": world.node("gpu-node-2")["slurm"]["reason"] == "maintenance: PSU swap"
              and "DRAIN" in world.node("gpu-node-2")["slurm"]["flags"]}
    assert checks["maintenance drain kept"], world.node("gpu-node-2")
    # A human uncordon mid-remediation cancels ours cleanly; we never cordon again.
    world.set_k8s("gpu-node-3", pods=1, blocked=1)
    world.set_slurm("gpu-node-3", flags=["FAIL"], reason="xid 79", user="bob")
    (f,) = publish(sessions, settings, clock, [slurm_event("gpu-node-3", "FAIL", "xid 79", clock.now())], scenario_figures)
    while f and f.step != "k8s_evict":
        f = engine.run(f.remediation_id, f.step)
    world.set_k8s("gpu-node-3", unschedulable=False)
    settle(engine, clock, [f])
    assert count(sessions, Remediation.node == "gpu-node-3", Remediation.status == "cancelled") == 1
    assert len(world.calls("k8s.cordon", effect=True)) == 2  # gpu-node-2's report and gpu-node-3, once each
    assert world.node("gpu-node-3")["k8s"]["unschedulable"] is False
    checks["uncordon cancelled ours"] = (
        count(sessions, Remediation.node == "gpu-node-3", Remediation.status == "cancelled") == 1
        and len(world.calls("k8s.cordon", effect=True)) == 2)
    # A human release of a quarantined node sticks: the resync re-publishing old conditions changes nothing.
    node, history = "gpu-node-4", []
    for i in range(3):
        world.set_slurm(node, flags=["FAIL"], reason=f"xid {i}", user="carol")
        ev = slurm_event(node, "FAIL", f"xid {i}", clock.now())
        history.append(ev)
        settle(engine, clock, publish(sessions, settings, clock, [ev], scenario_figures))
        clock.advance(3600)
    assert count(sessions, Remediation.node == node, Remediation.status == "quarantined") == 1
    our_drain = world.node(node)["slurm"]["reason"]
    assert our_drain.startswith("remediation: quarantined: repeat offender")
    with sessions() as s, s.begin():
        release(s, node, "dave", reason="PSU replaced, burn-in passed", now=clock.now())
    release_node(engine.adapters, node, settings.policy.our_reason_prefix)
    # A watcher that lagged re-publishes the old failures and our quarantine drain (late edge events).
    resync = history + [slurm_event(node, "DRAIN", our_drain, clock.now(), "late-edge-of-our-drain")]
    assert publish(sessions, settings, clock, resync, scenario_figures) == []
    with sessions() as s:
        assert s.get(Node, ("default", node)).status == "healthy"
        assert s.scalars(select(AuditLog.actor).where(AuditLog.action == "release")).all() == ["dave"]
    assert world.node(node)["slurm"]["flags"] == []
    # After the release the count starts again: one new failure is remediated, not quarantined.
    world.set_slurm(node, flags=["FAIL"], reason="xid 9", user="carol")
    settle(engine, clock, publish(sessions, settings, clock, [slurm_event(node, "FAIL", "xid 9", clock.now())], scenario_figures))
    assert count(sessions, Remediation.node == node, Remediation.status == "succeeded") == 3
    with sessions() as s:
        checks["release stuck through resync"] = (
            s.scalars(select(AuditLog.actor).where(AuditLog.action == "release")).all() == ["dave"]
            and count(sessions, Remediation.node == node, Remediation.status == "quarantined") == 1)
    lost = scenario_figures.record(db=sessions, duplicate_actions=world.double_vm_actions(),
                            notes="; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items()))
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert all(checks.values()), checks


@pytest.mark.scenario("8 stale replay after restart")
def test_stale_replay_after_a_restart_takes_no_action(sessions, engine, world, settings, clock,
                                                      scenario_figures) -> None:
    node = "gpu-node-5"
    down_at = clock.now()
    world.set_slurm(node, state="DOWN", flags=["NOT_RESPONDING"], reason="Not responding", user="slurm")
    first = slurm_event(node, "DOWN", "Not responding", down_at, key="slurm:gpu-node-5:DOWN:t0")
    settle(engine, clock, publish(sessions, settings, clock, [first], scenario_figures))
    assert count(sessions, Remediation.status == "succeeded") == 1
    calls = len(world.calls(effect=True))
    clock.advance(1800)
    # After a restart the same event comes again (same key): recorded once, nothing happens.
    replays = {"same key deduped": publish(sessions, settings, clock, [first], scenario_figures) == []}
    # An old DOWN for the node (a backlog replayed under a new key) observed during the first episode:
    # it is explained by that remediation (attributed, never a second fault), so nothing opens.
    during = slurm_event(node, "DOWN", "Not responding", down_at + timedelta(seconds=1), key="replayed-from-backlog")
    replays["backlog event of the first episode attributed"] = publish(sessions, settings, clock, [during], scenario_figures) == []
    # An old DOWN observed well after that episode settled, replayed now that the node is healthy
    # again: the remediation confirms the live state first and stops without acting.
    later = down_at + timedelta(seconds=settings.policy.settle_s + 300)
    assert (clock.now() - later).total_seconds() > settings.workflow.stale_event_s
    old = slurm_event(node, "DOWN", "Not responding", later, key="replayed-from-backlog-2")
    settle(engine, clock, publish(sessions, settings, clock, [old], scenario_figures))
    with sessions() as s:
        rem = s.scalars(select(Remediation).order_by(Remediation.id.desc())).first()
        assert rem.status == "cancelled" and rem.outcome.startswith("stale: Slurm reports gpu-node-5 IDLE")
        assert s.get(Node, ("default", node)).status == "healthy"
        assert s.scalar(select(func.count()).select_from(Event).where(Event.node == node, Event.kind != "inventory")) == 3
        assert count(sessions, Remediation.node == node) == 2
        replays["later one confirmed stale"] = rem.status == "cancelled"
    acted = len(world.calls(effect=True)) - calls
    lost = scenario_figures.record(db=sessions, duplicate_actions=acted,
                            notes="; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in replays.items())
                                  + f"; actions after the replays: {acted}")
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert all(replays.values()), replays
    assert acted == 0  # no drain, cordon or restart


class AnswerLostOnce(MemoryVM):
    """The first VM action is performed but its answer is lost (a transient error), so the step retries;
    with ``new_key`` the retry comes under a key the provider has not seen, as a workflow that minted a
    fresh key per retry would send it."""

    def __init__(self, world: MemoryWorld, new_key: bool) -> None:
        super().__init__(world)
        self.new_key, self.starts = new_key, 0

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        self.starts += 1
        key = f"{idempotency_key}:retry" if self.new_key and self.starts > 1 else idempotency_key
        op = super().start(vm, action, key)
        if self.starts == 1:
            raise TransientError("connection reset after the request was sent")
        return op


@pytest.mark.parametrize("new_key", [False, True], ids=["retry under its key", "retry under a new key"])
def test_a_retry_that_acts_again_is_a_double_action_and_fails_the_row(sessions, world, settings, clock,
                                                                     new_key) -> None:
    vm = AnswerLostOnce(world, new_key)
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), vm), settings, clock=clock)
    node = "gpu-node-6"
    world.set_slurm(node, flags=["FAIL"], reason="xid 79", user="eve")
    todo = deque(publish(sessions, settings, clock, [slurm_event(node, "FAIL", "xid 79", clock.now())]))
    while todo:
        f = todo.popleft()
        clock.advance(f.countdown)
        try:
            nxt = engine.run(f.remediation_id, f.step)
        except RetryLater as retry:
            clock.advance(retry.countdown)
            nxt = f
        if nxt:
            todo.append(nxt)
    assert vm.starts == 2 and count(sessions, Remediation.status == "succeeded") == 1
    doubles = world.double_vm_actions()
    assert doubles == (1 if new_key else 0)
    table = Table()
    table.scenario_of["t"], table.outcome["t"] = "retries", "passed"
    table.figures["t"] = Figures("retries", recorded=True, duplicate_actions=doubles).summary()
    (row,) = table.rows()
    assert row.problems == (["1 duplicate actions"] if new_key else [])
