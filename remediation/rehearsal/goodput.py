"""Goodput: training jobs replayed against the nodes' out-of-service spans, and their effective training
time ratio (ETTR: productive training time over the time the jobs held the fleet).

Pure: :func:`replay` reads the spans a rehearsal recorded (:class:`Span`), packs jobs of
``JobModel.job_nodes`` onto the fleet, and charges each interruption by cause (detection, work lost
since the last checkpoint, waiting for nodes, restart, false positives). No I/O, no database.

Why: docs/rehearsal.md#goodput-jobs-on-the-fleet-and-ettr
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from remediation.domain.checkpoint import asks_checkpoint
from remediation.settings import WorkflowSettings
from remediation.settings.kube import KubeSettings
from remediation.settings.slurm import SlurmSettings

#: The causes lost time is split by, in the order they are reported.
CAUSES = ("detection", "lost_work", "waiting", "restart", "false_positive")


@dataclass(frozen=True)
class Span:
    """A node out of service from ``start`` to ``end``. ``broken``: a fault had struck it (False: our
    own action took a node the world held healthy out, a false positive). ``fault_class``: the class
    the policy read from the fault's signal; ``source``: the signal's source (``slurm``,
    ``kubernetes``), which says how long the watchers take to notice it."""

    node: str
    start: datetime
    end: datetime
    fault_class: str = "-"
    broken: bool = True
    source: str = ""


@dataclass(frozen=True)
class JobModel:
    """The jobs on the fleet. Every default is an assumption, none a published figure
    (docs/rehearsal.md, "Goodput" says why each is reasonable):

    - ``job_nodes`` (128 nodes, 1,024 GPUs at 8 a node): a large job that a 2,048-node fleet, the Llama 3
      paper's 405B cluster, holds fifteen of beside a spare pool; the paper ran one job on all of it.
    - ``checkpoint_s`` (1 hour): how often a job saves its state. The Llama 3 paper and Kokolis et al.
      (HPCA'25) treat the interval as a job parameter and publish no single value.
    - ``restart_s`` (10 minutes): relaunch and warm-up (scheduling, start-up, loading the checkpoint,
      the collective's set-up). No public figure for a job of this size.
    - ``spare_fraction`` (5%): the share of the fleet kept out of jobs as spares, at least one node.
    """

    job_nodes: int = 128
    checkpoint_s: float = 3600.0
    restart_s: float = 600.0
    spare_fraction: float = 0.05


@dataclass(frozen=True)
class PolicyFacts:
    """What the policy brings to an interruption: how long its watchers take to notice a fault, per
    signal source (seconds), and whether a fault's class gets the checkpoint request."""

    detect_s: Mapping[str, float]
    saves: Callable[[str], bool]


def policy_facts(workflow: WorkflowSettings, kube: KubeSettings, slurm: SlurmSettings) -> PolicyFacts:
    """The settings' own detection latency: a Kubernetes condition is published once it has held
    ``kube.min_condition_s``; a Slurm state change is seen at the next poll, half of
    ``slurm.poll_interval_s`` on average. The checkpoint request follows ``asks_checkpoint``."""
    return PolicyFacts({"kubernetes": kube.min_condition_s, "slurm": slurm.poll_interval_s / 2},
                       lambda fault_class: asks_checkpoint(None if fault_class == "-" else fault_class, workflow))


@dataclass
class Goodput:
    """The jobs' figures over the window: ETTR, lost hours by cause and what moved them."""

    jobs: int = 0
    job_nodes: int = 0
    spare_nodes: int = 0
    job_hours: float = 0.0  # every job's time on the fleet over the window
    lost_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    interruptions: int = 0
    false_positives: int = 0  # of those, the ones our action on a healthy node caused
    checkpoint_saves: int = 0  # interruptions whose work the checkpoint request saved
    fewest_free: int = 0  # the fewest healthy nodes outside jobs at any moment

    @property
    def ettr(self) -> float | None:
        if not self.job_hours:
            return None
        return (self.job_hours - sum(self.lost_hours.values())) / self.job_hours

    def as_dict(self) -> dict[str, Any]:
        lost = sum(self.lost_hours.values())
        ettr = self.ettr
        return {"ettr": None if ettr is None else round(ettr, 4), "jobs": self.jobs, "job_nodes": self.job_nodes,
                "spare_nodes": self.spare_nodes, "job_hours": round(self.job_hours, 1),
                "lost_hours": round(lost, 2), "lost_hours_by_cause": {k: round(v, 2) for k, v in self.lost_hours.items()},
                "lost_share_by_cause": {k: round(v / lost, 4) if lost else 0.0 for k, v in self.lost_hours.items()},
                "interruptions": self.interruptions, "false_positives": self.false_positives,
                "checkpoint_saves": self.checkpoint_saves, "fewest_free": self.fewest_free}


# Event kinds, in the order they are handled at one instant: a node back first (a job waiting for it
# can start), then a job noticing its fault, a restart ending, and a node going out last.
_BACK, _NOTICED, _UP, _OUT = 0, 1, 2, 3
_RUNNING, _DETECTING, _WAITING, _RESTARTING = "running", "detecting", "waiting", "restarting"


@dataclass
class _Job:
    nodes: list[str]
    state: str = _RUNNING
    since: float = 0.0  # running: since the last restart ended; otherwise: since this phase began
    fp: bool = False  # the interruption under way is a false positive
    gen: int = 0  # bumped at each interruption: a stale NOTICED or UP is ignored


class _Replay:
    """One replay: the fleet's nodes, who holds them, and the jobs' states, on seconds since ``t0``."""

    def __init__(self, nodes: Sequence[str], model: JobModel, facts: PolicyFacts, *, t0: datetime,
                 end: float) -> None:
        self.model, self.facts, self.t0, self.end = model, facts, t0, end
        self.order = {n: i for i, n in enumerate(nodes)}
        spares = max(1, math.ceil(len(nodes) * model.spare_fraction))
        count = max(0, (len(nodes) - spares) // model.job_nodes) if model.job_nodes > 0 else 0
        self.jobs = [_Job(list(nodes[i * model.job_nodes:(i + 1) * model.job_nodes])) for i in range(count)]
        self.owner = {n: j for j, job in enumerate(self.jobs) for n in job.nodes}
        self.out: dict[str, int] = {}  # node -> spans open on it
        self.free = set(nodes) - set(self.owner)  # healthy nodes no job holds
        self.waiting: list[int] = []  # jobs waiting for nodes, first come first served
        self.queue: list[tuple[float, int, int, Any]] = []
        self.g = Goodput(jobs=count, job_nodes=model.job_nodes,
                         spare_nodes=len(nodes) - count * model.job_nodes, job_hours=count * end / 3600)
        self.g.fewest_free = self.g.spare_nodes
        self._seq = 0

    def push(self, at: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (at, kind, self._seq, payload))

    def spend(self, job: _Job, cause: str, *, since: float, until: float) -> None:
        """Charge ``job``'s lost time from ``since`` to ``until`` (within the window) to ``cause``, or to
        false positives when the interruption under way is one."""
        secs = max(0.0, min(until, self.end) - max(since, 0.0))
        self.g.lost_hours["false_positive" if job.fp else cause] += secs / 3600

    def run(self) -> Goodput:
        while self.queue and self.queue[0][0] < self.end:
            at, kind, _, payload = heapq.heappop(self.queue)
            if kind == _OUT:
                self.node_out(at, payload)
            elif kind == _BACK:
                self.node_back(at, payload)
            elif kind == _NOTICED:
                self.noticed(at, *payload)
            else:
                self.restarted(at, *payload)
        for job in self.jobs:  # the phase still under way at the window's end
            phase = {_DETECTING: "detection", _WAITING: "waiting", _RESTARTING: "restart"}.get(job.state)
            if phase is not None:
                self.spend(job, phase, since=job.since, until=self.end)
        return self.g

    def node_back(self, at: float, name: str) -> None:
        self.out[name] -= 1
        if self.out[name]:
            return  # another span still holds it out
        del self.out[name]
        if name not in self.owner:
            self.free.add(name)
        self.start_waiting(at)

    def node_out(self, at: float, span: Span) -> None:
        name = span.node
        self.out[name] = self.out.get(name, 0) + 1
        self.free.discard(name)
        self.g.fewest_free = min(self.g.fewest_free, len(self.free))
        j = self.owner.pop(name, None)
        if j is None:
            return
        job = self.jobs[j]
        job.nodes.remove(name)
        if job.state not in (_RUNNING, _RESTARTING):
            return  # already stopped: the node is just one fewer it holds
        if job.state == _RESTARTING:
            self.spend(job, "restart", since=job.since, until=at)
        self.interrupt(job, j, at=at, span=span)

    def interrupt(self, job: _Job, j: int, *, at: float, span: Span) -> None:
        """The job stops: it loses the work since its last checkpoint unless the checkpoint request
        saved it, and stalls until the policy notices (at once for our own action)."""
        saved = self.facts.saves(span.fault_class)
        self.g.interruptions += 1
        self.g.false_positives += not span.broken
        was_running, job.fp = job.state == _RUNNING, not span.broken
        if was_running and saved:
            self.g.checkpoint_saves += 1
        elif was_running:
            ran = at - job.since
            self.spend(job, "lost_work", since=at - ran % self.model.checkpoint_s, until=at)
        detect = self.facts.detect_s.get(span.source, 0.0) if span.broken else 0.0
        job.state, job.since, job.gen = _DETECTING, at, job.gen + 1
        self.push(at + detect, _NOTICED, (j, job.gen))

    def noticed(self, at: float, j: int, gen: int) -> None:
        job = self.jobs[j]
        if gen != job.gen:
            return
        self.spend(job, "detection", since=job.since, until=at)
        job.state, job.since = _WAITING, at
        self.waiting.append(j)
        self.start_waiting(at)

    def start_waiting(self, at: float) -> None:
        """Start every waiting job, first come first served, that its own nodes and the free ones fill."""
        for j in list(self.waiting):
            job = self.jobs[j]
            need = self.model.job_nodes - len(job.nodes)
            if len(self.free) < need:
                break  # first come first served: a later job does not jump the queue
            taken = sorted(self.free, key=self.order.__getitem__)[:need]
            for name in taken:
                self.owner[name] = j
            self.free.difference_update(taken)
            job.nodes += taken
            self.waiting.remove(j)
            self.spend(job, "waiting", since=job.since, until=at)
            job.state, job.since = _RESTARTING, at
            self.push(at + self.model.restart_s, _UP, (j, job.gen))
        self.g.fewest_free = min(self.g.fewest_free, len(self.free))

    def restarted(self, at: float, j: int, gen: int) -> None:
        job = self.jobs[j]
        if gen != job.gen or job.state != _RESTARTING:
            return
        self.spend(job, "restart", since=job.since, until=at)
        job.state, job.since, job.fp = _RUNNING, at, False


def replay(spans: Sequence[Span], nodes: Sequence[str], *, model: JobModel, facts: PolicyFacts,
           window: tuple[datetime, datetime]) -> Goodput:
    """Pack jobs of ``model.job_nodes`` onto ``nodes`` in order (the rest are spares), run them from the
    window's start, and replay ``spans``: a span on a node of a running job interrupts it."""
    t0, t1 = window
    r = _Replay(nodes, model, facts, t0=t0, end=(t1 - t0).total_seconds())
    for span in spans:
        if span.node in r.order:
            r.push((span.start - t0).total_seconds(), _OUT, span)
            r.push((span.end - t0).total_seconds(), _BACK, span.node)
    return r.run()
