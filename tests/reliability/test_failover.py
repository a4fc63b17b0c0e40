"""Past one machine: Redis under Sentinel and Postgres with a streaming replica lose over, mid-run.

Every server here is real and private to the test, on free ports in a temporary directory
(:mod:`tests.haproc`): Debian's redis-server and redis-sentinel, and Postgres's own binaries. The
workers, watchers and API replicas are real processes pointed at the sentinels
(``broker.sentinel``) and at a multi-host Postgres URL with ``target_session_attrs=read-write``.

- **Redis failover mid-storm**: 2,000 events at 300/s while remediations run; the primary is SIGKILLed
  half-way, the sentinels promote the replica, and the old primary comes back as a replica of the new
  one (as a restarted pod that asks the sentinels would). Publishers run with ``broker.replica_acks=1``:
  an event counts as published only once a replica holds it. Once with one worker and one API, once
  with three workers and two API replicas: the same figures.
- **A paused leader during a failover**: the leading Slurm watcher is SIGSTOPped past its lease while
  the Redis primary is killed; the standby takes over; the old leader is let go. Counted at ingest,
  from the stream itself: no event published under the replaced leadership was recorded.
- **Postgres failover mid-workflow**: the primary is stopped with ``-m immediate`` while VM restarts
  are in flight and the replica is promoted: every remediation completes, each action exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.factory import redis_client
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Event, LeaderFence, RejectedEvent, Remediation
from remediation.domain.events import NodeEvent
from remediation.settings import load_settings
from tests.haproc import MASTER, SentinelSet, StandbyPair
from tests.infra import missing
from tests.integration.apiproc import ApiProcess, base_env
from tests.integration.workerproc import ROOT, Worker, settled, wait_for, worker_env
from tests.ports import free_port
from tests.redisproc import RedisMissing
from tests.reliability.conftest import Recorder, scale
from tests.reliability.test_restarts import (
    Publisher,
    describe,
    duplicate_effects,
    keys_recorded,
    outage_mid_workflow,
    statuses,
    steps_in_flight,
    storm_events,
)
from workers.celery_app import make_app

ADMIN_TOKEN = "failover-test-admin-token-0123456789abcdef"


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    try:
        cluster = SentinelSet(tmp_path / "redis")
    except RedisMissing:
        missing("redis-server and redis-sentinel")
    yield cluster
    cluster.stop()


def sentinel_env(cluster: SentinelSet) -> dict[str, str]:
    """What points a process at the sentinels: the URL keeps only the database (its host is not used)."""
    return {
        "REMEDIATION_BROKER__REDIS_URL": "redis://sentinel-named-primary/0",
        "REMEDIATION_BROKER__SENTINEL__ADDRESSES": json.dumps(cluster.addresses),
        "REMEDIATION_BROKER__SENTINEL__MASTER": MASTER,
        "REMEDIATION_BROKER__REPLICA_ACKS": "1",
    }


def sentinel_settings(cluster: SentinelSet, prefix: str):  # type: ignore[no-untyped-def]
    return load_settings(broker={"redis_url": "redis://sentinel-named-primary/0", "key_prefix": prefix,
                                 "replica_acks": 1,
                                 "sentinel": {"addresses": cluster.addresses, "master": MASTER}})


def fail_over(cluster: SentinelSet) -> tuple[float, float]:
    """SIGKILL the primary; wait until a majority of sentinels name the replica; start the old primary
    again as the new one's replica and wait until it is online. Returns (failover s, rejoin s)."""
    old = cluster.primary_port()
    assert old is not None
    cluster.node(old).kill()
    killed = time.monotonic()
    wait_for(lambda: cluster.primary_port() not in (None, old), 30, "the sentinels to promote the replica")
    promoted = time.monotonic()
    new = cluster.primary_port()
    assert new is not None
    cluster.node(old).start(replica_of=new)
    wait_for(lambda: cluster.replicas_online(new) >= 1, 30, "the old primary to rejoin as a replica")
    return promoted - killed, time.monotonic() - promoted


def overview(api: ApiProcess) -> dict[str, object]:
    r = httpx.get(f"{api.url}/api/v1/overview", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


# ---------------------------------------------------------------------- Redis failover mid-storm


@pytest.mark.parametrize(
    ("n_workers", "n_apis"),
    [
        pytest.param(1, 1, marks=pytest.mark.scenario("Redis failover mid-storm (Sentinel, SIGKILL primary)"),
                     id="one-worker"),
        pytest.param(3, 2, marks=pytest.mark.scenario("Redis failover mid-storm, 3 workers + 2 API replicas"),
                     id="three-workers-two-apis"),
    ],
)
def test_redis_failover_mid_storm_loses_nothing(
    sentinels: SentinelSet, pg_url: str, tmp_path: Path, scenario_figures: Recorder, n_workers: int, n_apis: int
) -> None:
    total, rate = scale(2000, 10000), 300
    opens = [f"gpu-node-{i}" for i in range(6)]
    prefix, tag = f"ha-redis-{n_workers}", f"ha-storm-{time.monotonic_ns()}"
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    for node in opens:
        world.set_slurm(node, flags=["FAIL"], reason="xid 79", user="researcher")
    # A VM restart call takes 2 s, so the primary dies while a worker holds an unacknowledged step.
    env = worker_env(pg_url, "", prefix, tmp_path, **sentinel_env(sentinels),
                     REMEDIATION_MEMORY__CALL_DELAY_S='{"vm.start": 2}',
                     REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0", REMEDIATION_POLICY__MAX_CONCURRENT="6")
    settings = sentinel_settings(sentinels, prefix)
    client = redis_client(settings, 5.0)
    app = make_app(settings)
    bus = RedisEventBus(client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"),
                        replica_acks=1)
    db = create_engine(pg_url, poolclass=NullPool)
    scenario_figures.count_in(db)
    workers = [Worker(env, tmp_path, concurrency=2, beat=(i == 0)) for i in range(n_workers)]
    api_env = base_env(pg_url, **sentinel_env(sentinels), REMEDIATION_BROKER__KEY_PREFIX=prefix,
                       REMEDIATION_API__ADMIN_TOKENS=f'["{ADMIN_TOKEN}"]')
    apis = [ApiProcess(api_env, tmp_path / f"api-{i}.log") for i in range(n_apis)]
    publisher = Publisher(bus, storm_events(tag, total, opens), rate)
    try:
        for api in apis:
            api.wait_ready()
        wait_for(lambda: all(w.ready() for w in workers), 60, "the workers to consume", workers[0])
        publisher.start()

        def mid_storm_and_mid_step() -> bool:
            assert publisher.error is None, repr(publisher.error)
            assert publisher.observed < total, "the storm ended before a workflow step was in flight"
            return publisher.observed >= total // 2 and bool(steps_in_flight(db))

        wait_for(mid_storm_and_mid_step, 60, "half of the storm with a workflow step in flight")
        killed_at_event, published_at_kill = publisher.observed, publisher.published
        steps_at_kill = len(steps_in_flight(db))
        failover_s, rejoin_s = fail_over(sentinels)
        up_at = time.monotonic() - rejoin_s - failover_s  # the moment of the kill
        seen = publisher.observed
        wait_for(lambda: publisher.error is not None or keys_recorded(db, tag, below=seen) == seen, 60,
                 "everything seen by the rejoin to be recorded", workers[0])
        recovery = time.monotonic() - up_at
        publisher.join(60)
        assert publisher.error is None, repr(publisher.error)
        wait_for(lambda: keys_recorded(db, tag) == total, 60, "every event to be recorded", workers[0])
        try:
            wait_for(lambda: all(statuses(db).get(n) == "succeeded" for n in opens), 90,
                     "the storm's real failures to be remediated", workers[0])
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe(db)}") from None
        primary = redis.Redis(port=sentinels.primary_port() or 0)
        settled(workers, primary, prefix)
        views = [overview(api) for api in apis]  # every replica answers, from the one database
    finally:
        publisher.join(5)
        for w in workers:
            w.stop()
        for api in apis:
            api.stop()
    recorded = keys_recorded(db, tag)
    with Session(db) as s:
        opened = s.scalar(select(func.count()).select_from(Remediation)) or 0
    dups = duplicate_effects(world)
    lost = scenario_figures.record(
        db=db, duplicate_actions=sum(dups.values()), recovery_s=round(recovery, 2),
        notes=(f"{total} events at {rate}/s, {n_workers} worker(s) and {n_apis} API replica(s); primary "
               f"SIGKILLed at event {killed_at_event} ({published_at_kill} confirmed by a replica) with "
               f"{steps_at_kill} step(s) in flight; sentinels promoted the replica in {failover_s:.1f}s, the "
               f"old primary was a replica again {rejoin_s:.1f}s later; publisher held its outbox "
               f"{publisher.refusals}x; recovery = kill to all seen by the rejoin recorded"),
        extra={"published": publisher.published, "recorded": recorded, "remediations": opened},
    )
    assert lost == 0, f"{lost} published events lost"
    assert recorded == publisher.published == total
    assert opened == len(opens), "each real failure opened exactly one remediation"
    assert not dups, dups
    assert all(v["remediations_by_status"] == views[0]["remediations_by_status"] for v in views), views
    db.dispose()


# -------------------------------------------------------------- a paused leader during a failover


class WatcherProc:
    """``python -m watchers.slurm`` on the simulated cluster's journal, with its health endpoint."""

    def __init__(self, env: dict[str, str], tmp: Path, name: str) -> None:
        self.port = free_port()
        self.log = tmp / f"{name}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "watchers.slurm"], cwd=ROOT,
                                     env=env | {"REMEDIATION_HEALTH__PORT": str(self.port)},
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def role(self) -> str | None:
        try:
            body = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None
        return str(body.get("role"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.mark.scenario("Leader paused past its lease while Redis fails over")
def test_a_paused_leader_publishes_nothing_that_counts(
    sentinels: SentinelSet, pg_url: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    prefix = "ha-leader"
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    env = worker_env(pg_url, "", prefix, tmp_path, **sentinel_env(sentinels),
                     REMEDIATION_BROKER__STREAM_MAX_LEN="100000",  # keep the stream: the count reads it
                     REMEDIATION_SLURM__POLL_INTERVAL_S="0.25",
                     # Each read of the simulated Slurm is marked and then takes half a second before
                     # the watcher can publish what it read: the window in which the leader is paused.
                     REMEDIATION_MEMORY__CALL_DELAY_S='{"slurm.list_nodes": 0.5}')
    db = create_engine(pg_url, poolclass=NullPool)
    worker = Worker(env, tmp_path, concurrency=2)
    first = WatcherProc(env, tmp_path, "watcher-1")
    second: WatcherProc | None = None
    try:
        wait_for(lambda: first.role() == "leader", 30, "the first watcher to lead", first)
        second = WatcherProc(env, tmp_path, "watcher-2")
        wait_for(lambda: second.role() == "standby", 30, "the second watcher to stand by", second)
        world.set_slurm("gpu-node-1", flags=["FAIL"], reason="xid 79", user="researcher")
        wait_for(lambda: "gpu-node-1" in statuses(db), 30, "the leader's event to open a remediation", worker)
        # A new fault; the leader is paused right after it read it, before it could publish it.
        world.set_slurm("gpu-node-2", flags=["FAIL"], reason="xid 79", user="researcher")
        changed = time.time()
        wait_for(lambda: any(c["pid"] == first.proc.pid and c["at"] > changed
                             for c in world.calls("slurm.list_nodes")), 10, "the leader to read the fault", first)
        os.killpg(first.proc.pid, signal.SIGSTOP)  # paused, lock, token, read and all, past its lease
        paused_at = time.monotonic()
        failover_s, rejoin_s = fail_over(sentinels)
        wait_for(lambda: second.role() == "leader", 40, "the standby to take over", second)
        took_over = time.monotonic() - paused_at
        wait_for(lambda: "gpu-node-2" in statuses(db), 30, "the new leader's event to be recorded", worker)
        # The old leader wakes with the fault in hand and its old token, believing it still leads.
        os.killpg(first.proc.pid, signal.SIGCONT)
        wait_for(lambda: first.role() == "standby" and "lost the leader lock" in first.output(), 30,
                 "the woken leader to find its lock gone", first)
        primary = redis.Redis(port=sentinels.primary_port() or 0)
        wait_for(lambda: primary.xinfo_groups(f"{prefix}:events")[0]["lag"] == 0
                 and primary.xinfo_groups(f"{prefix}:events")[0]["pending"] == 0, 30,
                 "the ingest to have read and acknowledged the whole stream", worker)
        entries = primary.xrange(f"{prefix}:events")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        worker.stop()
    # Counted from the stream itself, in its order: an entry whose token is below a token published
    # earlier came from a replaced leader.
    highest, stale, tokens = 0, [], Counter[int]()
    for _id, fields in entries:
        event = NodeEvent.parse(fields[b"e"])
        assert event.fence is not None and event.fence.lock == "slurm", event
        tokens[event.fence.token] += 1
        if event.fence.token < highest:
            stale.append(fields[b"e"].decode())
        highest = max(highest, event.fence.token)
    with Session(db) as s:
        rejected = set(s.scalars(select(RejectedEvent.payload)))
        fence = s.get(LeaderFence, "slurm")
        recorded_keys = set(s.scalars(select(Event.dedupe_key)))
    accepted_stale = [p for p in stale if p not in rejected]
    assert fence is not None and fence.token == highest
    scenario_figures.record(
        notes=(f"leader SIGSTOPped, primary SIGKILLed: sentinels promoted in {failover_s:.1f}s, old primary "
               f"a replica again {rejoin_s:.1f}s later, standby led {took_over:.1f}s after the pause; "
               f"tokens {sorted(tokens)}; {len(stale)} event(s) published under the replaced leadership, "
               f"{len(accepted_stale)} of them recorded, {fence.fenced} fenced at ingest"),
        extra={"tokens": dict(tokens), "stale": len(stale), "fenced": fence.fenced},
    )
    assert len(tokens) == 2, f"two holdings, two tokens: {tokens}"
    assert not accepted_stale, accepted_stale
    assert len(stale) >= 1, "the woken leader published nothing: the fence was not put to the test"
    assert fence.fenced == len(stale)
    assert any(k for k in recorded_keys if "gpu-node-2" in k), "the new leader's event was recorded"
    db.dispose()


# ------------------------------------------------------------------ Postgres failover mid-workflow


@pytest.fixture
def standby_pair() -> Iterator[StandbyPair]:
    pair = StandbyPair()
    try:
        yield pair
    finally:
        pair.destroy()


@pytest.mark.scenario("Postgres failover mid-workflow (immediate stop, promote)")
def test_postgres_failover_mid_workflow_completes_every_remediation_once(
    standby_pair: StandbyPair, redis_prefix: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    """The workers and the test read and write through the same two-host URL; the replica is promoted
    once a sweep failed on the lost primary."""
    outage_mid_workflow(
        standby_pair.url, redis_prefix, tmp_path, scenario_figures, standby_pair.crash_primary,
        standby_pair.promote,
        lambda in_flight, down_at, up_at: (
            f"pg_ctl -m immediate on the primary with steps in flight "
            f"{sorted(Counter(in_flight.values()).items())}; replica promoted {up_at - down_at:.1f}s later; "
            f"synchronous replication; recovery = promotion to all 6 succeeded"),
        REMEDIATION_DATABASE__CONNECT_TIMEOUT_S="2",
    )
