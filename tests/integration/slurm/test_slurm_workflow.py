"""End to end on the real slurmctld: watcher -> Redis stream -> ingest into Postgres -> workflow -> scontrol.

Nothing here stands in for Slurm. The session cluster (conftest.py) runs slurmctld and one slurmd per
node; the real Slurm watcher publishes to a real Redis stream; the stream is drained by the real
``drain`` into the real ``ingest`` on Postgres; the workflow engine acts through the real ``CliSlurm``.
Kubernetes is the in-memory world. The VM provider is a small fake at our own boundary whose
"restart", once polled to completion, brings the node's slurmd back (if it was dead) and gives its
Node a new bootID, as a rebooted VM would.

The engine is driven in this process in real time (countdowns are slept, with sub-second poll
intervals), because what it waits for, jobs ending and slurmd re-registering, happens in real time.
Each test leaves the cluster all-IDLE (the ``slurm`` fixture restores it; the tests check the service
did so itself where that is the point).
"""

from __future__ import annotations

import heapq
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import Keys, RedisEventBus
from remediation.adapters.memory import MemoryKube, MemoryWorld
from remediation.adapters.slurm.args import InvalidSlurmArgument
from remediation.adapters.slurm.backend import close_slurm, make_slurm
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.stream import Reading, consume
from remediation.clock import SystemClock
from remediation.db.models import AuditLog, Event, Node, Remediation, RemediationStep
from remediation.domain.admission import Publisher
from remediation.domain.ownership import release_node
from remediation.domain.step_bodies import Adapters
from remediation.ports.cluster import (
    MachineProvider,
    Operation,
    OperationStatus,
    SlurmControl,
    VMAction,
    VMRef,
)
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.ingest import ingest
from remediation.services.workflow import RetryLater, Workflow
from remediation.settings import Settings, load_settings
from remediation.validation.port import Validator
from remediation.watchers.runtime import Polls, Stopper
from remediation.watchers.slurm import watcher as slurm_watcher
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within

# Each test once per Slurm release and backend (cli; rest where slurmrestd can write: 24.11): see conftest.
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_backend")]
SLURM_WRITES = True

PREFIX = "remediation:"  # policy.our_reason_prefix (default)


def make_settings(
    cluster: SlurmCluster, prefix: str, slurm: dict[str, Any] | None = None, **policy: Any
) -> Settings:
    return load_settings(
        broker={"redis_url": REDIS_URL, "key_prefix": prefix, "ingest_claim_idle_s": 1},
        slurm=cluster.slurm_options(poll_interval_s=0.2, **(slurm or {})),
        # No storm breaker and no gap on a 4-node test cluster: each test is about one node.
        policy={"min_restart_gap_s": 0, "breaker_max_fraction": 1.0, **policy},
        workflow={
            "poll_interval_s": 0.3,
            "max_wait_s": 1.0,
            "drain_timeout_s": 120,
            "verify_timeout_s": 60,
            "lease_s": 30,
            "sweep_interval_s": 0.5,
        },
    )


class SlurmdRestartVM:
    """A MachineProvider at our boundary. The restart completes on the ``polls``-th poll; completing it is
    "the VM came back": the Kubernetes Node (in the memory world) turns Ready with a new bootID, and
    ``slurmd_delay_s`` later (slurmd starts after the kubelet, as on a real boot) the node's slurmd is
    started again if it is not running. A repeated idempotency key does not act twice."""

    def __init__(
        self, world: MemoryWorld, cluster: SlurmCluster, polls: int = 2, slurmd_delay_s: float = 0
    ) -> None:
        self.world = world
        self.cluster = cluster
        self.polls = polls
        self.slurmd_delay_s = slurmd_delay_s
        self.by_key: dict[str, Operation] = {}
        self.seen: dict[str, int] = {}
        self.revived: list[tuple[str, datetime]] = []  # slurmds this "VM restart" started, and when
        self._timers: list[threading.Timer] = []

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        if idempotency_key in self.by_key:
            return self.by_key[idempotency_key]
        op = Operation("memory", f"op-{uuid.uuid4().hex[:8]}", action, vm)
        self.by_key[idempotency_key] = op
        self.seen[op.ref] = 0
        self.world.set_k8s(vm.name, ready="Unknown")
        return op

    def poll(self, op: Operation) -> OperationStatus:
        self.seen[op.ref] += 1
        if self.seen[op.ref] < self.polls:
            return OperationStatus(done=False)
        if self.seen[op.ref] == self.polls:
            self.world.set_k8s(op.vm.name, ready="True", boot_id=uuid.uuid4().hex)
            timer = threading.Timer(self.slurmd_delay_s, self._start_slurmd, args=(op.vm.name,))
            self._timers.append(timer)
            timer.start()
        return OperationStatus(done=True)

    def _start_slurmd(self, node: str) -> None:
        """The VM came back: its slurmd starts afresh (a new SlurmdStartTime, which verify requires)."""
        pid = self.cluster.slurmd_pid(node)
        if pid is not None:  # the "reboot" stops the running slurmd first
            os.kill(pid, signal.SIGTERM)
            deadline = within(10)
            while self.cluster.slurmd_pid(node) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        self.cluster.start_slurmd(node)
        self.revived.append((node, SystemClock().now()))

    def close(self) -> None:
        for timer in self._timers:
            timer.join(timeout=30)


@dataclass
class Pipeline:
    """The service's data path, run in this process: watcher thread -> stream -> ingest -> engine."""

    cluster: SlurmCluster
    settings: Settings
    client: redis.Redis
    sessions: sessionmaker[Session]
    world: MemoryWorld
    vm: MachineProvider
    clock: SystemClock = field(default_factory=SystemClock)
    opened: list[FollowUp] = field(default_factory=list)
    handled: int = 0
    validator: Validator | None = None  # none: the site runs no job on a node

    @property
    def prefix(self) -> str:
        return self.settings.broker.key_prefix

    @cached_property
    def slurm_control(self) -> SlurmControl:
        """The configured Slurm backend, one per pipeline: every engine it builds shares it."""
        return make_slurm(self.settings)

    @property
    def adapters(self) -> Adapters:
        return Adapters(self.slurm_control, MemoryKube(self.world), self.vm, self.validator)

    def close(self) -> None:
        if "slurm_control" in self.__dict__:  # built
            close_slurm(self.slurm_control)

    @property
    def engine(self) -> Workflow:
        return Workflow(self.sessions, self.adapters, self.settings, clock=self.clock)

    @contextmanager
    def watching(self) -> Iterator[Polls]:
        """A watcher thread (the real ``remediation.watchers.slurm.watcher.run``); waits until its first resync is in
        Postgres, so every node is in the inventory. Yields the watcher's poll count. Once the watcher
        has stopped, what it published last is ingested too (as the ingest task would): a count of
        lost events after the block sees every publication."""
        stopper, polls = Stopper(install=False), Polls()
        bus = RedisEventBus(self.client, self.prefix, kick=None)
        slurm = make_slurm(self.settings)  # the watcher's own, as a watcher process has
        thread = threading.Thread(
            target=slurm_watcher.run,
            args=(self.settings, stopper, bus),
            kwargs={"slurm": slurm, "polls": polls},
            daemon=True,
        )
        thread.start()
        try:
            self.wait_until(lambda: self.inventory() == set(self.cluster.nodes), 10, "first resync")
            yield polls
        finally:
            stopper.stop()
            thread.join(timeout=10)
            assert not thread.is_alive(), "watcher did not stop"
            close_slurm(slurm)
            self.ingest()

    def ingest(self) -> int:
        return consume(self.client, Keys(self.prefix), self._handle, reading=Reading(batch=500,
            claim_idle_ms=1000))

    def _handle(self, payloads: Sequence[bytes]) -> None:
        with self.sessions() as s, s.begin():
            result = ingest(s, payloads, self.settings.policy, clock=self.clock)
        self.handled += len(payloads)
        self.opened += [FollowUp(rid, step) for rid, step in result.opened]

    def inventory(self) -> set[str]:
        with self.sessions() as s:
            return set(s.scalars(select(Event.node).where(Event.kind == "inventory")))

    def wait_until(self, ok: Callable[[], object], timeout: float, what: str) -> None:
        deadline = within(timeout)
        while True:
            self.ingest()
            if ok():
                return
            assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
            time.sleep(0.05)

    def wait_event(
        self, node: str, timeout: float, kind: str = "unhealthy", where: Callable[[Event], bool] | None = None
    ) -> Event:
        """The first event about ``node`` of ``kind`` (matching ``where``) in Postgres."""
        found: list[Event] = []

        def seen() -> bool:
            found[:] = [e for e in events_of(self.sessions, node, kind) if where is None or where(e)]
            return bool(found)

        self.wait_until(seen, timeout, f"{kind} event for {node} in Postgres")
        return found[0]

    def take_opened(self) -> list[FollowUp]:
        out, self.opened = self.opened, []
        return out

    def settle(self, todo: Sequence[FollowUp], timeout: float = 60) -> None:
        """Run follow-ups in real time until none is left, ingesting the watcher's events meanwhile
        (what the Celery tasks and the ingest task do in production)."""
        deadline = within(timeout)
        queue = [(time.monotonic() + f.countdown, i, f) for i, f in enumerate(todo)]
        heapq.heapify(queue)
        n = len(queue)
        while queue:
            due, _, f = heapq.heappop(queue)
            while (now := time.monotonic()) < due:
                self.ingest()
                time.sleep(min(0.05, due - now))
            try:
                nxt = self.engine.run(f.remediation_id, f.step)
            except RetryLater as exc:  # the task's self.retry(countdown=...)
                nxt = FollowUp(f.remediation_id, f.step, exc.countdown)
            if nxt is not None:
                n += 1
                heapq.heappush(queue, (time.monotonic() + nxt.countdown, n, nxt))
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"workflow did not settle within {timeout}s: {f}; "
                    f"{[(r.step, r.status, r.outcome) for r in steps_of(self.sessions, f.remediation_id)]}; "
                    f"slurm: {self.cluster.nodes_now()}"
                )
        self.ingest()


def events_of(sessions: sessionmaker[Session], node: str, kind: str | None = None) -> list[Event]:
    with sessions() as s:
        query = select(Event).where(Event.node == node).order_by(Event.id)
        if kind is not None:
            query = query.where(Event.kind == kind)
        return list(s.scalars(query))


def rems_of(sessions: sessionmaker[Session], node: str) -> list[Remediation]:
    with sessions() as s:
        return list(s.scalars(select(Remediation).where(Remediation.node == node).order_by(Remediation.id)))


def steps_of(sessions: sessionmaker[Session], rid: int) -> list[RemediationStep]:
    with sessions() as s:
        return list(
            s.scalars(
                select(RemediationStep)
                .where(RemediationStep.remediation_id == rid)
                .order_by(RemediationStep.id)
            )
        )


def wait_idle(cluster: SlurmCluster, node: str, timeout: float = 15) -> None:
    """IDLE, no flags, reason cleared (a resumed node is NOT_RESPONDING until slurmctld pings it). 24.11
    keeps the last reason of a resumed node, so there only state and flags are waited for."""
    deadline = within(timeout)
    while (now := cluster.nodes_now()[node])[:2] != ("IDLE", frozenset()) or (
        now[2] and not cluster.keeps_reason_on_resume
    ):
        assert time.monotonic() < deadline, f"{node} did not return to IDLE: {now}"
        time.sleep(0.1)


FULL_RUN = ["slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"]


@pytest.fixture
def pipeline(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session]
) -> Iterator[Callable[..., Pipeline]]:
    """Builds this test's Pipeline: ``pipeline(slurm_settings={...}, vm={...}, **policy)``."""
    made: list[SlurmdRestartVM] = []
    pipelines: list[Pipeline] = []

    def make(
        slurm_settings: dict[str, Any] | None = None, vm: dict[str, Any] | None = None, **policy: Any
    ) -> Pipeline:
        world = MemoryWorld(nodes=slurm.nodes)
        made.append(SlurmdRestartVM(world, slurm, **(vm or {})))
        settings = make_settings(slurm, redis_prefix, slurm_settings, **policy)
        pipelines.append(Pipeline(slurm, settings, redis_client, sessions, world, made[-1]))
        return pipelines[-1]

    yield make
    for provider in made:
        provider.close()
    for pipeline in pipelines:
        pipeline.close()


# ------------------------------------------------------------------------------------------- tests


def test_fail_on_idle_node_is_recorded_drained_remediated_and_returned_idle(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline]
) -> None:
    p = pipeline()
    node = "gpu-node-1"
    with p.watching():
        t0 = time.monotonic()
        slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 79")
        event = p.wait_event(node, 2.0)
        assert time.monotonic() - t0 <= 2.0, "the FAIL was not in Postgres within 2 s"
        assert (event.state, event.reason, event.reason_user, event.decision) == (
            "FAIL",
            "xid 79",
            "root",
            "open",
        )
        (first,) = p.take_opened()
        assert first.step == "slurm_drain" and first.remediation_id == event.remediation_id

        nxt = p.engine.run(first.remediation_id, first.step)
        assert nxt is not None and nxt.step == "k8s_cordon"  # FAIL: no jobs to wait for
        _, flags, reason = slurm.nodes_now()[node]
        assert "DRAIN" in flags and reason == f"{PREFIX} slurm FAIL: xid 79"

        p.settle([nxt])
        (rem,) = rems_of(p.sessions, node)
        assert rem.status == "succeeded"
        assert [r.step for r in steps_of(p.sessions, rem.id)] == FULL_RUN
        wait_idle(slurm, node)
        # The watcher saw it come back; the event is recorded, and nothing new was opened.
        p.wait_event(node, 5.0, kind="healthy")
        assert p.take_opened() == []
    with p.sessions() as s:
        assert s.get(Node, ("default", node)).status == "healthy"


def test_drain_with_a_running_job_waits_for_the_job_then_completes(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline], tmp_path: Path
) -> None:
    p = pipeline()
    node = "gpu-node-0"
    cli = CliSlurm(p.settings.slurm)
    job = (
        slurm.run(
            "sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-D", str(slurm.workdir), "--wrap", "sleep 120"
        )
        .stdout.strip()
        .split(";")[0]
    )
    deadline = within(15)
    while cli.running_jobs(node) == 0:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    with p.watching():
        slurm.scontrol("update", f"nodename={node}", "state=drain", "reason=ecc errors")
        event = p.wait_event(node, 3.0)
        assert (event.state, event.reason, event.decision) == ("DRAIN", "ecc errors", "open")
        (f,) = p.take_opened()
        for _ in range(4):  # the job still runs: slurm_drain keeps waiting, same attempt
            f = p.engine.run(f.remediation_id, f.step)
            assert f is not None and f.step == "slurm_drain"
            time.sleep(f.countdown)
        (rem,) = rems_of(p.sessions, node)
        assert rem.status == "waiting" and rem.wait_reason == f"waiting for 1 job ({job}) to leave"
        assert [(r.step, r.attempt, r.checks) for r in steps_of(p.sessions, rem.id)] == [
            ("slurm_drain", 1, 4)
        ]
        state, flags, reason = slurm.nodes_now()[node]
        assert state in ("ALLOCATED", "MIXED") and "DRAIN" in flags
        assert reason == f"{PREFIX} slurm DRAIN: ecc errors"  # taken over with our prefix, job untouched
        assert cli.running_jobs(node) == 1

        slurm.run("scancel", job)
        cancelled = SystemClock().now()
        p.settle([f])
        (rem,) = rems_of(p.sessions, node)
        assert rem.status == "succeeded"
        rows = steps_of(p.sessions, rem.id)
        assert [r.step for r in rows] == FULL_RUN
        # Passed only once the job had ended (a completing job may cost a check or two more).
        assert rows[0].checks >= 4 and rows[0].finished_at >= cancelled
        assert rows[0].outcome == "drained; no jobs running"
        wait_idle(slurm, node)


def test_killed_slurmd_goes_down_is_remediated_and_returns_when_slurmd_is_back(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline]
) -> None:
    # A long grace keeps the watcher quiet through the ~13 s of "idle*": the remediation opens on the
    # DOWN "Not responding" that follows (~26 s with SlurmdTimeout=10).
    p = pipeline(slurm_settings={"not_responding_grace_s": 60}, vm={"slurmd_delay_s": 1.0})
    vm = p.vm
    assert isinstance(vm, SlurmdRestartVM)
    node = "gpu-node-3"
    with p.watching():
        pid = slurm.slurmd_pid(node)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        event = p.wait_event(node, 60.0)
        # 24.11 keeps earlier reasons: the watcher cuts a kept "Not responding" (an earlier test's) to "".
        expected = ("Not responding", "") if slurm.keeps_reason_on_resume else ("Not responding",)
        assert (event.state, event.decision) == ("DOWN", "open") and event.reason in expected, event.reason
        opened = p.take_opened()
        with p.sessions() as s:
            where = {f.remediation_id: s.get(Remediation, f.remediation_id) for f in opened}
        # Only this node's remediation is this test's: on a loaded machine slurmctld may also find another
        # slurmd slow to answer (a real "Not responding" of its own), which is no phantom of ours.
        mine = [f for f in opened if where[f.remediation_id].node == node]
        assert len(mine) == 1, [(r.id, r.node, r.cause, r.opened_at, r.event_id) for r in where.values()] + [
            (e.id, e.kind, e.state, e.reason, e.observed_at, e.decision, e.decision_reason)
            for e in events_of(p.sessions, node)
        ]
        (f,) = mine
        f = p.engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == "k8s_cordon"  # DOWN: nothing to wait for
        p.settle([f])
        rems = rems_of(p.sessions, node)
        assert len(rems) == 1, [(r.id, r.status, r.cause, r.opened_at, r.closed_at, r.context) for r in rems] + [
            (e.id, e.kind, e.state, e.reason, e.observed_at, e.decision, e.decision_reason)
            for e in events_of(p.sessions, node, "unhealthy") + events_of(p.sessions, node, "healthy")
        ]
        (rem,) = rems
        assert rem.status == "succeeded", (rem.status, rem.outcome, rem.context)
        assert [n for n, _ in vm.revived] == [node]
        rows = {r.step: r for r in steps_of(p.sessions, rem.id)}
        assert list(rows) == FULL_RUN
        # Ready with a new bootID was not enough: a verify that first looked before slurmd was back kept
        # checking until it had registered (on a slow runner slurmd may be back before the first look).
        assert rows["verify"].finished_at > vm.revived[0][1]
        if rows["verify"].started_at < vm.revived[0][1]:
            assert rows["verify"].checks >= 2
        assert "slurmd registered" in (rows["verify"].outcome or "")
        wait_idle(slurm, node)


def test_human_maintenance_drain_is_recorded_and_never_remediated_or_resumed(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline]
) -> None:
    p = pipeline(slurm_settings={"resync_interval_s": 1})
    node = "gpu-node-2"
    with p.watching():
        slurm.scontrol("update", f"nodename={node}", "state=drain", "reason=maintenance: PSU swap")
        event = p.wait_event(node, 3.0)
        assert (event.state, event.reason, event.decision) == ("DRAIN", "maintenance: PSU swap", "record")
        assert "ignore list" in event.decision_reason
        # Resyncs re-publish it (same key: one row); the sweeper finds nothing to resume. Barrier: two
        # full resyncs (an inventory event per node and the drain, each) ingested, a sweep after each.
        for _ in range(2):
            mark = p.handled
            p.wait_until(lambda: p.handled >= mark + len(slurm.nodes) + 1, 10, "a resync")  # noqa: B023
            p.settle(p.engine.sweep())
        seen = events_of(p.sessions, node, "unhealthy")
        assert len(seen) == 1, [(e.dedupe_key, e.state, e.reason, e.observed_at) for e in seen]
        assert p.take_opened() == [] and rems_of(p.sessions, node) == []
        with p.sessions() as s:
            assert s.get(Node, ("default", node)).status == "unhealthy"
        assert slurm.nodes_now()[node] == ("IDLE", frozenset({"DRAIN"}), "maintenance: PSU swap")

        # Even a remediation opened by another signal (here a researcher's report) leaves the
        # maintenance drain in place: it is not ours, so it is neither taken over nor resumed.
        with p.sessions() as s, s.begin():
            todo = lever_rules.report(s, lever_rules.HumanReport(node, "bob", "nvidia-smi hangs"),
                                      now=p.clock.now(), policy=p.settings.policy)
        p.settle(todo)
        assert rems_of(p.sessions, node)[-1].status == "succeeded"
        assert slurm.nodes_now()[node] == ("IDLE", frozenset({"DRAIN"}), "maintenance: PSU swap")


def test_repeat_offender_stays_quarantined_until_released_and_the_release_is_audited(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline]
) -> None:
    p = pipeline(repeat_offender_count=2)
    node = "gpu-node-1"
    with p.watching() as polls:
        slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 79")
        assert p.wait_event(node, 3.0).decision == "open"
        p.settle(p.take_opened())
        assert [r.status for r in rems_of(p.sessions, node)] == ["succeeded"]
        wait_idle(slurm, node)

        slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 48")
        event = p.wait_event(node, 3.0, where=lambda e: e.reason == "xid 48")
        assert (event.state, event.decision) == ("FAIL", "quarantine")
        (f,) = p.take_opened()
        assert f.step == "quarantine"
        p.settle([f])
        rem = rems_of(p.sessions, node)[-1]
        assert rem.status == "quarantined" and rem.cause.startswith("repeat offender: 2 failures")
        quarantined = f"{PREFIX} quarantined: {rem.cause}"
        assert slurm.nodes_now()[node][1] >= {"DRAIN"} and slurm.nodes_now()[node][2] == quarantined

        # The watcher sees our quarantine drain; the ingest records it; sweeps come and go.
        p.wait_until(
            lambda: any(e.reason == quarantined for e in events_of(p.sessions, node)),
            3.0,
            "quarantine drain seen by the watcher",
        )
        for _ in range(4):  # each sweep, then polls of the watcher that could publish what it did
            p.settle(p.engine.sweep())
            assert polls.advance(2, 10), "the watcher stopped polling"
            p.ingest()
        assert p.take_opened() == []
        assert slurm.nodes_now()[node][2] == quarantined
        with p.sessions() as s:
            assert s.get(Node, ("default", node)).status == "quarantined"

        with p.sessions() as s, s.begin():
            actions = lever_rules.release(s, node, "alice", reason="PSU replaced, burn-in passed",
                                          now=p.clock.now())
        note = release_node(p.adapters, actions.node, p.settings.policy.our_reason_prefix)
        assert "resumed in Slurm" in note
        wait_idle(slurm, node)
    with p.sessions() as s:
        (row,) = s.scalars(
            select(AuditLog).where(AuditLog.action == "release", AuditLog.target == node)
        ).all()
        assert (row.actor, row.reason) == ("alice", "PSU replaced, burn-in passed")
        assert row.detail["was"] == rem.context["quarantine_reason"]
        assert s.get(Node, ("default", node)).status == "healthy"


def test_watcher_restart_and_redis_loss_republish_the_bad_set_once(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline], redis_client: redis.Redis
) -> None:
    p = pipeline(slurm_settings={"resync_interval_s": 2})
    bad, later = "gpu-node-2", "gpu-node-3"
    with p.watching():
        slurm.scontrol("update", f"nodename={bad}", "state=fail", "reason=xid 79")
        first = p.wait_event(bad, 3.0)
    # The watcher is gone (its thread joined); the node stays bad; nothing is published meanwhile.
    p.ingest()
    assert p.ingest() == 0
    handled = p.handled
    with p.watching():
        # The new watcher's first poll is a full resync: the bad set and an inventory per node again.
        p.wait_until(lambda: p.handled >= handled + len(slurm.nodes) + 1, 5.0, "resync after restart")
        rows = events_of(p.sessions, bad, "unhealthy")
        assert [(e.dedupe_key, e.state) for e in rows] == [(first.dedupe_key, "FAIL")]
        with p.sessions() as s:
            assert s.scalar(select(func.count()).select_from(Event).where(Event.node == "gpu-node-0")) == 1

        # Redis loses everything (a restart without persistence): the stream, its consumer group and
        # the leader lock. A transition published just before is gone with it.
        slurm.scontrol("update", f"nodename={later}", "state=drain", "reason=ecc errors")
        stream = Keys(p.prefix, Publisher.SLURM).stream  # the Slurm watcher's own stream
        deadline = within(3)
        while not any(b"ecc errors" in fields[b"e"] for _, fields in redis_client.xrange(stream)):
            assert time.monotonic() < deadline, "the drain was never published"
            time.sleep(0.02)
        redis_client.delete(*redis_client.scan_iter(match=f"{p.prefix}*"))
        assert redis_client.exists(stream) == 0
        # The periodic resync publishes it again, and it is recorded once, with its decision.
        event = p.wait_event(later, 5.0)
        assert (event.state, event.reason, event.decision) == ("DRAIN", "ecc errors", "open")
        handled = p.handled
        p.wait_until(lambda: p.handled >= handled + len(slurm.nodes) + 1, 10, "one more resync")
        p.ingest()  # still one row each
        assert len(events_of(p.sessions, later, "unhealthy")) == 1
        assert len(events_of(p.sessions, bad, "unhealthy")) == 1
    assert [f.remediation_id for f in p.take_opened()] == [first.remediation_id, event.remediation_id]


def test_reason_with_shell_metacharacters_reaches_scontrol_literally_and_runs_nothing(
    slurm: SlurmCluster, pipeline: Callable[..., Pipeline], tmp_path: Path
) -> None:
    p = pipeline()
    node = "gpu-node-0"
    marker = tmp_path / "executed"
    reason = (
        f"GPU fell off the bus $(touch {marker}) `touch {marker}`; touch {marker} | cat && "
        f"\"double\" 'single' ${{IFS}} > {marker} nodename=ALL state=down"
    )
    with p.watching():
        with p.sessions() as s, s.begin(), pytest.raises(lever_rules.LeverError, match="single line"):
            lever_rules.report(s, lever_rules.HumanReport(node, "alice", f"{reason}\ntouch {marker}"),
                               now=p.clock.now(), policy=p.settings.policy)
        with p.sessions() as s, s.begin():
            (f,) = lever_rules.report(s, lever_rules.HumanReport(node, "alice", reason), now=p.clock.now(),
                                      policy=p.settings.policy)
        f = p.engine.run(f.remediation_id, f.step)
        assert f is not None and f.step == "k8s_cordon"
        ours = f"{PREFIX} manual REPORTED: {reason} (reported by alice)"
        assert slurm.nodes_now()[node] == ("IDLE", frozenset({"DRAIN"}), ours)
        show = slurm.scontrol("show", "node", "-o", node).stdout
        assert f"Reason={ours} [root@" in show
        others = {n: v for n, v in slurm.nodes_now().items() if n != node}
        # not nodename=ALL (24.11 keeps earlier tests' reasons on nodes in service: state and flags only)
        assert all(v[:2] == ("IDLE", frozenset()) for v in others.values())
        assert slurm.keeps_reason_on_resume or all(v[2] == "" for v in others.values())
        p.settle([f])
        assert rems_of(p.sessions, node)[-1].status == "succeeded"
        # The watcher published our drain with the literal reason; the ingest kept it as it is.
        assert any(e.reason == ours for e in events_of(p.sessions, node, "unhealthy"))
        wait_idle(slurm, node)
    # A node name with shell characters never reaches Slurm.
    with pytest.raises(InvalidSlurmArgument, match="invalid Slurm node name"):
        CliSlurm(p.settings.slurm).drain(f"{node};touch {marker}", f"{PREFIX} x")
    assert not marker.exists()
