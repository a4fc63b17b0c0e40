"""No phantom faults, as a user met them: one fault per node, one restart each, and no phantom afterwards.

The project's own simulated cluster (:class:`remediation.simulator.cluster.SimCluster`, GCE and Azure VMs under
Slurm-on-Kubernetes) with the real processes a deployment runs: ``remediation worker -c 2 -B``,
``remediation watch slurm`` and ``remediation watch kube``, on real Postgres and Redis.

- 16 nodes fail once each, 3 s apart: a researcher's FAIL, a GPU Node condition, Ready=False and a
  stopped slurmd, four of each. VMs boot in 0.5 s to 4 s, shorter and longer than
  ``kube.min_condition_s`` (2 s), so the reboot's own ``Ready=Unknown`` comes due for the slow ones
  (for some just before the node is back, which is how the issue's phantom was flushed together
  with the Ready=True that ended it), and the Slurm node goes NOT_RESPONDING and DOWN during every
  reboot.
- Result: 16 succeeded, 0 quarantined, 0 second remediations, one VM action per node (what the clouds
  took: a GCE call repeated with its requestId, as a worker resuming the step after its lease ran out
  sends it, returns the first operation and is not a second action); the reboot signals that were
  published are recorded as caused by their remediation.
- In the same run a truly broken VM (``repeat_offender`` whose GPU fault relapses after each return)
  IS quarantined by the repeat-offender rule at its threshold (3).

"Nothing more happened" is asserted after a barrier, not a sleep: canaries (a maintenance drain in
Slurm and a Node condition whose message the ignore list matches) are injected only once every
watcher hold that a reboot could have started has run out, and the barrier is their being recorded
with every stream entry acknowledged and every event decided.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from remediation.adapters.bus import GROUP, Keys
from remediation.db.models import Event, Node, Remediation, RemediationStep
from remediation.simulator.cluster import SimCluster, Timing
from tests.conftest import REDIS_URL
from tests.integration.workerproc import worker_env
from tests.pace import budget
from tests.reliability.phantoms import start_stack, wait_for

NODES = 16
LEMON = "gpu-node-16"
CANARY = "gpu-node-17"
HOLD_S = 2.0  # kube.min_condition_s
GRACE_S = 1.5  # slurm.not_responding_grace_s
OP_S = 0.3  # a provider operation; the Node is Ready=Unknown from its start to the end of the boot
# VM boot times by node group (i // 4), each group holding one node of each fault kind: shorter than
# the hold, a little longer (the reboot's Ready=Unknown comes due just before the node is back, which
# is how the phantom was flushed with the Ready=True that ended it), and much longer.
BOOT_S = (0.5, 2.0, 2.4, 4.0)
KINDS = ("researcher_fail", "gpu_condition", "node_not_ready", "slurmd_stop")
# The workflow's pace is this test's (fast polls and sweeps for a quick run) and stretches with the
# machine: on a slow runner 16 remediations polled every 0.3 s outran the worker, and a 1 s sweep then
# re-sent every overdue step, 1,215 vm_restart deliveries for 17 remediations and no verify in 600 s.
ENV = {
    "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": f"{budget(0.3):g}",
    "REMEDIATION_WORKFLOW__LEASE_S": f"{budget(12):g}",
    "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": f"{budget(1):g}",
    "REMEDIATION_WORKFLOW__BACKOFF_BASE_S": "0.2",
    "REMEDIATION_WORKFLOW__BACKOFF_MAX_S": "2",
    "REMEDIATION_WORKFLOW__VERIFY_TIMEOUT_S": f"{budget(30):.0f}",  # whole seconds
    "REMEDIATION_POLICY__MAX_CONCURRENT": "18",
    "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0",
    "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "1.0",
    "REMEDIATION_POLICY__REPEAT_OFFENDER_COUNT": "3",
    "REMEDIATION_SLURM__POLL_INTERVAL_S": "0.25",
    "REMEDIATION_SLURM__RESYNC_INTERVAL_S": "5",
    "REMEDIATION_SLURM__NOT_RESPONDING_GRACE_S": f"{GRACE_S:g}",
    "REMEDIATION_KUBE__RESYNC_INTERVAL_S": "10",
    "REMEDIATION_KUBE__LEADER_TTL_S": "6",
}


def remediations(db: Engine, node: str) -> list[Remediation]:
    with Session(db) as s:
        return list(s.scalars(select(Remediation).where(Remediation.node == node).order_by(Remediation.id)))


def events(db: Engine, node: str) -> list[Event]:
    with Session(db) as s:
        return list(s.scalars(select(Event).where(Event.node == node).order_by(Event.observed_at, Event.id)))


def vm_story(db: Engine, cluster: SimCluster, nodes: list[str]) -> str:
    """What a node's VM was asked and what its remediation's steps recorded, for a failed count."""
    lines = []
    for n in nodes:
        link = cluster.link(n)
        lines.append(f"{n}: {cluster.vm_actions(n)} VM actions taken, {cluster.vm_requests(n)} asked for")
        log = cluster.gce.log if link.provider == "gce" else cluster.azure.log
        lines += [f"{n}: {r.method} {r.path.rsplit('/', 1)[-1]} {r.status} at {r.at:.3f} {r.query}"
                  for r in log.items if f"/{link.k8s}/" in r.path and r.method == "POST"]
        with Session(db) as s:
            steps = s.scalars(select(RemediationStep).join(Remediation).where(Remediation.node == n)
                              .order_by(RemediationStep.id))
            lines += [f"{n}: step {st.step}#{st.attempt} {st.status} {st.started_at:%H:%M:%S.%f}"
                      f"..{st.finished_at and f'{st.finished_at:%H:%M:%S.%f}'} retries={st.retries} "
                      f"error={st.error_kind}: {(st.error or '')[:120]}" for st in steps]
    return "\n".join(lines)


class Relapses(threading.Thread):
    """The lemon's GPU fault comes back each time one of its remediations has returned it.

    A barrier, not a timer: a relapse timed from the boot (10 s) fired inside a verify on a slow
    runner, where the fault is part of the remediation still open, and the lemon was never caught."""

    def __init__(self, cluster: SimCluster, db: Engine) -> None:
        super().__init__(daemon=True)
        self.cluster, self.db, self.stop, self.returned = cluster, db, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            returned = sum(r.status == "succeeded" for r in remediations(self.db, LEMON))
            if returned > self.returned:
                self.returned = returned
                self.cluster.gpu_condition(LEMON, message="XID 48: double-bit ECC error (relapse after return)")


def inject(cluster: SimCluster, i: int) -> None:
    node = f"gpu-node-{i}"
    kind = KINDS[i % 4]
    if kind == "researcher_fail":
        cluster.researcher_fail(node, "xid 79: GPU fell off the bus")
    elif kind == "gpu_condition":
        cluster.gpu_condition(node)
    elif kind == "node_not_ready":
        cluster.node_not_ready(node)
    else:
        cluster.slurmd_stop(node)


# 18 nodes through real VM restarts, three restarts of the lemon and a barrier: about 100 s alone, and
# past the suite's 300 s limit on a loaded 2-core runner (seen in CI); the waits inside bound it.
@pytest.mark.timeout(720)
def test_one_fault_per_node_is_one_remediation_and_the_lemon_is_still_caught(
    pg_url: str, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path, db: Engine
) -> None:
    with SimCluster(NODES + 2, timing=Timing(op_seconds=OP_S, reboot_delay_s=BOOT_S[0], slurmd_timeout_s=1.0)) as cluster:
        for i in range(NODES):
            cluster.link(f"gpu-node-{i}").reboot_delay_s = BOOT_S[i // 4]
        slow = {f"gpu-node-{i}" for i in range(NODES) if OP_S + BOOT_S[i // 4] > HOLD_S}
        env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path,
                         **{**cluster.settings_overrides(min_condition_s=HOLD_S), **ENV})
        relapser = Relapses(cluster, db)
        procs = start_stack(env, tmp_path)
        try:
            wait_for(lambda: len(events(db, "gpu-node-0")) > 0, 30, "the first resync", procs)

            cluster.repeat_offender(LEMON, relapse_after_s=math.inf)  # its own timer never fires: relapser
            relapser.start()
            for i in range(NODES):
                inject(cluster, i)
                time.sleep(3.0)  # the pacing: faults 3 s apart
            nodes = [f"gpu-node-{i}" for i in range(NODES)]
            wait_for(lambda: all((r := remediations(db, n)) and r[-1].status == "succeeded" for n in nodes),
                     240, "16 remediations to succeed", procs)
            # Three boots, each with a verify and then a relapse: past 180 s on a loaded runner (seen).
            wait_for(lambda: (r := remediations(db, LEMON)) and r[-1].status == "quarantined", 360,
                     "the lemon's quarantine", procs)

            # Barrier: every hold a reboot could have started (the kube hold, the Slurm grace) has
            # run out before the canaries exist; they are recorded only after the watchers flushed
            # whatever was due before them, and the stream is then fully acknowledged and decided.
            with Session(db) as s:
                last_close = s.scalar(select(func.max(Remediation.closed_at)))
            assert last_close is not None
            while time.time() < last_close.timestamp() + max(HOLD_S, GRACE_S) + 1.0:
                time.sleep(0.1)
            cluster.human_drain(CANARY, "maintenance: canary")
            cluster.kube.set_condition(cluster.link(CANARY).k8s, "GpuXidError", "True", reason="Canary",
                                       message="planned canary")
            wait_for(lambda: {(e.source, e.decision) for e in events(db, CANARY)} >= {
                ("slurm", "record"), ("kubernetes", "record")}, 30, "the canaries", procs)
            keys = Keys(redis_prefix)

            def settled() -> bool:
                group = next(g for g in redis_client.xinfo_groups(keys.stream) if g["name"].decode() == GROUP)
                with Session(db) as s:
                    undecided = s.scalar(select(func.count()).select_from(Event).where(Event.decision == ""))
                return group["pending"] == 0 and group.get("lag", 0) == 0 and undecided == 0

            wait_for(settled, 30, "the stream to be acknowledged and every event decided", procs)
        finally:
            relapser.stop.set()
            if relapser.is_alive():
                relapser.join(5)
            for p in procs:
                p.stop()

        report = {n: [(r.id, r.status, r.cause[:60]) for r in remediations(db, n)] for n in [*nodes, LEMON]}
        second = {n: r for n, r in report.items() if n != LEMON and len(r) != 1}
        assert second == {}, f"second remediations: {second}"
        with Session(db) as s:
            quarantined = set(s.scalars(select(Node.name).where(Node.status == "quarantined")))
            lemon = s.get(Node, ("default", LEMON))
        assert quarantined == {LEMON}, report
        assert all(report[n][0][1] == "succeeded" for n in nodes), report
        actions = {n: cluster.vm_actions(n) for n in nodes}
        assert actions == {n: 1 for n in nodes}, vm_story(db, cluster, [n for n in nodes if actions[n] != 1])

        # The lemon: two restarts that "succeeded", then the rule's threshold took it out.
        assert [status for _, status, _ in report[LEMON]] == ["succeeded", "succeeded", "quarantined"], report
        assert lemon is not None and lemon.quarantine_reason == "repeat offender: 3 failures within 7d (limit 3)"
        assert cluster.vm_actions(LEMON) == 2
        relapses = [i for i in cluster.injections if i.node == LEMON and i.kind == "gpu_condition"]
        assert len(relapses) >= 2  # the injector's log: every quarantine has its faults behind it

        # The reboots' own signals reached the ingest and were explained, not counted.
        attributed = [(n, e.state, e.decision_reason) for n in nodes for e in events(db, n)
                      if e.decision == "attributed"]
        assert attributed, "no reboot signal reached the ingest: the test did not exercise attribution"
        ready = {n for n, state, _ in attributed if state.startswith("Ready=")}
        # The slow boots outlast the hold. A fast one may too on a loaded machine (the simulator's boot is
        # timed by its own threads), so what is required of every one is that it was explained, below.
        assert ready & slow, (ready, slow)
        for n, _, why in attributed:
            rid = remediations(db, n)[0].id
            assert why.startswith(f"caused by remediation #{rid}: "), (n, why)
