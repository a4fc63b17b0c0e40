"""The false-positive soak: what is no fault, replayed beside real faults, every action checked against
the injector's log.

Shared by the reliability scenario "false positives" (``tests/reliability/test_false_positives.py``, CI
scale) and ``python -m bench.false_positives`` (32 nodes, 10 minutes). The stack is the phantom soak's
(:func:`tests.reliability.phantoms.stack`). The first half of the nodes takes the phantom soak's
fault replay (and so our own reboots); the other half takes only :data:`remediation.simulator.noise.NOISE_MIX`
and never a fault. Every ``NoiseReplay.stall_every_s`` slurmctld stalls for the whole cluster.

**A false action** is any remediation the database records on a noise-only node (with its drain,
cordon, eviction, machine and quarantine steps, its audit rows, the node's quarantine), and any
remediation on a faulted node beyond the faults injected there (the phantom soak's rule). The
opportunities are the noise signals the injector logged, plus our own machine actions (each a reboot's
NotReady, NOT_RESPONDING and DOWN). Nothing is judged before a barrier: once the last signal has
ended and its threshold passed, one more application XID and one more maintenance drain must be
recorded, so each watcher has read past every signal before it, and the worker has decided them all.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from remediation.db.models import AuditLog, Event, Node, Remediation, RemediationStep
from remediation.domain.statemachine import QUARANTINE_STATUSES, Step
from remediation.domain.states import StepStatus
from remediation.settings.faults import FaultSettings
from remediation.simulator.continuous import ContinuousReplay, Storms, Tempo
from remediation.simulator.noise import NOISE_KINDS, NoisePace, NoiseReplay, Thresholds
from tests.reliability.phantoms import (
    FAULTS,
    HOLD_S,
    SLURMD_TIMEOUT_S,
    SOAK_ENV,
    TRACE,
    Stack,
    stack,
    wait_for,
)

#: Steps that act on a node: drain, cordon, eviction, the machine action, quarantine.
ACTION_STEPS = frozenset({Step.SLURM_DRAIN, Step.K8S_CORDON, Step.K8S_EVICT, Step.VM_RESTART, Step.QUARANTINE})
GRACE_S = float(SOAK_ENV["REMEDIATION_SLURM__NOT_RESPONDING_GRACE_S"])
APP_XID_REPEAT_COUNT = FaultSettings().app_xid_repeat_count  # as shipped: each noise node gets fewer
IGNORED = "ignore list"  # the words of the decision reason of a drain policy.ignore_reasons matches


@dataclass
class FalsePositiveResult:
    nodes: int
    noise_nodes: list[str]
    duration_s: float
    noise: dict[str, int] = field(default_factory=dict)  # noise signals by kind (the injector's log)
    own_machine_actions: int = 0  # on faulted nodes: each one's reboot signals are noise too
    faults: int = 0  # real faults, all on the other nodes
    remediations: int = 0
    false_remediations: list[str] = field(default_factory=list)  # "node: why"
    false_actions: int = 0  # action steps and audit rows of the false remediations, quarantines
    sim_actions: int = 0  # cross-check: VM actions, our drains and cordons the cluster itself holds
    reached: dict[str, int] = field(default_factory=dict)  # decisions of noise nodes' events, the ignore list
    stall_reads_failed: int = 0  # the Slurm watcher's failed reads (its log)
    barrier_s: float = 0.0  # last signal's end to both barrier events recorded
    open_at_end: int = 0

    @property
    def signals(self) -> int:
        return sum(self.noise.values()) + self.own_machine_actions


def soak(nodes: int, duration_s: float, pg_url: str, redis_url: str, prefix: str, workdir: Path, *,
         mean_gap_s: float = 20.0, fault_gap_s: float = 20.0, stall_every_s: float = 60.0, seed: int = 0,
         quiesce_s: float = 120.0) -> FalsePositiveResult:
    """Replay faults on half the nodes and noise on the other half for ``duration_s``, pass the
    barrier, let the service finish (up to ``quiesce_s``), and count."""
    with stack(nodes, pg_url, redis_url, prefix, workdir, seed=seed) as running:
        names = running.cluster.names
        faulted, quiet = names[: nodes // 2], names[nodes // 2:]
        result = FalsePositiveResult(nodes, quiet, duration_s)
        limits = Thresholds(HOLD_S, GRACE_S, slurmd_timeout_s=SLURMD_TIMEOUT_S, app_xid_limit=APP_XID_REPEAT_COUNT)
        replay = ContinuousReplay(running.cluster, TRACE, tempo=Tempo(mean_gap_s=fault_gap_s),
                                  storms=Storms(every_s=4 * stall_every_s), seed=seed, nodes=faulted).start()
        noise = NoiseReplay(running.cluster, quiet, limits, seed=seed,
                            pace=NoisePace(mean_gap_s=mean_gap_s, stall_every_s=stall_every_s))
        noise.reserve_app_xid(quiet[0])  # the barrier's application XID
        noise.start()
        time.sleep(duration_s)  # the soak's length: signals arrive on the cluster's own clock
        replay.stop()
        noise.stop()
        result.barrier_s = barrier(running, noise)
        running.settle(quiesce_s, after=time.time())  # if it never settles: counted below as open_at_end
        running.stop()
        judge(running, result)
        result.sim_actions = sum(sim_actions(running, node) for node in quiet)
        result.stall_reads_failed = running.procs[1].output().count("cannot read Slurm")
    return result


def barrier(running: Stack, noise: NoiseReplay) -> float:
    """Wait until the last signal has ended and outlived its threshold, then inject an application XID
    (through the Kubernetes watcher) and a maintenance drain (through the Slurm watcher) and wait until
    the ingest has decided both; returns the seconds from the last signal's end to then."""
    ended = noise.ends_at()
    time.sleep(max(0.0, ended - time.monotonic()) + max(HOLD_S, GRACE_S) + 1)
    xid_node, drain_node = noise.nodes[0], noise.nodes[-1]  # the first kept an application XID in hand
    xids, drains = decided(running, xid_node, "app_xid"), decided(running, drain_node, IGNORED)
    noise.inject(xid_node, "app_xid")
    noise.inject(drain_node, "human_drain")

    def both() -> bool:
        return decided(running, xid_node, "app_xid") > xids and decided(running, drain_node, IGNORED) > drains

    wait_for(both, 120, "the barrier's application XID and maintenance drain to be decided", running.procs)
    return time.monotonic() - ended


def decided(running: Stack, node: str, what: str) -> int:
    """Events of ``node`` decided ``app_xid`` (what="app_xid") or recorded under the ignore list."""
    with Session(running.engine) as s:
        where = Event.decision == "app_xid" if what == "app_xid" else Event.decision_reason.contains(IGNORED)
        return int(s.scalar(select(func.count()).select_from(Event).where(Event.node == node, where)) or 0)


def judge(running: Stack, result: FalsePositiveResult) -> None:
    """Count the signals, faults and actions (the injector's log against the database)."""
    quiet = set(result.noise_nodes)
    injections = list(running.cluster.injections)
    result.noise = dict(Counter(i.kind for i in injections if i.kind in NOISE_KINDS and i.node in quiet | {""}))
    faults = Counter(i.node for i in injections if i.kind in FAULTS)
    result.faults = sum(faults.values())
    if faulted_noise := [i for i in injections if i.kind in FAULTS and i.node in quiet]:
        raise AssertionError(f"a fault landed on a noise-only node: {faulted_noise[:3]}")
    with Session(running.engine) as s:
        rems = s.execute(select(Remediation.id, Remediation.node, Remediation.cause)).all()
        result.remediations = len(rems)
        per_node = Counter(node for _, node, _ in rems)
        for rid, node, cause in rems:
            if node in quiet:
                result.false_remediations.append(f"{node}: remediation {rid} ({cause[:80]})")
        for node, n in per_node.items():
            if node not in quiet and n > faults[node]:
                result.false_remediations.append(f"{node}: {n} remediations for {faults[node]} fault(s)")
        result.false_actions = int(s.scalar(select(func.count()).select_from(RemediationStep).join(Remediation).where(
            Remediation.node.in_(quiet), RemediationStep.step.in_(ACTION_STEPS))) or 0)
        result.false_actions += int(s.scalar(select(func.count()).select_from(AuditLog).where(
            AuditLog.target.in_(quiet))) or 0)
        result.false_actions += int(s.scalar(select(func.count()).select_from(Node).where(
            Node.name.in_(quiet), Node.status.in_(QUARANTINE_STATUSES))) or 0)
        result.own_machine_actions = int(s.scalar(select(func.count()).select_from(RemediationStep).join(
            Remediation).where(Remediation.node.not_in(quiet), RemediationStep.step == Step.VM_RESTART,
                               RemediationStep.status == StepStatus.DONE)) or 0)
        result.reached = {d or "undecided": int(n) for d, n in s.execute(select(Event.decision, func.count()).where(
            Event.node.in_(quiet)).group_by(Event.decision))}
        result.reached[IGNORED] = int(s.scalar(select(func.count()).select_from(Event).where(
            Event.node.in_(quiet), Event.decision_reason.contains(IGNORED))) or 0)
        result.open_at_end = int(s.scalar(select(func.count()).select_from(Remediation).where(
            Remediation.status.in_(("running", "waiting")))) or 0)


def sim_actions(running: Stack, node: str) -> int:
    """What the cluster itself holds of an action on ``node``: VM actions, a drain of ours, a cordon."""
    cluster = running.cluster
    _, flags, reason = cluster.slurm_state(node)
    cordoned = bool(cluster.kube.node(cluster.link(node).k8s)["spec"].get("unschedulable"))
    return cluster.vm_requests(node) + int("DRAIN" in flags and reason.startswith("remediation:")) + int(cordoned)
