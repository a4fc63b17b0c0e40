"""Ingest throughput under production durability: publish a storm, wait until every event is decided.

Real servers end to end. The benchmark starts **its own redis-server** for each persistence setting it
measures, so the figure is the one production gets:

- ``durable``: ``appendonly yes`` + ``appendfsync always``, what docs/architecture.md requires (an event
  Redis acknowledged survives a crash);
- ``volatile``: no persistence, printed beside it with the ratio, to show what durability costs.

Events are published the way the watchers publish them: whatever one poll or watch burst produced goes
as one pipelined batch (``--batch`` events; with ``--rate``, the events due in each 10 ms tick). One real
Celery worker process with ``--workers`` prefork pool processes drains the stream and records and decides
every event in Postgres (a fresh database per run). Workflow tasks the decisions open are queued, not
run: this measures the ingest path.

    .venv/bin/python -m bench.ingest_throughput [--events 10000] [--nodes 2000] [--rate 1000] \
        [--batch 100] [--redis durable,volatile]

Latency is published_at -> received_at per event (thousands of samples; a p99 from fewer than 200 is
printed as "max").
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from bench.common import percentile, scratch_database, scratch_dir, tail
from remediation.adapters.bus import RedisEventBus
from remediation.db.models import Event
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from remediation.workers.celery_app import make_app
from tests.integration.workerproc import Worker, wait_for, worker_env
from tests.redisproc import PrivateRedis

STATES = [("FAIL", "xid 79"), ("DOWN", "Not responding"), ("DRAIN", "ecc errors"), ("DRAIN", "maintenance: fw")]
TICK_S = 0.01


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


@dataclass
class Run:
    persistence: str
    redis_config: str
    events: int
    publish_s: float
    total_s: float
    latencies_ms: list[float]
    decisions: dict[str, int]

    @property
    def publish_rate(self) -> float:
        return self.events / self.publish_s

    @property
    def end_to_end(self) -> float:
        return self.events / self.total_s


def batches(events: list[NodeEvent], args: argparse.Namespace) -> list[tuple[float, list[NodeEvent]]]:
    """(seconds after the start, events) for each publish call."""
    if args.rate:
        per_tick = max(1, round(args.rate * TICK_S))
        return [(i / args.rate, events[i:i + per_tick]) for i in range(0, len(events), per_tick)]
    return [(0.0, events[i:i + args.batch]) for i in range(0, len(events), args.batch)]


def run_once(persistence: str, events: list[NodeEvent], args: argparse.Namespace) -> Run:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    with scratch_dir() as tmp, scratch_database() as url:
        server = PrivateRedis(tmp, persistence)
        server.start()
        client = redis.Redis.from_url(server.url)
        config = f"appendonly {server.config('appendonly')}, appendfsync {server.config('appendfsync')}"
        env = worker_env(url, server.url, prefix, tmp, REMEDIATION_DATABASE__POOL_SIZE="2")
        worker = Worker(env, tmp, concurrency=args.workers, queues="ingest", beat=False)
        app = make_app(load_settings(broker={"redis_url": server.url, "key_prefix": prefix}))
        bus = RedisEventBus(client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
        db = create_engine(url, poolclass=NullPool)
        try:
            wait_for(lambda: worker.ready(), 60, "the worker to start", worker)
            plan = batches(events, args)
            t0 = time.time()
            for at, batch in plan:
                delay = t0 + at - time.time()
                if delay > 0:
                    time.sleep(delay)
                now = datetime.now(UTC)
                bus.publish([ev.model_copy(update={"published_at": now}) for ev in batch])
            t_pub = time.time()

            def decided() -> int:
                with Session(db) as s:
                    return s.scalar(select(func.count()).select_from(Event).where(Event.decision != "")) or 0

            wait_for(lambda: decided() >= len(events), 600, "all events decided", worker)
            t_done = time.time()
            with Session(db) as s:
                rows = s.execute(select(Event.published_at, Event.received_at, Event.decision)).all()
        finally:
            worker.stop()
            db.dispose()
            server.close()
    decisions: dict[str, int] = {}
    for *_x, d in rows:
        decisions[d] = decisions.get(d, 0) + 1
    return Run(persistence, config, len(rows), t_pub - t0, t_done - t0,
               [(r - p).total_seconds() * 1000 for p, r, _ in rows], decisions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2, help="prefork pool processes of the one worker")
    parser.add_argument("--rate", type=float, default=0,
                        help="Publish at this many events/s (0: as fast as possible, a burst)")
    parser.add_argument("--batch", type=int, default=100, help="events per publish in a burst (a watcher's flush)")
    parser.add_argument("--redis", default="durable,volatile", help="persistence settings to measure, in order")
    args = parser.parse_args()
    events = make_events(args.events, args.nodes)
    runs = [run_once(mode.strip(), events, args) for mode in args.redis.split(",") if mode.strip()]
    shape = f"at {args.rate:,.0f} events/s in 10 ms ticks" if args.rate else f"as a burst, {args.batch} per publish"
    print(f"{args.events:,} events over {args.nodes:,} nodes, published {shape}; 1 Celery worker process with "
          f"{args.workers} prefork pool processes (ingest queue); Postgres; a private redis-server per row")
    print(f"{'redis':<48} {'publish':>14} {'end to end':>14}  latency published -> recorded")
    for run in runs:
        lat = run.latencies_ms
        print(f"{run.persistence + ' (' + run.redis_config + ')':<48} {run.publish_rate:>10,.0f} e/s "
              f"{run.end_to_end:>10,.0f} e/s  p50 {percentile(lat, 50):,.0f} ms, {tail(lat, '{:,.0f}', ' ms')} "
              f"({len(lat):,} samples, {run.total_s:.2f} s)")
    by_mode = {run.persistence: run for run in runs}
    if "durable" in by_mode and "volatile" in by_mode:
        ratio = by_mode["durable"].end_to_end / by_mode["volatile"].end_to_end
        print(f"durable / volatile, end to end: {ratio:.2f}")
    for run in runs:
        print(f"decisions ({run.persistence}): {run.decisions}")


if __name__ == "__main__":
    main()
