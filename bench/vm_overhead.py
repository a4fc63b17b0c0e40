"""Orchestration overhead per remediation beyond the provider's own operation time.

``python -m bench.vm_overhead [--remediations 100] [--in-flight 10] [--workers 4] [--poll 0.2]``

Real Postgres (a scratch database), real Redis, a real Celery worker process pool, and the simulated
cluster (:class:`remediation.simulator.cluster.SimCluster`) with **zero-delay provider operations** (``op_seconds=0``)
and an instant reboot (``reboot_delay_s=0``): every second a remediation takes is ours. The workers run
the real adapters (slurmrestd REST, the kubernetes client, google-cloud-compute and azure-mgmt-compute
over HTTPS) against the local endpoints; half of the VMs are GCE, half Azure.

Each remediation is opened by a Slurm FAIL event on the Redis stream and runs all six steps (drain,
cordon, evict, restart, verify, return). Overhead = ``closed_at - opened_at`` (the service's own
records) minus the provider's operation time (the fakes' operation durations, zero here, plus the
reboot delay, also zero). ``--in-flight`` remediations (default: one per pool process) are kept open at once (a new node fails
as one closes), so throughput is measured without the storm breaker or max_concurrent capping it.
More in flight than pool processes measures queueing on the machine as well (figures: bench/RESULTS.md).

Waiting steps re-check every ``workflow.poll_interval_s`` (``--poll``): after ``vm_restart`` issues
the operation it polls once, and ``verify`` checks the Node and Slurm; so the poll interval is part of
the overhead, and it is printed with the figures. A few warm-up remediations run first, so that the
pool processes' one-off imports of the cloud SDKs (google-cloud-compute takes ~2 s) are not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime

import redis
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from bench.common import REDIS_URL, goal, percentile, scratch_database, scratch_dir, tail, tail_value
from remediation.adapters.bus import RedisEventBus
from remediation.clock import aware
from remediation.db.models import Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from remediation.simulator.cluster import SimCluster, Timing
from remediation.workers.celery_app import make_app
from tests.integration.workerproc import Worker, wait_for, worker_env


def _provider_seconds(cluster: SimCluster) -> dict[str, float]:
    """Per VM (k8s node name): the provider's own time, summed over its operations, plus the reboot."""
    out: dict[str, float] = {}
    for op in list(cluster.gce._ops.values()):
        out[op.instance] = out.get(op.instance, 0.0) + op.duration + cluster.reboot_delay_s
    for op in list(cluster.azure._ops.values()):
        name = op.key[-1]
        out[name] = out.get(name, 0.0) + op.duration + cluster.reboot_delay_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--remediations", type=int, default=100)
    parser.add_argument(
        "--in-flight", type=int, default=0, help="remediations open at once (default: --workers)"
    )
    parser.add_argument("--workers", type=int, default=4, help="Celery pool processes")
    parser.add_argument("--poll", type=float, default=0.2, help="workflow.poll_interval_s")
    parser.add_argument("--warmup", type=int, default=0, help="warm-up remediations (default 3 per process)")
    args = parser.parse_args()

    args.in_flight = args.in_flight or args.workers
    args.warmup = args.warmup or 3 * args.workers  # every pool process imports both cloud SDKs first
    total = args.remediations + args.warmup
    prefix = f"bench-vm-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    with (
        scratch_database() as pg_url,
        scratch_dir() as tmp,
        SimCluster(
            total, timing=Timing(op_seconds=0.0, reboot_delay_s=0.0, tick_s=0.02, not_responding_after_s=0.3)
        ) as cluster,
    ):
        env = worker_env(
            pg_url, REDIS_URL, prefix, tmp, **cluster.settings_overrides(),
            REMEDIATION_WORKFLOW__POLL_INTERVAL_S=f"{args.poll:g}",
            REMEDIATION_WORKFLOW__LEASE_S="60", REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S="5",
            REMEDIATION_POLICY__MAX_CONCURRENT=str(max(args.in_flight, 1)),
            REMEDIATION_POLICY__MIN_RESTART_GAP_S="0", REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0",
        )  # fmt: skip
        settings = load_settings(broker={"redis_url": REDIS_URL, "key_prefix": prefix})
        app = make_app(settings)
        bus = RedisEventBus(client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
        db = create_engine(pg_url, poolclass=NullPool)
        worker = Worker(env, tmp, concurrency=args.workers)

        def fail(node: str) -> None:
            cluster.researcher_fail(node, "xid 79: GPU fell off the bus")
            bus.publish(
                [
                    NodeEvent(
                        source=Source.SLURM,
                        node=node,
                        kind=EventKind.UNHEALTHY,
                        state="FAIL",
                        reason="xid 79: GPU fell off the bus",
                        observed_at=datetime.now(UTC),
                    )
                ]
            )

        def closed() -> dict[str, Remediation]:
            with Session(db) as s:
                return {
                    r.node: r
                    for r in s.scalars(select(Remediation).where(Remediation.closed_at.is_not(None)))
                }

        try:
            warm = cluster.names[args.remediations :]
            for node in warm:
                fail(node)
            wait_for(lambda: len(closed()) >= len(warm), 120, "the warm-up remediations", worker)
            nodes = cluster.names[: args.remediations]
            pending, started = list(nodes), time.monotonic()
            open_now: set[str] = set()
            while pending or open_now:
                done = closed()
                open_now -= done.keys()
                while pending and len(open_now) < args.in_flight:
                    node = pending.pop(0)
                    open_now.add(node)
                    fail(node)
                if time.monotonic() - started > 600:
                    raise SystemExit(f"timed out with {len(open_now)} open: {sorted(open_now)[:5]}")
                time.sleep(0.05)
            wall = time.monotonic() - started
            done = closed()
            with Session(db) as s:
                ids = [done[n].id for n in nodes]
                step_rows = list(
                    s.scalars(select(RemediationStep).where(RemediationStep.remediation_id.in_(ids)))
                )
        finally:
            worker.stop()
            db.dispose()
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                client.delete(key)

        provider = _provider_seconds(cluster)
        rows = [done[n] for n in nodes]
        statuses = {r.status for r in rows}
        overhead, total_s = [], []
        for r in rows:
            span = (aware(r.closed_at) - aware(r.opened_at)).total_seconds()  # type: ignore[operator]
            total_s.append(span)
            overhead.append(span - provider.get(cluster.link(r.node).k8s, 0.0))
        restarts = sum(cluster.vm_actions(n) for n in nodes)

    print(
        f"vm_overhead: {len(rows)} remediations ({len(rows) // 2} GCE, {len(rows) - len(rows) // 2} Azure), "
        f"{args.in_flight} in flight, {args.workers} Celery pool processes; real Postgres, Redis, SDKs"
    )
    print(
        f"  workflow.poll_interval_s={args.poll:g}  provider operations 0 s, reboot delay 0 s "
        f"(provider time counted: {sum(provider.get(cluster.link(n).k8s, 0.0) for n in nodes):.2f} s in all)"
    )
    print(f"  statuses: {sorted(statuses)}; VM actions at the endpoints: {restarts} (one per remediation)")
    print(
        f"  overhead per remediation (opened -> closed, minus provider time): "
        f"p50 {percentile(overhead, 50):.2f} s  {tail(overhead, unit=' s')}  "
        f"mean {statistics.mean(overhead):.2f} s  max {max(overhead):.2f} s"
    )
    print(
        f"  throughput: {len(rows)} remediations in {wall:.1f} s = {len(rows) / wall:.2f} remediations/s "
        f"({len(rows) / wall * 60:.0f}/min)"
    )
    per_step: dict[str, list[float]] = {}
    for row in step_rows:
        per_step.setdefault(row.step, []).append(
            (aware(row.finished_at) - aware(row.started_at)).total_seconds()
        )  # type: ignore[operator]
    print(
        "  mean time per step (claim to record, polls included): "
        + ", ".join(f"{step} {statistics.mean(v):.2f} s" for step, v in per_step.items())
    )
    print("  " + goal("overhead <= 2 s per remediation", tail(overhead, unit=" s"), tail_value(overhead) <= 2.0))


if __name__ == "__main__":
    main()
