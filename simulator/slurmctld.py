"""The node table of a simulated slurmctld, with the state rules of the real one (Slurm 22.05-23.11).

:mod:`remediation.simulator.slurmrestd` serves it and :mod:`remediation.simulator.cluster` drives it. Drain, fail, down and resume
follow ``scontrol``'s rules and errnos; a silent slurmd goes NOT_RESPONDING, then DOWN; a registering one
returns with ``ReturnToService=1``. :meth:`SlurmCtld.tick` advances wall-clock timers; :meth:`SlurmCtld.stall`
makes its RPCs time out for a while (slurmctld busy or unreachable).

Why: docs/wire-protocols.md#the-slurm-stand-ins
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

ERR_INVALID_NODE_NAME = 2018
ERR_INVALID_NODE_STATE = 2028
ERR_SOCKET_TIMEOUT = 5004  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING"})


class SlurmError(Exception):
    """A request slurmctld refuses; ``errno`` is Slurm's error number."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message


@dataclass
class CtldNode:
    """One node as slurmctld holds it. ``down`` is the DOWN base state; IDLE or ALLOCATED follow from
    the jobs running on it."""

    name: str
    port: int
    down: bool = False
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    reason_user: str = ""
    reason_changed_at: int = 0
    slurmd_up: bool = True
    slurmd_start_time: int = 0
    boot_time: int = 0
    silent_since: float | None = None  # when slurmd stopped answering
    ping_due: float | None = None  # a resumed node stays NOT_RESPONDING until then


@dataclass
class Job:
    job_id: int
    nodes: tuple[str, ...]
    user: str
    name: str
    start_time: int
    end_time: int
    state: str = "RUNNING"


class SlurmCtld:
    """Thread-safe node and job table. ``clock`` returns Unix seconds (tests may pass their own)."""

    def __init__(
        self,
        names: Iterable[str],
        *,
        not_responding_after_s: float = 0.3,
        slurmd_timeout_s: float = 1.0,
        ping_after_resume_s: float = 0.3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.not_responding_after_s = not_responding_after_s
        self.slurmd_timeout_s = slurmd_timeout_s
        self.ping_after_resume_s = ping_after_resume_s
        self.clock = clock
        self.lock = threading.RLock()
        now = int(clock())
        self._nodes = {
            name: CtldNode(name, 17000 + i, slurmd_start_time=now, boot_time=now)
            for i, name in enumerate(names)
        }
        self._jobs: dict[int, Job] = {}
        self._job_ids = itertools.count(1)
        self.last_update = now
        self._stalled_until = 0.0  # time.monotonic(): RPCs time out until then

    # ----------------------------------------------------------------------------------- stalls

    def stall(self, seconds: float) -> None:
        """slurmctld stops answering RPCs for ``seconds`` (a long scheduling pass, a controller
        failover, a network blip): its clients' calls time out. Its own timers keep running."""
        with self.lock:
            self._stalled_until = max(self._stalled_until, time.monotonic() + seconds)

    def stall_left(self) -> float:
        """Seconds the current stall still lasts (0: slurmctld answers)."""
        return max(0.0, self._stalled_until - time.monotonic())

    # ----------------------------------------------------------------------------------- reads

    def names(self) -> list[str]:
        return list(self._nodes)

    def node(self, name: str) -> CtldNode:
        """A copy of one node (after advancing the timers); SlurmError for an unknown name."""
        with self.lock:
            self.tick()
            return replace(self._get(name), flags=set(self._get(name).flags))

    def base_state(self, node: CtldNode) -> str:
        if node.down:
            return "DOWN"
        return "ALLOCATED" if self._running_on(node.name) else "IDLE"

    def jobs(self) -> list[Job]:
        with self.lock:
            self.tick()
            return [replace(j) for j in self._jobs.values()]

    # ---------------------------------------------------------------------------------- writes

    def update(self, name: str, state: str, reason: str = "", *, user: str = "root") -> None:
        """``scontrol update nodename=NAME state=STATE reason=REASON`` with its real refusals."""
        with self.lock:
            self.tick()
            node = self._get(name)
            now = self.clock()
            state = state.upper()
            if state == "RESUME":
                if not (node.down or node.flags & {"DRAIN", "FAIL"}):
                    raise SlurmError(ERR_INVALID_NODE_STATE, "Invalid node state specified")
                node.flags -= {"DRAIN", "FAIL"}
                if node.down:
                    node.down = False
                    node.flags.add("NOT_RESPONDING")  # until the next ping reaches slurmd
                    node.ping_due = now + self.ping_after_resume_s if node.slurmd_up else None
                    if not node.slurmd_up:
                        node.silent_since = now
                self._set_reason(node, "", "", now=now)
            elif state in ("DRAIN", "FAIL", "DOWN"):
                if state == "DOWN":
                    node.down = True
                    self._end_jobs(node.name, "NODE_FAIL")
                else:
                    node.flags.add(state)
                self._set_reason(node, reason, user, now=now)
            else:
                raise SlurmError(ERR_INVALID_NODE_STATE, "Invalid node state specified")
            self._touch(now)

    def slurmd_stop(self, name: str) -> None:
        """slurmd stops answering (killed, or its VM went down)."""
        with self.lock:
            self.tick()
            node = self._get(name)
            if node.slurmd_up:
                node.slurmd_up = False
                node.silent_since = self.clock()
                node.ping_due = None

    def slurmd_start(self, name: str, *, booted: bool = False, restarted: bool = True) -> None:
        """slurmd (re)starts and registers with slurmctld; ``restarted=False``: a slurmd that kept
        running answers again (its network is back), so its start time stays."""
        with self.lock:
            node = self._get(name)
            now = self.clock()
            node.slurmd_up = True
            node.silent_since = None
            node.ping_due = None
            node.flags.discard("NOT_RESPONDING")
            if restarted or booted:  # whole seconds, as Slurm; a start in the same second is still a new one
                node.slurmd_start_time = max(int(now), node.slurmd_start_time + 1)
            if booted:
                node.boot_time = int(now)
            if node.down and node.reason == "Not responding":  # ReturnToService=1
                node.down = False
                if not node.flags & {"DRAIN", "FAIL"}:
                    self._set_reason(node, "", "", now=now)
            self._touch(now)

    def add_job(
        self, nodes: Iterable[str], seconds: float, *, user: str = "alice", name: str = "train"
    ) -> int:
        with self.lock:
            names = tuple(nodes)
            for n in names:
                self._get(n)
            now = self.clock()
            job = Job(next(self._job_ids), names, user, name, int(now), int(now + seconds))
            self._jobs[job.job_id] = job
            self._touch(now)
            return job.job_id

    # ---------------------------------------------------------------------------------- timers

    def tick(self) -> None:
        """Advance slurmctld's timers: pings, SlurmdTimeout, job ends."""
        with self.lock:
            now = self.clock()
            changed = False
            for job in self._jobs.values():
                if job.state == "RUNNING" and now >= job.end_time:
                    job.state = "COMPLETED"
                    changed = True
            for node in self._nodes.values():
                if node.slurmd_up:
                    if node.ping_due is not None and now >= node.ping_due:
                        node.flags.discard("NOT_RESPONDING")
                        node.ping_due = None
                        changed = True
                    continue
                silent = now - (node.silent_since or now)
                if silent >= self.not_responding_after_s and "NOT_RESPONDING" not in node.flags:
                    node.flags.add("NOT_RESPONDING")
                    changed = True
                if silent >= self.slurmd_timeout_s and not node.down:
                    node.down = True
                    if not node.reason:
                        self._set_reason(node, "Not responding", "slurm", now=now)
                    self._end_jobs(node.name, "NODE_FAIL")
                    changed = True
            if changed:
                self._touch(now)

    # ------------------------------------------------------------------------------- internals

    def _get(self, name: str) -> CtldNode:
        node = self._nodes.get(name)
        if node is None:
            raise SlurmError(ERR_INVALID_NODE_NAME, "Invalid node name specified")
        return node

    def _running_on(self, name: str) -> bool:
        return any(j.state in ACTIVE_JOB_STATES and name in j.nodes for j in self._jobs.values())

    def _end_jobs(self, name: str, state: str) -> None:
        for job in self._jobs.values():
            if job.state in ACTIVE_JOB_STATES and name in job.nodes:
                job.state = state
                job.end_time = int(self.clock())

    @staticmethod
    def _set_reason(node: CtldNode, reason: str, user: str, *, now: float) -> None:
        node.reason, node.reason_user = reason, user if reason else ""
        node.reason_changed_at = int(now) if reason else 0

    def _touch(self, now: float) -> None:
        self.last_update = max(self.last_update, int(now))
