"""Ingest throughput: publish 10,000 events, wait until every one is recorded and decided in Postgres.

Real servers end to end: events are published one by one (XADD + kick, as the watchers do) to Redis,
real Celery worker processes (2, the machine's core count) drain the stream in batches and record and
decide them in Postgres. Workflow tasks that the decisions open are queued but not run here: this
measures the ingest path. Prints events/s and p50/p99 ingest latency (published_at -> received_at).

    .venv/bin/python -m bench.ingest_throughput [--events 10000] [--nodes 2000] [--rate 1000]

Without --rate the 10,000 events arrive as one burst, faster than any consumer, so the latency figures
are mostly queueing; --rate 1000 shows the latency at the target sustained rate.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from datetime import UTC, datetime

import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from bench.common import REDIS_URL, percentile, scratch_database, scratch_dir
from remediation.db.models import Event
from remediation.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from tests.integration.workerproc import Worker, wait_for, worker_env
from workers.bus import RedisEventBus
from workers.celery_app import make_app

STATES = [("FAIL", "xid 79"), ("DOWN", "Not responding"), ("DRAIN", "ecc errors"), ("DRAIN", "maintenance: fw")]


def make_events(n: int, nodes: int) -> list[NodeEvent]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        node = f"gpu-node-{rng.randrange(nodes)}"
        if rng.random() < 0.6:
            state, reason = rng.choice(STATES)
            kind = EventKind.UNHEALTHY
        else:
            state, reason, kind = "IDLE", "", EventKind.HEALTHY
        out.append(NodeEvent(source=Source.SLURM, node=node, kind=kind, state=state, reason=reason,
                             observed_at=datetime.now(UTC), dedupe_key=f"bench:{i}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=0,
                        help="Publish at this many events/s (0: as fast as possible, a burst)")
    args = parser.parse_args()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    events = make_events(args.events, args.nodes)
    with scratch_database() as url, scratch_dir() as tmp:
        env = worker_env(url, REDIS_URL, prefix, tmp, REMEDIATION_DATABASE__POOL_SIZE="2")
        worker = Worker(env, tmp, concurrency=args.workers, queues="ingest", beat=False)
        app = make_app(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": prefix}))
        bus = RedisEventBus(client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
        db = create_engine(url, poolclass=NullPool)
        try:
            time.sleep(4)  # let the worker boot; its start-up is not part of the measurement
            t0 = time.time()
            for i, ev in enumerate(events):
                if args.rate:
                    delay = t0 + i / args.rate - time.time()
                    if delay > 0:
                        time.sleep(delay)
                bus.publish([ev.model_copy(update={"published_at": datetime.now(UTC)})])
            t_pub = time.time()

            def decided() -> int:
                with Session(db) as s:
                    return s.scalar(select(func.count()).select_from(Event).where(Event.decision != "")) or 0

            wait_for(lambda: decided() >= args.events, 600, "all events decided", worker)
            t_done = time.time()
            with Session(db) as s:
                rows = s.execute(select(Event.published_at, Event.received_at, Event.decision)).all()
        finally:
            worker.stop()
            db.dispose()
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
    lat = [(r - p).total_seconds() * 1000 for p, r, _ in rows]
    decisions: dict[str, int] = {}
    for *_x, d in rows:
        decisions[d] = decisions.get(d, 0) + 1
    print(f"events: {len(rows)} over {args.nodes} nodes, {args.workers} worker processes (Postgres + Redis)")
    print(f"publish rate: {args.events / (t_pub - t0):,.0f} events/s")
    print(f"end to end: {args.events / (t_done - t0):,.0f} events/s recorded and decided "
          f"({t_done - t0:.2f}s from first publish to last decision)")
    print(f"ingest latency (published -> recorded): p50 {percentile(lat, 50):.0f} ms, p99 {percentile(lat, 99):.0f} ms")
    print(f"decisions: {decisions}")


if __name__ == "__main__":
    main()
