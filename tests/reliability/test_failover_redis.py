"""Redis under Sentinel loses its primary mid-storm, and nothing published is lost.

A real primary, replica and three sentinels (:class:`tests.haproc.SentinelSet`); real workers and API
replicas pointed at the sentinels (``broker.sentinel``) with ``broker.replica_acks=1``: an event
counts as published only once a replica holds it. 2,000 events at 300/s (10,000 in a full run),
held half-way until a worker has a step in flight, while remediations run; the primary is SIGKILLed
as the storm goes on, the sentinels promote the replica, and the old primary comes back as a replica
of the new one (as a restarted pod that asks the sentinels would). Once with one worker and one API,
once with three workers and two API replicas: the same figures.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.factory import make_bus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Remediation
from tests.haproc import SentinelSet, fail_over, sentinel_env, sentinel_settings
from tests.integration.apiproc import ApiProcess, base_env
from tests.integration.workerproc import Worker, settled, wait_for, worker_env
from tests.pace import budget
from tests.reliability.conftest import Recorder, scale
from tests.reliability.test_restarts import (
    Publisher,
    describe,
    duplicate_effects,
    keys_recorded,
    statuses,
    steps_in_flight,
    storm_events,
)

ADMIN_TOKEN = "failover-test-admin-token-0123456789abcdef"


def overview(api: ApiProcess) -> dict[str, object]:
    r = httpx.get(
        f"{api.url}/api/v1/overview", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.parametrize(
    ("n_workers", "n_apis"),
    [
        pytest.param(
            1,
            1,
            marks=pytest.mark.scenario("Redis failover mid-storm (SIGKILL the primary)"),
            id="one-worker",
        ),
        pytest.param(
            3,
            2,
            marks=pytest.mark.scenario("Redis failover mid-storm, 3 workers + 2 APIs"),
            id="three-workers-two-apis",
        ),
    ],
)
def test_redis_failover_mid_storm_loses_nothing(
    sentinels: SentinelSet,
    pg_url: str,
    tmp_path: Path,
    scenario_figures: Recorder,
    n_workers: int,
    n_apis: int,
) -> None:
    total, rate = scale(2000, 10000), 300  # held half-way until a step is in flight (below)
    opens = [f"gpu-node-{i}" for i in range(6)]
    prefix, tag = f"ha-redis-{n_workers}", f"ha-storm-{time.monotonic_ns()}"
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    for node in opens:
        world.set_slurm(node, flags=["FAIL"], reason="xid 79", user="researcher")
    # A VM restart call takes 2 s, so the primary dies while a worker holds an unacknowledged step.
    env = worker_env(
        pg_url,
        "",
        prefix,
        tmp_path,
        **sentinel_env(sentinels),
        REMEDIATION_MEMORY__CALL_DELAY_S='{"vm.start": 2}',
        REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0",
        REMEDIATION_POLICY__MAX_CONCURRENT="6",
    )
    # Published as a watcher publishes (make_bus: through the sentinels, waiting for a replica, no kick):
    # the workers' kick relay, which follows the failover too, starts the ingest.
    bus = make_bus(sentinel_settings(sentinels, prefix))
    db = create_engine(pg_url, poolclass=NullPool)
    scenario_figures.count_in(db)
    workers = [Worker(env, tmp_path, concurrency=2, beat=(i == 0)) for i in range(n_workers)]
    api_env = base_env(
        pg_url,
        **sentinel_env(sentinels),
        REMEDIATION_BROKER__KEY_PREFIX=prefix,
        REMEDIATION_API__ADMIN_TOKENS=f'["{ADMIN_TOKEN}"]',
    )
    apis = [ApiProcess(api_env, tmp_path / f"api-{i}.log") for i in range(n_apis)]
    publisher = Publisher(bus, storm_events(tag, total, opens), rate, hold_at=total // 2)
    try:
        for api in apis:
            api.wait_ready()
        wait_for(lambda: all(w.ready() for w in workers), 60, "the workers to consume", workers[0])
        publisher.start()

        looked: list[set[int]] = [set()]  # the step rows in flight at the last look before the kill

        def mid_storm_and_mid_step() -> bool:
            assert publisher.error is None, repr(publisher.error)
            assert publisher.observed < total, "the storm ended before a workflow step was in flight"
            looked[0] = steps_in_flight(db)
            return publisher.observed >= total // 2 and bool(looked[0])

        wait_for(mid_storm_and_mid_step, 90, "half of the storm with a workflow step in flight")
        publisher.go.set()  # the storm goes on, and the kill lands in it
        killed_at_event, published_at_kill, steps_at_kill = publisher.observed, publisher.published, len(looked[0])
        killed_at = time.monotonic()  # fail_over's first act is the SIGKILL
        failover_s, rejoin_s = fail_over(sentinels)
        seen = publisher.observed
        wait_for(
            lambda: publisher.error is not None or keys_recorded(db, tag, below=seen) == seen,
            60,
            "everything seen by the rejoin to be recorded",
            workers[0],
        )
        recovery = time.monotonic() - killed_at
        publisher.join(budget(60))
        assert publisher.error is None, repr(publisher.error)
        wait_for(lambda: keys_recorded(db, tag) == total, 60, "every event to be recorded", workers[0])
        try:
            wait_for(
                lambda: all(statuses(db).get(n) == "succeeded" for n in opens),
                90,
                "the storm's real failures to be remediated",
                workers[0],
            )
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
        db=db,
        duplicate_actions=sum(dups.values()),
        recovery_s=round(recovery, 2),
        notes=(
            f"{total} events at {rate}/s, {n_workers} worker(s) and {n_apis} API replica(s); primary "
            f"SIGKILLed at event {killed_at_event} ({published_at_kill} confirmed by a replica) with "
            f"{steps_at_kill} step(s) in flight at the last look; sentinels promoted the replica in {failover_s:.1f}s, the "
            f"old primary was a replica again {rejoin_s:.1f}s later; publisher held its outbox "
            f"{publisher.refusals}x; recovery = kill to all seen by the rejoin recorded"
        ),
        extra={"published": publisher.published, "recorded": recorded, "remediations": opened},
    )
    assert lost == 0, f"{lost} published events lost"
    assert recorded == publisher.published == total
    assert opened == len(opens), "each real failure opened exactly one remediation"
    assert not dups, dups
    assert all(v["remediations_by_status"] == views[0]["remediations_by_status"] for v in views), views
    db.dispose()
