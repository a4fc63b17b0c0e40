"""Scenarios 1 and 4: kill -9 inside every workflow step, and 30% of cloud calls failing.

Both run against :class:`remediation.simulator.cluster.SimCluster` (kube-apiserver subset, GCE, Azure over HTTPS, a
slurmrestd stand-in) with real Postgres, Redis and Celery worker processes, the adapters speaking the
wire protocols through the real clients (see ``tests/integration/cloud/test_cloud_workflow.py``).

**kill -9 at every step.** Landing inside a step is made reliable rather than lucky: the endpoint that
step calls *holds its answer* after the request acted (``delay_next``), and the worker is SIGKILLed
while it waits for it. So each kill leaves the worst case behind: the effect happened (the drain is
placed, the Node cordoned, the pod evicted, the VM restarting), the step row says ``started`` and
nothing recorded the result. A new worker must finish the workflow through the sweeper, and the
clouds' request logs must show one restart per VM.

=================  =========================================================================
step               the call whose answer is held
=================  =========================================================================
slurm_drain        ``POST /slurm/v0.0.40/node/N`` (the drain)
k8s_cordon         ``PATCH /api/v1/nodes/K`` (the cordon)
k8s_evict          ``POST .../pods/P/eviction``
vm_restart         ``POST .../instances/K/reset`` (GCE) or ``.../virtualMachines/K/restart`` (Azure)
verify             ``GET /slurm/v0.0.40/node/N`` once the remediation is at verify
return             ``POST /slurm/v0.0.40/node/N`` (the resume), armed once it is at verify
=================  =========================================================================

For verify and return, the node's boot is held (``SimCluster.hold_boot``) until their call is armed: the
workflow waits in verify for the test, instead of the test racing a verify that can pass in a second.

**Cloud faults.** Each cloud answers 30% of calls with 429 (Retry-After: 1) or 503. Every remediation
must complete with one restart per VM, and no retry may come before the server's Retry-After, checked
both against the endpoints' timed request logs and against the ``retry_at`` the step rows record.

Sizes: ``scale(1, 5)`` kills per step and ``scale(8, 32)`` nodes under faults (CI, full).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from remediation.simulator.fakehttp import Hold
from tests.integration.cloud.test_cloud_workflow import (
    FAULTS_30,
    KILL_LEASE_S,
    CloudRig,
    make_rig,
    retry_after_violations,
    step_record_violations,
)
from tests.integration.workerproc import Worker, settled, wait_for
from tests.pace import budget
from tests.reliability.conftest import Recorder, scale

STEPS = ["slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"]
KILLS_PER_STEP = scale(1, 5)
SLURM_API = "/slurm/v0.0.40/node"


@pytest.fixture
def chaos(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine
) -> Iterator[CloudRig]:
    nodes = max(8, len(STEPS) * KILLS_PER_STEP)
    # A reboot takes a second, so that verify has several checks to land in.
    yield from make_rig(
        nodes, pg_url, redis_client, redis_prefix, tmp_path, db, reboot_delay_s=1.0, **KILL_LEASE_S
    )


@pytest.fixture
def faulty(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine
) -> Iterator[CloudRig]:
    yield from make_rig(scale(8, 32), pg_url, redis_client, redis_prefix, tmp_path, db)


def _arm(rig: CloudRig, node: str, step: str) -> Hold:
    """Hold the answer of the call ``step`` makes for ``node`` (see the module's table)."""
    link, cluster = rig.cluster.link(node), rig.cluster
    if step in ("slurm_drain", "return"):
        return cluster.slurmrestd.faults.delay_next(1, 60, match=f"{SLURM_API}/{node}", method="POST")
    if step == "verify":
        return cluster.slurmrestd.faults.delay_next(1, 60, match=f"{SLURM_API}/{node}", method="GET")
    if step == "k8s_cordon":
        return cluster.kube.delay_next(1, 60, method="PATCH", path=f"/api/v1/nodes/{link.k8s}")
    if step == "k8s_evict":
        return cluster.kube.delay_next(1, 60, method="POST", path="/eviction")
    fake: Any = cluster.gce if link.provider == "gce" else cluster.azure
    verb = "reset" if link.provider == "gce" else "restart"
    return fake.faults.delay_next(1, 60, match=f"/{link.k8s}/{verb}", method="POST")


def _kill_inside(rig: CloudRig, victim: Worker, node: str, step: str) -> float:
    """Start ``node``'s remediation on ``victim`` and SIGKILL it inside ``step``; returns the kill time."""
    late = step in ("verify", "return")  # their calls also happen in earlier steps: arm at verify
    hold = None if late else _arm(rig, node, step)
    if late:  # the node stays down until the hold is armed, so the workflow waits in verify for it
        rig.cluster.hold_boot(node)
    rig.fail(node)
    if late:
        wait_for(lambda: (r := rig.rem(node)) is not None and r.step == "verify", 60, "verify", victim)
        hold = _arm(rig, node, step)
        rig.cluster.end_boot(node)
    assert hold is not None
    try:
        assert hold.held.wait(budget(60)), f"{step} of {node} never made its call\n{victim.output()[-3000:]}"
        rem = rig.rem(node)
        row = rig.row(node, step)
        assert rem is not None and rem.step == step, (step, rem and rem.step)
        assert row is not None and row.status in ("started", "waiting") and row.finished_at is None
        victim.kill()
        return time.monotonic()
    finally:
        victim.kill()
        hold.release.set()


@pytest.mark.scenario("1 kill -9 at every step")
def test_kill_9_inside_every_step_completes_with_one_restart_per_vm(
    chaos: CloudRig, scenario_figures: Recorder
) -> None:
    runs, passed, duplicates, recovery, failures = 0, 0, 0, [], []
    kills: Counter[str] = Counter()
    scenario_figures.count_in(chaos.db)
    worker = chaos.worker()
    nodes = iter(chaos.cluster.names)
    for step in STEPS:
        for _ in range(KILLS_PER_STEP):
            node = next(nodes)
            runs += 1
            killed_at = _kill_inside(chaos, worker, node, step)
            kills[step] += 1
            worker = chaos.worker()
            try:
                chaos.wait_status([node], "succeeded", 90, worker)
            except AssertionError as exc:
                failures.append(f"{step} on {node}: {exc}"[:2000])
                continue
            recovery.append(time.monotonic() - killed_at)
            restarts = chaos.cluster.vm_actions(node)
            duplicates += max(0, restarts - 1)
            rows = chaos.steps(node)
            if restarts == 1 and [r.step for r in rows] == STEPS and all(r.status == "done" for r in rows):
                passed += 1
            else:
                failures.append(
                    f"{step} on {node}: {restarts} restarts, {[(r.step, r.status) for r in rows]}"
                )
    # The sweeper had its chance over the finished workflows: every task acknowledged, two more sweeps.
    settled([worker], chaos.bus.client, chaos.bus.keys.prefix)
    orphans = chaos.open_steps()
    lost = scenario_figures.record(
        db=chaos.db,
        duplicate_actions=duplicates,
        recovery_s=round(max(recovery), 2) if recovery else None,
        notes=f"{passed}/{runs} kills recovered; SIGKILLs inside each step {dict(kills)} (answer held after the call acted); "
        f"recovery = kill to succeeded, mean {statistics.mean(recovery) if recovery else 0:.1f}s, "
        f"max shown (lease {KILL_LEASE_S['REMEDIATION_WORKFLOW__LEASE_S']} s); orphaned steps after the sweeper: {len(orphans)}",
    )
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert failures == []
    assert passed == runs == len(STEPS) * KILLS_PER_STEP
    assert duplicates == 0
    assert orphans == []


@pytest.mark.scenario("4 cloud faults (30% 429/503)")
def test_cloud_faults_on_30_percent_of_calls_every_remediation_completes(
    faulty: CloudRig, scenario_figures: Recorder
) -> None:
    nodes = faulty.cluster.names
    scenario_figures.count_in(faulty.db)
    for seed, fake in ((8, faulty.cluster.gce), (14, faulty.cluster.azure)):
        fake.faults.fail_randomly(0.3, FAULTS_30, seed=seed)
    worker = faulty.worker()
    started = time.monotonic()
    for node in nodes:
        faulty.fail(node)
    faulty.wait_status(nodes, "succeeded", 150, worker)
    elapsed = time.monotonic() - started

    calls = sum(len(f.log.items) for f in (faulty.cluster.gce, faulty.cluster.azure))
    injected = faulty.cluster.gce.faults.injected + faulty.cluster.azure.faults.injected
    duplicates = sum(max(0, faulty.cluster.vm_actions(n) - 1) for n in nodes)
    checked, log_bad = retry_after_violations(faulty.cluster, dict(FAULTS_30))
    retried, record_bad = step_record_violations(faulty, nodes)
    retries = sum(r.retries for n in nodes for r in faulty.steps(n))
    done = sum(faulty.status(n) == "succeeded" for n in nodes)
    lost = scenario_figures.record(
        db=faulty.db,
        duplicate_actions=duplicates,
        recovery_s=round(elapsed, 2),
        notes=f"{done}/{len(nodes)} remediated; {injected}/{calls} cloud calls failed; {retries} retries in {retried} step rows; "
        f"{checked} retries checked against Retry-After, {len(log_bad) + len(record_bad)} too early; "
        f"recovery = all {len(nodes)} remediations done",
    )
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert injected > 0 and retried > 0 and checked > 0
    assert log_bad == [] and record_bad == []
    assert duplicates == 0 and all(faulty.cluster.vm_actions(n) == 1 for n in nodes)
    assert faulty.open_steps() == []
