"""The phantom-fault soak: continuous fault replay on a simulated cluster, every quarantine checked
against the fault injector's own log.

Shared by the reliability scenario "false quarantines" (``tests/reliability/test_phantoms.py``, CI
scale) and the 10-minute soak on 32 nodes (``python -m bench.phantom_soak``, not in CI).

What runs is what a deployment runs: ``remediation worker -c 2 -B``, ``remediation watch slurm`` and
``remediation watch kube`` as processes, on real Postgres and Redis, against
:class:`remediation.simulator.cluster.SimCluster` driven by :class:`remediation.simulator.continuous.ContinuousReplay` (the
Llama 3 interruption mix round after round, plus switch storms). VM boot times vary by node from
shorter to longer than ``kube.min_condition_s``, so the reboots' own signals (Ready=Unknown,
NOT_RESPONDING, DOWN) reach the ingest in every way they can.

**Every figure comes from what happened.** A quarantine is *false* when the injector's log holds
fewer than ``policy.repeat_offender_count`` faults on that node up to the moment it was quarantined
(``Injection.at`` against ``nodes.quarantined_at``, both wall clock on this machine), unless a fault
was injected after the node last came back Ready from a restart: the restart did not fix it, and the
ladder quarantines such a node (a fault landing in a verify, seen on a slow runner). Faults are the
injections that break a node (a researcher's FAIL, a stopped slurmd, a GPU condition, Ready=False, a
storm's lost slurmd); a maintenance drain, a job-only failure and the end of maintenance are not.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.db.models import Event, Node, Remediation
from remediation.domain.events import EventKind
from remediation.simulator.cluster import SimCluster, Timing
from remediation.simulator.continuous import ContinuousReplay, Storms, Tempo
from tests.integration.workerproc import Worker, spawn, worker_env
from tests.pace import budget, within

ROOT = Path(__file__).resolve().parents[2]
REMEDIATION = str(Path(sys.executable).with_name("remediation"))
TRACE = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
FAULTS = frozenset({"researcher_fail", "slurmd_stop", "gpu_condition", "node_not_ready", "storm"})
HOLD_S = 2.0  # kube.min_condition_s in the soak
SLURMD_TIMEOUT_S = 1.0  # slurmctld's SlurmdTimeout in the soak
BOOT_S = (0.5, 2.0, 2.4, 4.0)  # VM boot times, node i gets BOOT_S[i % 4]
# The workflow's pace is the soak's, stretched with the machine (see tests/integration/test_no_phantom_faults.py).
SOAK_ENV = {
    "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": f"{budget(0.5):g}",
    "REMEDIATION_WORKFLOW__LEASE_S": f"{budget(15):g}",
    "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": f"{budget(2):g}",
    "REMEDIATION_WORKFLOW__BACKOFF_BASE_S": "0.2",
    "REMEDIATION_WORKFLOW__BACKOFF_MAX_S": "2",
    "REMEDIATION_WORKFLOW__VERIFY_TIMEOUT_S": f"{budget(60):.0f}",  # whole seconds
    "REMEDIATION_POLICY__MAX_CONCURRENT": "64",
    "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0",
    # The storms must not hold VM actions back: this soak measures verdicts on nodes, not the breaker
    # (tests/reliability/test_storm.py does).
    "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "1.0",
    "REMEDIATION_SLURM__POLL_INTERVAL_S": "0.25",
    "REMEDIATION_SLURM__RESYNC_INTERVAL_S": "10",
    "REMEDIATION_SLURM__NOT_RESPONDING_GRACE_S": "1.5",
    "REMEDIATION_KUBE__RESYNC_INTERVAL_S": "20",
    "REMEDIATION_KUBE__LEADER_TTL_S": "6",
}


class Proc(Worker):
    """One ``remediation ...`` process of ours (the console script a deployment runs), its output in a
    file; stopped or killed by its own process group, as :class:`Worker` is."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:  # noqa: D107
        self.log = log
        self.proc = spawn([REMEDIATION, *args], log, cwd=log.parent, env=env, start_new_session=True)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, procs: list[Proc]) -> Any:
    deadline, why = within(timeout), f"timed out after {timeout}s"
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        if dead := [p.log.name for p in procs if p.proc.poll() is not None]:
            why = f"{', '.join(dead)}: the process ended"  # nothing to wait for any more
            break
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.log.name}\n{p.output()[-3000:]}" for p in procs)
    raise AssertionError(f"{why} waiting for {what}\n{tails}")


def start_stack(env: dict[str, str], workdir: Path) -> list[Proc]:
    """The worker (with beat) and both watchers, each waited for until it works."""
    procs = [
        Proc(["worker", "-c", "2", "-B", "-s", str(workdir / "beat"), "--loglevel", "INFO",
              "--without-gossip", "--without-mingle", "--without-heartbeat"], env, workdir / "worker.log"),
        Proc(["watch", "slurm"], env, workdir / "watch-slurm.log"),
        Proc(["watch", "kube"], env, workdir / "watch-kube.log"),
    ]
    wait_for(lambda: " ready." in procs[0].output(), 90, "the worker", procs)
    wait_for(lambda: "is the leader" in procs[1].output(), 30, "the slurm watcher", procs)
    wait_for(lambda: "watching Nodes" in procs[2].output(), 30, "the kube watcher", procs)
    return procs


@dataclass
class SoakResult:
    nodes: int
    duration_s: float
    limit: int
    faults: int = 0  # injected faults (the injector's log)
    faulted_nodes: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    remediations: int = 0
    quarantines: int = 0
    false_quarantines: list[str] = field(default_factory=list)  # "node: k faults behind it"
    extra_remediations: int = 0  # remediations beyond the faults injected on their node
    decisions: dict[str, int] = field(default_factory=dict)
    open_at_end: int = 0


def back_up(s: Session, node: str, before: datetime) -> float | None:
    """When ``node`` last came back Ready (its Kubernetes Node's Ready=True, as recorded) before ``before``."""
    at = s.scalar(select(func.max(Event.observed_at)).where(
        Event.node == node, Event.kind == EventKind.HEALTHY, Event.state == "Ready=True", Event.observed_at <= before))
    return at.timestamp() if at is not None else None


@dataclass
class Stack:
    """A soak's running world: the simulated cluster, our processes and a database engine."""

    cluster: SimCluster
    procs: list[Proc]
    engine: Engine

    def stop(self) -> None:
        """Stop our processes (each waited for; a second call does nothing)."""
        for p in self.procs:
            p.stop()

    def settle(self, quiesce_s: float, *, after: float) -> bool:
        """Wait up to ``quiesce_s`` until no remediation is open, every event has its decision and
        ``after`` (time.time()) plus the hold has passed; False if that never happened."""

        def quiet() -> bool:
            with Session(self.engine) as s:
                open_ = s.scalar(select(func.count()).select_from(Remediation).where(
                    Remediation.status.in_(("running", "waiting")))) or 0
                undecided = s.scalar(select(func.count()).select_from(Event).where(Event.decision == "")) or 0
            return open_ == 0 and undecided == 0 and time.time() > after + HOLD_S + 2

        try:
            wait_for(quiet, quiesce_s, "every remediation to close", self.procs)
        except AssertionError:
            return False
        return True


@contextmanager
def stack(nodes: int, pg_url: str, redis_url: str, prefix: str, workdir: Path, *, seed: int = 0,
          limit: int = 3) -> Iterator[Stack]:
    """The simulated cluster (VM boot times from BOOT_S) with the worker and both watchers running
    against it at the soak's pace; everything stopped on the way out."""
    with SimCluster(nodes, timing=Timing(op_seconds=0.5, reboot_delay_s=BOOT_S[0], slurmd_timeout_s=SLURMD_TIMEOUT_S), seed=seed) as cluster:
        for i, name in enumerate(cluster.names):
            cluster.link(name).reboot_delay_s = BOOT_S[i % len(BOOT_S)]
        env = worker_env(pg_url, redis_url, prefix, workdir, **{
            **cluster.settings_overrides(min_condition_s=HOLD_S), **SOAK_ENV,
            "REMEDIATION_POLICY__REPEAT_OFFENDER_COUNT": str(limit)})
        engine = create_engine(pg_url, poolclass=NullPool)
        running = Stack(cluster, [], engine)
        try:
            running.procs = start_stack(env, workdir)
            yield running
        finally:
            running.stop()
            engine.dispose()


def soak(nodes: int, duration_s: float, pg_url: str, redis_url: str, prefix: str, workdir: Path, *,
         mean_gap_s: float = 20.0, storm_every_s: float = 240.0, seed: int = 0, limit: int = 3,
         quiesce_s: float = 120.0) -> SoakResult:
    """Replay faults for ``duration_s``, let the service finish (up to ``quiesce_s``), and count."""
    result = SoakResult(nodes, duration_s, limit)
    with stack(nodes, pg_url, redis_url, prefix, workdir, seed=seed, limit=limit) as running:
        replay = ContinuousReplay(running.cluster, TRACE, tempo=Tempo(mean_gap_s=mean_gap_s),
                                  storms=Storms(every_s=storm_every_s), seed=seed).start()
        time.sleep(duration_s)  # the soak's length: faults arrive on the cluster's own clock
        replay.stop()
        running.settle(quiesce_s, after=time.time())  # if it never settles: counted below as open_at_end
        running.stop()
        injections = list(running.cluster.injections)
        with Session(running.engine) as s:
            rows = s.execute(select(Node.name, Node.quarantined_at).where(Node.status == "quarantined")).all()
            up = {name: back_up(s, name, at) for name, at in rows}
            per_node = Counter(s.scalars(select(Remediation.node)))
            result.decisions = {d: int(n) for d, n in s.execute(
                select(Event.decision, func.count()).group_by(Event.decision))}
            result.open_at_end = int(s.scalar(select(func.count()).select_from(Remediation).where(
                Remediation.status.in_(("running", "waiting")))) or 0)
    faults = [i for i in injections if i.kind in FAULTS]
    result.faults = len(faults)
    result.faulted_nodes = len({i.node for i in faults})
    result.by_kind = dict(Counter(i.kind for i in faults))
    result.remediations = sum(per_node.values())
    result.quarantines = len(rows)
    for name, at in rows:
        behind = sum(1 for i in faults if i.node == name and i.at <= at.timestamp())
        again = up[name] is not None and any(i.node == name and up[name] < i.at <= at.timestamp() for i in faults)
        if behind < limit and not again:
            result.false_quarantines.append(f"{name}: {behind} fault(s) behind it")
    injected = Counter(i.node for i in faults)
    result.extra_remediations = sum(max(0, n - injected[node]) for node, n in per_node.items())
    return result
