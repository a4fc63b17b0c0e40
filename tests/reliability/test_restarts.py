"""Scenarios 2 and 3: a Redis restart during an event storm, and a Postgres restart mid-workflow.

Neither test touches the shared servers other tests use. Each starts a private server of its own in a
temporary directory on a leased port, points real Celery worker processes at it, and kills it mid-run:

- **Redis** runs with ``appendonly yes`` and ``appendfsync always``, the production requirement (see
  docs/architecture.md, "Redis must keep the stream across restarts"): every XADD Redis acknowledged is
  on disk before the publisher hears "OK". It is killed with **SIGKILL**, not SIGTERM: SIGTERM lets
  Redis flush and exit cleanly, which proves nothing; SIGKILL is the crash a node loss or an OOM kill
  causes, and with ``appendfsync always`` it is the harder test (the AOF may end in a torn write).
- **Postgres** is a throw-away cluster (initdb, trust auth) stopped with ``pg_ctl -m immediate``, which
  aborts every backend without a checkpoint, so the restart goes through crash recovery.

The publisher behaves like the watchers: it keeps what it could not publish (BusUnavailable) in an
outbox and retries with backoff, while new observations keep arriving at their own pace.
"""

from __future__ import annotations

import glob
import os
import pwd
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import GROUP, BusUnavailable, RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.migrate import upgrade
from remediation.db.models import Event, RejectedEvent, Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.faults import SOFTWARE_FAULT, show_fault
from tests.infra import missing
from tests.integration.workerproc import Worker, settled, wait_for, worker_env
from tests.pace import budget
from tests.ports import lease
from tests.redisproc import PrivateRedis, RedisMissing
from tests.reliability.conftest import Recorder, scale

# ------------------------------------------------------------------------------------ private Redis


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    try:
        server = PrivateRedis(workdir)
    except RedisMissing:
        missing("redis-server")
    server.start()
    yield server
    server.close()


# --------------------------------------------------------------------------------- private Postgres


def postgres_bindir() -> Path | None:
    """The newest installed server binaries: Debian's layout first, then pg_config, then PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivateCluster:
    """A throw-away Postgres cluster on a leased port (a restart comes back on it). As root, the server
    runs as the ``postgres`` OS user (Postgres refuses to run as root)."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            missing("the Postgres server binaries (initdb, pg_ctl)")
        self.bin = bindir
        self.base = Path(tempfile.mkdtemp(prefix="remediation-pg-"))
        self.data = self.base / "data"
        self.lease = lease()
        self.port = self.lease.port
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/remediation"

    def _run(self, *args: str) -> None:
        proc = subprocess.run(list(args), capture_output=True, text=True, user=self.user, cwd=self.base,
                              check=False, timeout=60)
        if proc.returncode != 0:
            log = self.base / "pg.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise AssertionError(f"{' '.join(args)} failed: {proc.stderr}\n{tail}")

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        self.start()
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE remediation")
        upgrade(self.url)

    def start(self) -> float:
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "pg.log"), "-w",
                  "-t", "60", "-o", opts, "start")
        return time.monotonic()

    def crash(self) -> None:
        """Abort every backend, no checkpoint: the next start runs crash recovery."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, user=self.user, check=False, timeout=60)
        shutil.rmtree(self.base, ignore_errors=True)
        self.lease.close()


@pytest.fixture
def private_pg() -> Iterator[PrivateCluster]:
    cluster = PrivateCluster()
    try:
        cluster.init()
        yield cluster
    finally:
        cluster.destroy()


# ---------------------------------------------------------------------------------------- helpers


class Publisher(threading.Thread):
    """Publishes a timeline of events the way a watcher does: each event is handed over when it is
    observed (``rate`` per second); whatever Redis refused stays in the outbox and is retried with
    backoff, together with everything observed meanwhile.

    ``hold_at``: the storm observes nothing past that event until :attr:`go` is set, then goes on at
    its rate. A test holds the storm half-way until a worker, however loaded the machine, has a step
    in flight, so the kill that follows ``go`` lands mid-storm and mid-step."""

    def __init__(self, bus: RedisEventBus, events: list[NodeEvent], rate: float, hold_at: int | None = None) -> None:
        super().__init__(daemon=True)
        self.bus, self.events, self.rate, self.hold_at = bus, events, rate, hold_at
        self.go = threading.Event()
        self.observed = 0  # events handed to the publisher so far ("what the watchers saw")
        self.published = 0
        self.refusals = 0
        self.error: BaseException | None = None

    def _due(self, start: float) -> int:
        due = min(len(self.events), int((time.monotonic() - start) * self.rate) + 1)
        return due if self.hold_at is None or self.go.is_set() else min(due, self.hold_at)

    def run(self) -> None:
        try:
            start, backoff, outbox, held = time.monotonic(), 0.05, [], False
            while self.published < len(self.events):
                if held and self.go.is_set():  # the storm goes on from where it was held, at its rate
                    start, held = time.monotonic() - self.observed / self.rate, False
                due = self._due(start)
                held = held or (self.hold_at is not None and due == self.hold_at and not self.go.is_set())
                outbox += self.events[self.observed:due]
                self.observed = max(self.observed, due)
                if not outbox:
                    time.sleep(0.005)
                    continue
                try:
                    self.bus.publish(outbox)
                except BusUnavailable:
                    self.refusals += 1
                    time.sleep(backoff)
                    backoff = min(1.0, backoff * 2)
                    continue
                self.published += len(outbox)
                outbox, backoff = [], 0.05
                time.sleep(0.02)
        except BaseException as exc:  # surfaced by the test: a watcher would have crashed here
            self.error = exc


def storm_events(tag: str, total: int, opens: list[str]) -> list[NodeEvent]:
    """A storm as the watchers would see it: mostly resyncs and recoveries (record-only), human
    maintenance drains (recorded, left alone) and a handful of real failures that open a workflow."""
    rng = random.Random(total)
    t0 = datetime.now(UTC)
    events: list[NodeEvent] = []
    # The real failures come in the first half, so their VM restarts are under way when Redis dies.
    fail_at = {round((i + 1) * total / 2 / (len(opens) + 1)): node for i, node in enumerate(opens)}
    for i in range(total):
        key, at = f"{tag}:{i:07d}", t0 + timedelta(milliseconds=i)
        if i in fail_at:
            events.append(NodeEvent(source=Source.SLURM, node=fail_at[i], kind=EventKind.UNHEALTHY, state="FAIL",
                                    reason=SOFTWARE_FAULT, observed_at=at, dedupe_key=key))
            continue
        node = f"rack{rng.randrange(40):02d}-node{rng.randrange(25):02d}"
        roll = rng.random()
        if roll < 0.70:
            ev = NodeEvent(source=Source.SLURM, node=node, kind=EventKind.INVENTORY, state="IDLE",
                           observed_at=at, dedupe_key=key)
        elif roll < 0.90:
            ev = NodeEvent(source=Source.KUBERNETES, node=node, kind=EventKind.HEALTHY, state="Ready=True",
                           observed_at=at, dedupe_key=key)
        else:
            ev = NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="DRAIN",
                           reason="maintenance: swap PSU", reason_user="admin", observed_at=at, dedupe_key=key)
        events.append(ev)
    return events


def keys_recorded(db: Engine, tag: str, below: int | None = None) -> int:
    """Distinct dedupe keys of this run's events in Postgres (those numbered below ``below``)."""
    q = select(func.count(func.distinct(Event.dedupe_key))).where(Event.dedupe_key.like(f"{tag}:%"))
    if below is not None:
        q = q.where(Event.dedupe_key < f"{tag}:{below:07d}")
    with Session(db) as s:
        return int(s.scalar(q) or 0)


def statuses(db: Engine) -> dict[str, str]:
    with Session(db) as s:
        return {node: v for node, v in s.execute(select(Remediation.node, Remediation.status))}


def describe(db: Engine) -> str:
    """The workflow state, for a failure message."""
    with Session(db) as s:
        rems = s.execute(select(Remediation.id, Remediation.node, Remediation.status, Remediation.step,
                                Remediation.wait_reason)).all()
        steps = s.execute(select(RemediationStep.remediation_id, RemediationStep.step, RemediationStep.status,
                                 RemediationStep.error).order_by(RemediationStep.id)).all()
    return "\n".join(map(str, [*rems, *steps]))


def duplicate_effects(world: MemoryWorld) -> Counter[tuple[str, str]]:
    counts = Counter((c["op"], c["node"]) for c in world.calls(effect=True))
    return Counter({k: n - 1 for k, n in counts.items() if n > 1})


def fail_event(node: str, world: MemoryWorld) -> NodeEvent:
    """The Slurm watcher's event for a node failed with a software fault, which the world (the workers'
    journal) shows first, as Slurm would when the watcher saw it."""
    show_fault(world, node, "FAIL", SOFTWARE_FAULT)
    return NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="FAIL", reason=SOFTWARE_FAULT,
                     observed_at=datetime.now(UTC))


# ------------------------------------------------------------------------- scenario 2: Redis restart


def steps_in_flight(db: Engine) -> set[int]:
    """Step rows a worker has started and not finished."""
    with Session(db) as s:
        return set(s.scalars(select(RemediationStep.id).where(RemediationStep.status.in_(("started", "waiting")))))


def restarts_begun(db: Engine, within: timedelta) -> set[int]:
    """Machine restarts started in the last ``within`` and not yet answered: slurmd's start recorded (the
    row waits), no operation yet. With the 2 s call, each still has most of its call to run, so a kill
    that follows at once lands inside it even on a loaded machine (a quick step seen in flight may end
    before the kill)."""
    with Session(db) as s:
        return set(s.scalars(select(RemediationStep.id).where(
            RemediationStep.step == "vm_restart", RemediationStep.status.in_(("started", "waiting")),
            RemediationStep.provider_op.is_(None), RemediationStep.started_at > datetime.now(UTC) - within)))


def steps_spanning(db: Engine, at: datetime) -> set[int]:
    """Step rows in flight at ``at`` by their own times: started before it, and finished after it or
    not yet. Timestamps, not two looks, so a step that ends between a look and the kill is not counted
    and one that was in flight is, however slow the look."""
    with Session(db) as s:
        return set(
            s.scalars(
                select(RemediationStep.id).where(
                    RemediationStep.started_at < at,
                    (RemediationStep.finished_at.is_(None)) | (RemediationStep.finished_at > at),
                )
            )
        )


@pytest.mark.scenario("2 Redis restart during a storm (SIGKILL)")
def test_redis_restart_during_a_storm_loses_no_event(
    private_redis: PrivateRedis, pg_url: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    total = scale(2000, 10000)
    rate = scale(300, 1000)  # events/s: the storm lasts ~7 s (ci) or ~10 s (full), held half-way (below)
    opens = [f"gpu-node-{i}" for i in range(6)]
    prefix, tag = "rel-redis", f"storm-{time.monotonic_ns()}"
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    for node in opens:  # really failed, so the live check before the first action confirms them
        world.set_slurm(node, flags=["FAIL"], reason=SOFTWARE_FAULT, user="researcher")
    # A VM restart call takes 2 s, so Redis can be killed while a worker holds an unacknowledged task.
    env = worker_env(pg_url, private_redis.url, prefix, tmp_path, REMEDIATION_MEMORY__CALL_DELAY_S='{"vm.start": 2}')
    client = redis.Redis.from_url(private_redis.url, socket_connect_timeout=1, socket_timeout=5)
    app = make_app(load_settings(broker={"redis_url": private_redis.url, "key_prefix": prefix}))
    bus = RedisEventBus(client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
    db = create_engine(pg_url, poolclass=NullPool)
    scenario_figures.count_in(db)
    workers = [Worker(env, tmp_path, concurrency=3), Worker(env, tmp_path, concurrency=3, beat=False)]
    events = storm_events(tag, total, opens)
    publisher = Publisher(bus, events, rate, hold_at=total // 2)
    try:
        wait_for(lambda: all(w.ready() for w in workers), 60, "the workers to consume", workers[0])
        publisher.start()

        waiting = [0]  # events Redis acknowledged that Postgres did not hold, at the last look

        def mid_storm_and_mid_step() -> bool:
            assert publisher.error is None, repr(publisher.error)
            assert publisher.observed < total, "the storm ended before a workflow step was in flight"
            if publisher.observed < total // 2:
                return False
            if not publisher.go.is_set():  # held half-way: it goes on once a restart is under way
                if restarts_begun(db, timedelta(seconds=1)):
                    publisher.go.set()
                return False
            waiting[0] = publisher.published - keys_recorded(db, tag)
            return waiting[0] >= 1 and bool(restarts_begun(db, timedelta(seconds=1)))  # last: the kill follows

        wait_for(mid_storm_and_mid_step, 90, "half of the storm with a machine restart just begun")
        private_redis.kill()  # mid-storm, mid-batch (some XADDs of a pipeline may have landed), mid-step
        killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
        # What was in flight at the kill: the steps the workers' own rows say started before it and ended
        # after it or not yet (read now, and again later: a step's end is recorded when it comes), and
        # the events Redis had acknowledged that Postgres did not hold at the look just before the kill
        # (a worker may still record some it had read: they were in its hands, unacked).
        steps_at_kill = steps_spanning(db, killed_wall)
        killed_at_event = publisher.observed
        unrecorded_at_kill = waiting[0]
        assert steps_at_kill, "no workflow step was in flight when Redis was killed"
        assert unrecorded_at_kill >= 1, "no published event was waiting to be recorded when Redis was killed"
        # Redis stays down until the outage was felt on both sides: the publisher was refused, and every
        # worker lost its broker connection.
        def broker_errors(w: Worker) -> int:
            out = w.output()
            return out.count("Connection to broker lost") + out.count("consumer: Cannot connect to")

        lost_before = [broker_errors(w) for w in workers]
        wait_for(lambda: publisher.refusals > 0 and all(
            broker_errors(w) > n for w, n in zip(workers, lost_before, strict=True)),
            30, "the publisher and every worker to find Redis down", workers[1])
        up_at = private_redis.start()
        seen_at_restart = publisher.observed  # everything the watchers saw up to Redis coming back

        def backlog_recorded() -> bool:
            crashed = [w.output()[-3000:] for w in workers
                       if w.proc.poll() is not None or "Unrecoverable error" in w.output()]
            assert not crashed, "a worker died on the Redis restart:\n" + "\n".join(crashed)
            return publisher.error is not None or keys_recorded(db, tag, below=seen_at_restart) == seen_at_restart

        wait_for(backlog_recorded, 60, "the backlog of the outage to be recorded", workers[0])
        recovery = time.monotonic() - up_at
        publisher.join(budget(60))
        assert publisher.error is None, repr(publisher.error)
        wait_for(lambda: keys_recorded(db, tag) == total, 60, "every event to be recorded", workers[0])
        drained = time.monotonic() - up_at
        wait_for(lambda: client.xlen(f"{prefix}:events") == 0, 30, "the stream to be empty", workers[0])
        try:
            wait_for(lambda: all(statuses(db).get(n) == "succeeded" for n in opens), 60,
                     "the storm's real failures to be remediated", workers[0])
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe(db)}") from None
    finally:
        publisher.join(5)
        for w in workers:
            w.stop()
    recorded = keys_recorded(db, tag)
    with Session(db) as s:
        rejected = s.scalar(select(func.count()).select_from(RejectedEvent)) or 0
        opened = s.scalar(select(func.count()).select_from(Remediation)) or 0
    pending = client.xpending(f"{prefix}:events", GROUP)["pending"]
    dups = duplicate_effects(world)
    lost = scenario_figures.record(
        db=db, duplicate_actions=sum(dups.values()), recovery_s=round(recovery, 2),
        notes=(f"{total} events at {rate}/s, SIGKILL at event {killed_at_event} with {len(steps_at_kill)} "
               f"step(s) and {unrecorded_at_kill} published event(s) not yet recorded in flight, down "
               f"{up_at - killed_at:.1f}s, {seen_at_restart} seen by then; publisher refused "
               f"{publisher.refusals}x; all {total} recorded {drained:.1f}s after restart"),
        extra={"published": publisher.published, "recorded": recorded, "rejected": rejected,
               "remediations": opened},
    )
    assert publisher.refusals > 0, "Redis was not down while the storm was being published"
    assert lost == 0, f"{lost} of {len(scenario_figures.published)} published events lost"
    assert recorded == publisher.published == total
    assert rejected == 0 and pending == 0
    assert opened == len(opens), "each real failure opened exactly one remediation"
    assert not dups, dups
    db.dispose()
    client.close()


# ---------------------------------------------------------------------- scenario 3: Postgres restart


def postgres_env(db_url: str, redis_prefix: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Workers for six nodes whose VM restarts take long enough (~8 polls, ~2.5 s) to be mid-operation."""
    return worker_env(
        db_url, REDIS_URL, redis_prefix, tmp_path,
        REMEDIATION_MEMORY__NODES="gpu-node-[0-5]",
        REMEDIATION_MEMORY__OP_POLLS="8",
        REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0",  # six of six at once is the test, not a storm
        REMEDIATION_POLICY__MAX_CONCURRENT="6",
        **extra,
    )


def steps_now(db: Engine) -> dict[str, str]:
    with Session(db) as s:
        return {node: v for node, v in s.execute(select(Remediation.node, Remediation.step))}


def mid_workflow(db: Engine, bus: RedisEventBus, worker: Worker, world: MemoryWorld,
                 nodes: list[str]) -> dict[str, str]:
    """Open a first wave and wait until one of its VM operations is in flight, then open a second wave:
    returns where each remediation stands (steps from the drain to the VM restart in flight)."""

    def vm_op_recorded() -> bool:
        with Session(db) as s:
            return bool(s.scalar(select(func.count()).where(RemediationStep.step == "vm_restart",
                                                             RemediationStep.provider_op.is_not(None))))

    bus.publish([fail_event(n, world) for n in nodes[:3]])
    wait_for(vm_op_recorded, 60, "a VM operation to be in flight", worker)
    bus.publish([fail_event(n, world) for n in nodes[3:]])
    wait_for(lambda: len(steps_now(db)) == len(nodes), 30, "the second wave to open", worker)
    return steps_now(db)


def wait_for_a_failed_sweep(worker: Worker) -> None:
    """The outage lasts until the workers provably hit the dead server: a sweep fails on it."""
    failed_sweeps = worker.output().count("remediation.sweep[")
    wait_for(lambda: worker.output().count("remediation.sweep[") > failed_sweeps + 1, 30,
             "a sweep to run against the dead server", worker)


def assert_each_action_once(db: Engine, world: MemoryWorld, nodes: list[str], figures: Recorder,
                            recovery: float, notes: str, in_flight: dict[str, str]) -> None:
    """Record the figures, then: nothing lost, every remediation succeeded, each action exactly once,
    no step run twice and no step row left started."""
    effective = Counter((c["op"], c["node"]) for c in world.calls(effect=True))
    dups = duplicate_effects(world)
    with Session(db) as s:
        rows = s.scalars(select(RemediationStep)).all()
        orphans = [r for r in rows if r.status in ("started", "waiting")]
        final = {node: v for node, v in s.execute(select(Remediation.node, Remediation.status))}
    per_key = Counter(r.idempotency_key for r in rows)
    repeated_rows = {k: n for k, n in per_key.items() if n > 1}
    per_step = Counter((r.remediation_id, r.step) for r in rows)
    rerun_steps = {k: n for k, n in per_step.items() if n > 1}
    lost = figures.record(
        db=db, duplicate_actions=sum(dups.values()), recovery_s=round(recovery, 2), notes=notes,
        extra={"in_flight": in_flight, "orphans": len(orphans), "step_rows": len(rows)},
    )
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert final == dict.fromkeys(nodes, "succeeded"), final
    for node in nodes:
        for op in ("slurm.drain", "k8s.cordon", "vm.restart", "slurm.resume"):
            assert effective[(op, node)] == 1, (op, node, effective)
    assert not dups, dups
    assert not repeated_rows and not rerun_steps, (repeated_rows, rerun_steps)
    assert not orphans, [(r.remediation_id, r.step, r.status) for r in orphans]


def outage_mid_workflow(db_url: str, redis_prefix: str, tmp_path: Path, figures: Recorder,
                        stop: Callable[[], None], restore: Callable[[], float],
                        describe_outage: Callable[[dict[str, str], float, float, int], str], **env: str) -> None:
    """Six remediations, the database stopped (``stop``) with steps in flight, and brought back
    (``restore``, returning when it took writes) once a sweep failed on it; then every remediation
    must complete with each action exactly once. ``describe_outage(in_flight, down_at, up_at,
    succeeded)`` writes the row's notes; ``succeeded`` is how many remediations the recovery saw succeed."""
    nodes = [f"gpu-node-{i}" for i in range(6)]
    world = MemoryWorld(nodes=nodes, journal=tmp_path / "world.json")
    client = redis.Redis.from_url(REDIS_URL)
    app = make_app(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    bus = RedisEventBus(client, redis_prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
    db = create_engine(db_url, poolclass=NullPool)
    figures.count_in(db)
    worker = Worker(postgres_env(db_url, redis_prefix, tmp_path, **env), tmp_path, concurrency=4)
    try:
        in_flight = mid_workflow(db, bus, worker, world, nodes)
        stop()
        down_at = time.monotonic()
        wait_for_a_failed_sweep(worker)
        up_at = restore()
        wait_for(lambda: set(statuses(db).values()) == {"succeeded"} and len(statuses(db)) == len(nodes),
                 90, "every remediation to complete", worker)
        recovery = time.monotonic() - up_at
        succeeded = list(statuses(db).values()).count("succeeded")
        settled([worker], client, redis_prefix)  # a late duplicate (a retried task, a sweep) had its chance
    finally:
        worker.stop()
    assert_each_action_once(db, world, nodes, figures, recovery, describe_outage(in_flight, down_at, up_at, succeeded),
                            in_flight)
    db.dispose()
    client.close()


@pytest.mark.scenario("3 Postgres restart mid-workflow (immediate)")
def test_postgres_restart_mid_workflow_resumes_every_remediation_once(
    private_pg: PrivateCluster, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    outage_mid_workflow(
        private_pg.url, redis_prefix, tmp_path, scenario_figures, private_pg.crash, private_pg.start,
        lambda in_flight, down_at, up_at, succeeded: (
            f"pg_ctl -m immediate with steps in flight {sorted(Counter(in_flight.values()).items())}; "
            f"down {up_at - down_at:.1f}s; recovery = server up to all {succeeded} succeeded"),
    )
