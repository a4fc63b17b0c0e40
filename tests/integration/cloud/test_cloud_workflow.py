"""The cloud half of the workflow end to end: real SDKs, real Postgres, Redis and Celery worker processes.

Each test starts a :class:`remediation.simulator.cluster.SimCluster` (kube-apiserver subset, GCE over http, Azure
over HTTPS, slurmrestd stand-in) and points real worker processes at it through the cluster's own
``REMEDIATION_*`` environment (slurm ``rest``, kube ``kubernetes``, vm ``auto``), so every restart is a
google-cloud-compute or azure-mgmt-compute call that lands in a fake's request log. An event is
published on the Redis stream as a watcher would publish it; the worker takes it from there.

What is proved, against the logs of the endpoints rather than our own records:

- **exactly once**: a worker SIGKILLed inside the restart call (its answer held by the fake after the
  VM acted) or while the operation runs is replaced, the workflow completes, and the VM was restarted
  once. On GCE the repeated call carries the same ``requestId``: two POSTs, one action.
- **transient faults** (30% of cloud calls answered 429 with Retry-After, or 503): every remediation
  completes, the step rows show the retries, and no retry came before the server's Retry-After.
- **permanent faults** (404: the VM is gone): quarantine at once, the provider's message in the reason.
  A 401 or 403 is the system's fault, not the node's (tests/reliability/test_systemic.py).
- **the escalation ladder**: restart, verify fails, reimage, verify fails, quarantine.

The helpers here (:class:`CloudRig`, :func:`retry_after_violations`) are shared with the reliability
scenarios in ``tests/reliability/test_chaos.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from remediation.adapters.bus import RedisEventBus
from remediation.clock import aware
from remediation.db.models import Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import load_settings
from remediation.simulator.cluster import SimCluster, Timing
from remediation.simulator.fakehttp import LoggedRequest
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.faults import SOFTWARE_FAULT
from tests.integration.workerproc import Worker, wait_for, worker_env
from tests.pace import budget

# Short timings so that a workflow takes seconds; verify_timeout_s is at its floor (30 s). The lease must
# outlast a step run, and a pool process's first cloud call imports google-cloud-compute (2 s alone,
# up to 8 s with several processes importing at once on two cores; hence two processes per worker).
# A lease shorter than that lets the sweeper start the same step beside a worker that is still alive:
# harmless for the VM (idempotency keys), but two runs side by side can retry inside each other's
# Retry-After. The kill tests, with one remediation at a time, use a shorter lease (KILL_LEASE_S) to
# resume sooner after the SIGKILL.
WORKFLOW_ENV = {
    "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": "0.2",
    "REMEDIATION_WORKFLOW__LEASE_S": "12",
    "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": "1",
    "REMEDIATION_WORKFLOW__BACKOFF_BASE_S": "0.2",
    "REMEDIATION_WORKFLOW__BACKOFF_MAX_S": "2",
    "REMEDIATION_WORKFLOW__VERIFY_TIMEOUT_S": "30",
    "REMEDIATION_POLICY__MAX_CONCURRENT": "16",
    "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0",
    "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "1.0",
}
KILL_LEASE_S = {"REMEDIATION_WORKFLOW__LEASE_S": "6"}
FAULTS_30 = ((429, 1.0), (503, None))  # half of the faults throttle with Retry-After: 1 s
TOLERANCE_S = 0.03  # ISO round trips of the recorded times, and the engine's 20 ms slack for timers


class CloudRig:
    """A SimCluster, the environment of workers pointed at it, the event bus, and readers of the DB."""

    def __init__(self, cluster: SimCluster, env: dict[str, str], tmp: Path, db: Engine, bus: RedisEventBus):
        self.cluster, self.env, self.tmp, self.db, self.bus = cluster, env, tmp, db, bus
        self.workers: list[Worker] = []
        self.app: Any = None  # the Celery app, to send tasks as the sweeper would

    def worker(self, concurrency: int = 2) -> Worker:
        worker = Worker(self.env, self.tmp, concurrency=concurrency)
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def fail(self, node: str, reason: str = SOFTWARE_FAULT, *, lemon: bool = False) -> None:
        """A researcher marks the node FAIL in Slurm, and the Slurm watcher's event goes on the stream."""
        if lemon:
            self.cluster.repeat_offender(node, reason)
        else:
            self.cluster.researcher_fail(node, reason)
        self.bus.publish(
            [
                NodeEvent(
                    source=Source.SLURM,
                    node=node,
                    kind=EventKind.UNHEALTHY,
                    state="FAIL",
                    reason=reason,
                    observed_at=datetime.now(UTC),
                )
            ]
        )

    def rem(self, node: str) -> Remediation | None:
        with Session(self.db) as s:
            return s.scalars(
                select(Remediation).where(Remediation.node == node).order_by(Remediation.id.desc())
            ).first()

    def status(self, node: str) -> str | None:
        rem = self.rem(node)
        return rem.status if rem else None

    def steps(self, node: str) -> list[RemediationStep]:
        rem = self.rem(node)
        if rem is None:
            return []
        with Session(self.db) as s:
            return list(
                s.scalars(
                    select(RemediationStep)
                    .where(RemediationStep.remediation_id == rem.id)
                    .order_by(RemediationStep.id)
                )
            )

    def row(self, node: str, step: str) -> RemediationStep | None:
        return next((r for r in reversed(self.steps(node)) if r.step == step), None)

    def open_steps(self) -> list[RemediationStep]:
        with Session(self.db) as s:
            return list(
                s.scalars(select(RemediationStep).where(RemediationStep.status.in_(("started", "waiting"))))
            )

    def wait_status(
        self, nodes: list[str], status: str, timeout: float, worker: Worker | None = None
    ) -> None:
        try:
            wait_for(
                lambda: all(self.status(n) == status for n in nodes),
                timeout,
                f"{nodes} to be {status}",
                worker,
            )
        except AssertionError as exc:
            now = {n: (self.status(n), [(r.step, r.status, r.error) for r in self.steps(n)]) for n in nodes}
            raise AssertionError(f"{now}\n{exc}") from None


def make_rig(
    nodes: int,
    pg_url: str,
    redis_client: redis.Redis,
    prefix: str,
    tmp: Path,
    db: Engine,
    *,
    reboot_delay_s: float = 0.3,
    **extra: str,
) -> Iterator[CloudRig]:
    """The body of a rig fixture: ``nodes`` simulated nodes (even: GCE, odd: Azure)."""
    with SimCluster(nodes, timing=Timing(op_seconds=0.3, reboot_delay_s=reboot_delay_s, slurmd_timeout_s=1.0)) as cluster:
        env = worker_env(
            pg_url, REDIS_URL, prefix, tmp, **{**cluster.settings_overrides(), **WORKFLOW_ENV, **extra}
        )
        settings = load_settings(broker={"redis_url": REDIS_URL, "key_prefix": prefix})
        app = make_app(settings)
        bus = RedisEventBus(
            redis_client, prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest")
        )
        rig = CloudRig(cluster, env, tmp, db, bus)
        rig.app = app
        try:
            yield rig
        finally:
            rig.stop()


@pytest.fixture
def rig(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine
) -> Iterator[CloudRig]:
    yield from make_rig(8, pg_url, redis_client, redis_prefix, tmp_path, db)


@pytest.fixture
def kill_rig(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine
) -> Iterator[CloudRig]:
    yield from make_rig(8, pg_url, redis_client, redis_prefix, tmp_path, db, **KILL_LEASE_S)


# ------------------------------------------------------------------------- Retry-After, from the logs


def _vm_of(cluster: SimCluster, provider: str, req: LoggedRequest) -> str | None:
    """The VM (instance name) a logged cloud request concerns."""
    parts = req.path.split("/")
    low = [p.lower() for p in parts]
    if "operations" in low:
        op_id = parts[low.index("operations") + 1]
        ops: Any = (cluster.gce if provider == "gce" else cluster.azure)._ops
        op = ops.get(op_id)
        if op is None:
            return None
        return str(op.instance if provider == "gce" else op.key[-1]).lower()
    for marker in ("instances", "virtualmachines"):
        if marker in low:
            return parts[low.index(marker) + 1].lower()
    return None


def fault_timeline(cluster: SimCluster) -> dict[str, list[LoggedRequest]]:
    """Every cloud request per VM, in order of answer."""
    out: dict[str, list[LoggedRequest]] = {}
    for provider, fake in (("gce", cluster.gce), ("azure", cluster.azure)):
        for req in fake.log.items:
            vm = _vm_of(cluster, provider, req)
            if vm is not None:
                out.setdefault(vm, []).append(req)
    for reqs in out.values():
        reqs.sort(key=lambda r: r.at)
    return out


def retry_after_violations(
    cluster: SimCluster, retry_after: dict[int, float | None]
) -> tuple[int, list[str]]:
    """(faulted requests followed by a retry, violations): after a request answered with ``status``
    (whose Retry-After was ``retry_after[status]``) at time t, the next request for the same VM must
    come at t + Retry-After or later."""
    checked, bad = 0, []
    for vm, reqs in fault_timeline(cluster).items():
        for prev, nxt in zip(reqs, reqs[1:], strict=False):
            if prev.status in retry_after:
                checked += 1
                wait = retry_after[prev.status] or 0.0
                if nxt.at + TOLERANCE_S < prev.at + wait:
                    bad.append(
                        f"{vm}: {prev.method} {prev.path} -> {prev.status} at {prev.at:.3f}, "
                        f"next {nxt.method} {nxt.path} {nxt.at - prev.at:.3f}s later (< {wait}s)"
                    )
    return checked, bad


def step_record_violations(rig: CloudRig, nodes: list[str]) -> tuple[int, list[str]]:
    """Check the step rows: each retried row names a TransientError and carries ``retry_after`` and
    ``retry_at``; ``retry_at`` lies at least Retry-After past the fault that caused it (the last fault
    for that VM before it, from the endpoint's log), and the VM's next request came no earlier."""
    timeline = fault_timeline(rig.cluster)
    retried, bad = 0, []
    for node in nodes:
        k8s = rig.cluster.link(node).k8s.lower()
        for row in rig.steps(node):
            if not row.retries:
                continue
            retried += 1
            detail = row.detail or {}
            if row.error_kind != "TransientError" or "retry_at" not in detail or "retry_after" not in detail:
                bad.append(f"{node} {row.step}: {row.error_kind} {detail}")
                continue
            retry_at = datetime.fromisoformat(detail["retry_at"]).timestamp()
            reqs = timeline.get(k8s, [])
            faults = [r for r in reqs if r.status in (429, 503) and r.at <= retry_at]
            if not faults:
                bad.append(f"{node} {row.step}: no fault in the log before retry_at")
                continue
            fault = faults[-1]
            wait = float(detail["retry_after"] or 0.0)
            if fault.status == 429 and wait < 1.0:
                bad.append(f"{node} {row.step}: a 429 with Retry-After 1 recorded retry_after={wait}")
            if retry_at + TOLERANCE_S < fault.at + wait:
                bad.append(
                    f"{node} {row.step}: retry_at {retry_at - fault.at:.3f}s after the fault < {wait}s"
                )
            later = [r for r in reqs if r.at > fault.at]
            if later and later[0].at + TOLERANCE_S < retry_at:
                bad.append(f"{node} {row.step}: retried {retry_at - later[0].at:.3f}s before retry_at")
    return retried, bad


# ------------------------------------------------------------------------------------- exactly once


def _kill_during_call(rig: CloudRig, node: str, verb: str) -> Worker:
    """Hold the answer to the VM action (after it acted) and SIGKILL the worker while it waits."""
    link = rig.cluster.link(node)
    fake: Any = rig.cluster.gce if link.provider == "gce" else rig.cluster.azure
    hold = fake.faults.delay_next(1, 60, match=f"/{link.k8s}/{verb}", method="POST")
    first = rig.worker()
    rig.fail(node)
    try:
        assert hold.held.wait(budget(60)), f"no {verb} call reached the fake\n{first.output()[-3000:]}"
    finally:
        first.kill()
        hold.release.set()
    row = rig.row(node, "vm_restart")
    # Killed inside the call: no operation recorded, but slurmd's start from before the action is.
    assert row is not None and row.status == "waiting" and row.provider_op is None
    assert "slurmd_start_before" in row.detail
    return first


def _kill_while_operation_runs(rig: CloudRig, node: str) -> Worker:
    link = rig.cluster.link(node)
    fake: Any = rig.cluster.gce if link.provider == "gce" else rig.cluster.azure
    fake.op_seconds = 600.0  # runs until the test ends it: the worker is killed while it polls
    first = rig.worker()
    rig.fail(node)
    try:
        wait_for(
            lambda: (r := rig.row(node, "vm_restart")) is not None and r.provider_op,
            60,
            "the operation to be recorded",
            first,
        )
    finally:
        first.kill()
    fake.op_seconds = 0.3
    row = rig.row(node, "vm_restart")
    assert row is not None and row.status == "waiting" and row.provider_op["ref"]
    assert rig.cluster.vm(node)["boot_count"] == 1  # still running at the provider
    fake.end_running_operations()  # it ends now: the next worker finds it done by polling its record
    return first


@pytest.mark.parametrize(
    ("node", "verb", "moment"),
    [
        ("gpu-node-0", "reset", "in-call"),
        ("gpu-node-2", "reset", "in-operation"),
        ("gpu-node-1", "restart", "in-call"),
        ("gpu-node-3", "restart", "in-operation"),
    ],
    ids=[
        "gce-killed-in-reset-call",
        "gce-killed-while-operation-runs",
        "azure-killed-in-restart-call",
        "azure-killed-while-operation-runs",
    ],
)
def test_sigkill_mid_restart_restarts_the_vm_exactly_once(
    kill_rig: CloudRig, node: str, verb: str, moment: str
) -> None:
    rig = kill_rig
    if moment == "in-call":
        _kill_during_call(rig, node, verb)
    else:
        _kill_while_operation_runs(rig, node)
    link = rig.cluster.link(node)
    fake: Any = rig.cluster.gce if link.provider == "gce" else rig.cluster.azure
    killed = fake.log.count("POST", f"/{link.k8s}/{verb}")  # the killed worker's (its client may retry)
    second = rig.worker()
    rig.wait_status([node], "succeeded", 60, second)

    posts = fake.log.count("POST", f"/{link.k8s}/{verb}")
    assert rig.cluster.vm_actions(node) == 1
    assert rig.cluster.vm(node)["boot_count"] == 2
    if link.provider == "gce":
        assert rig.cluster.gce.actions("reset", link.k8s) == 1
        # Killed in the call: the new worker asked again with the same requestId and got the same operation
        # (on a loaded machine a client may ask more than once; one requestId, one action, whatever the count).
        # Killed while it ran: the new worker polled the recorded operation and asked nothing.
        assert posts >= 2 if moment == "in-call" else posts == killed >= 1
        ids = {
            r.query.get("requestId")
            for r in rig.cluster.gce.log.items
            if r.path.endswith(f"/{link.k8s}/reset")
        }
        assert len(ids) == 1
    else:
        assert posts == 1  # the marker on the VM told the new worker that the restart had happened
    row = rig.row(node, "vm_restart")
    assert row is not None and row.status == "done" and row.attempt == 1
    assert [r.step for r in rig.steps(node)] == [
        "slurm_drain",
        "k8s_cordon",
        "k8s_evict",
        "vm_restart",
        "verify",
        "return",
    ]
    assert rig.open_steps() == []


# ------------------------------------------------------------------------------------ cloud faults


def test_transient_faults_on_30_percent_of_cloud_calls_are_retried_after_retry_after(rig: CloudRig) -> None:
    nodes = [f"gpu-node-{i}" for i in range(6)]  # three GCE VMs, three Azure VMs
    # Seeds whose first three draws hold both a 429 and a 503, so that each cloud sees both kinds.
    for seed, fake in ((8, rig.cluster.gce), (14, rig.cluster.azure)):
        fake.faults.fail_randomly(0.3, FAULTS_30, seed=seed)
    worker = rig.worker()
    for node in nodes:
        rig.fail(node)
    rig.wait_status(nodes, "succeeded", 100, worker)

    for fake in (rig.cluster.gce, rig.cluster.azure):
        statuses = {r.status for r in fake.log.items}
        assert {429, 503} <= statuses, statuses
    assert all(rig.cluster.vm_actions(n) == 1 for n in nodes), {n: rig.cluster.vm_actions(n) for n in nodes}
    checked, bad = retry_after_violations(rig.cluster, dict(FAULTS_30))
    assert checked > 0 and bad == []
    retried, bad = step_record_violations(rig, nodes)
    assert retried > 0 and bad == []
    assert rig.open_steps() == []


def test_a_duplicate_delivery_does_not_retry_before_retry_after(rig: CloudRig) -> None:
    """A second message for a step in backoff (the sweeper re-enqueues a remediation whose task sat in a
    busy queue) must not call the provider before the Retry-After it asked for."""
    node = "gpu-node-1"
    k8s = rig.cluster.link(node).k8s
    rig.cluster.azure.faults.fail_next(1, 429, retry_after=3, match=f"/{k8s}/restart", method="POST")
    worker = rig.worker()
    rig.fail(node)
    wait_for(lambda: (r := rig.row(node, "vm_restart")) is not None and r.retries == 1, 60, "the 429", worker)
    rem = rig.rem(node)
    assert rem is not None
    rig.app.send_task("remediation.step.vm_restart", args=[rem.id], queue="workflow")  # the duplicate
    rig.wait_status([node], "succeeded", 60, worker)

    reqs = [r for r in rig.cluster.azure.log.items if f"/{k8s}" in r.path.lower() or "/operations/" in r.path]
    throttled = next(r for r in reqs if r.status == 429)
    after = [r for r in reqs if r.at > throttled.at]
    assert after and after[0].at >= throttled.at + 3 - TOLERANCE_S, after[0].at - throttled.at
    assert rig.cluster.vm_actions(node) == 1


# (node, HTTP status, the provider's words that must reach the quarantine reason)
PERMANENT = [
    ("gpu-node-0", 404, "instances/gke-a3-pool-0' was not found"),  # GCE: the instance is really gone
    ("gpu-node-1", 404, "injected 404"),  # Azure
]


def test_permanent_cloud_errors_quarantine_at_once_with_the_providers_message(rig: CloudRig) -> None:
    """GCE and Azure, side by side in one worker (one start-up instead of two)."""
    for node, status, _ in PERMANENT:
        link = rig.cluster.link(node)
        if link.provider == "gce" and status == 404:
            rig.cluster.links.pop(node)  # the simulator stops following it: the VM is really gone
            rig.cluster.gce.remove_instance(*link.vm_key)
        else:
            fake: Any = rig.cluster.gce if link.provider == "gce" else rig.cluster.azure
            fake.faults.fail_next(1000, status, match=f"/{link.k8s}")  # it stays forbidden, or gone
    worker = rig.worker()
    for node, _, _ in PERMANENT:
        rig.fail(node)
    rig.wait_status([node for node, _, _ in PERMANENT], "quarantined", 60, worker)

    for node, _, message in PERMANENT:
        rem = rig.rem(node)
        assert rem is not None and rem.ladder == 0, node  # no climbing: a heavier action cannot fix this
        kind = "NotFound"
        assert kind in (rem.outcome or "") and message in (rem.outcome or ""), (node, rem.outcome)
        assert message in rem.context["quarantine_reason"]
        vm_row = rig.row(node, "vm_restart")
        assert vm_row is not None and vm_row.status == "failed" and vm_row.retries == 0, node
        assert message in (vm_row.error or "")
        assert [r.step for r in rig.steps(node)][-2:] == ["vm_restart", "quarantine"]
        if node in rig.cluster.links:
            assert rig.cluster.vm_actions(node) == 0, node
        reason = rig.cluster.slurm_state(node)[2]
        assert reason.startswith("remediation: quarantined") and message in reason  # one line, for Slurm


# ---------------------------------------------------------------------------------- the VM ladder


def test_ladder_restart_then_reimage_then_quarantine_on_a_vm_that_stays_broken(rig: CloudRig) -> None:
    node = "gpu-node-5"  # an Azure VM whose GPU fault comes back after every boot
    k8s = rig.cluster.link(node).k8s
    worker = rig.worker()
    started = time.monotonic()
    rig.fail(node, lemon=True)  # a software fault: the shipped ladder restarts, then reimages
    rig.wait_status([node], "quarantined", 120, worker)
    elapsed = time.monotonic() - started

    actions = [
        (r.path.rsplit("/", 1)[-1], r.status)
        for r in rig.cluster.azure.log.items
        if r.method == "POST" and f"/{k8s}/" in r.path
    ]
    assert actions == [("restart", 202), ("reimage", 202)]
    rows = rig.steps(node)
    assert [(r.step, r.status) for r in rows] == [
        ("slurm_drain", "done"),
        ("k8s_cordon", "done"),
        ("k8s_evict", "done"),
        ("vm_restart", "done"),
        ("verify", "failed"),
        ("vm_restart", "done"),
        ("verify", "failed"),
        ("quarantine", "done"),
    ]
    restart, reimage = (r for r in rows if r.step == "vm_restart")
    assert restart.provider_op["action"] == "restart" and reimage.provider_op["action"] == "reimage"
    assert [r.attempt for r in rows if r.step == "verify"] == [1, 2]
    # The VM came back (new bootID) but its slurmd never did: recovery is not proven, whatever else shows.
    assert all("not recovered" in (r.error or "") and "slurmd started after the action=False" in (r.error or "")
               for r in rows if r.step == "verify")
    rem = rig.rem(node)
    assert rem is not None and rem.ladder == 1 and "ladder exhausted" in (rem.outcome or "")
    assert rig.cluster.vm(node)["boot_count"] == 3
    assert rig.cluster.slurm_state(node)[2].startswith("remediation")
    assert aware(rem.closed_at) is not None and elapsed >= 60  # two verify timeouts of 30 s
