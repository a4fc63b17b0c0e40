"""An in-memory world (Slurm nodes, Kubernetes Nodes, VMs) and the three adapters over it (the VM adapter in
:mod:`remediation.adapters.memory_vm`, imported from here as well).

With ``journal`` set the world lives in a locked JSON file that several worker processes share. Every call
is logged in ``calls`` with an ``effect`` flag; :meth:`MemoryWorld.double_vm_actions` counts actions
performed twice. Knobs: ``op_polls``/``op_seconds``, ``finish_jobs``, ``unblock_pods``, ``vm.fault``,
``call_delay_s``.

Why: docs/benchmarks.md#the-in-memory-world
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from remediation.adapters.memory_vm import MemoryVM as MemoryVM  # its own module; imported from here too
from remediation.ports.cluster import (
    EvictionProgress,
    KubeNode,
    SlurmNode,
)
from remediation.ports.errors import UnknownNode

#: The remediation an idempotency key belongs to: the workflow's keys are ``r<id>:<step>:<attempt>``.
REMEDIATION_IN_KEY = re.compile(r"r(\d+):")


def _node(name: str) -> dict[str, Any]:
    return {
        "slurm": {"state": "IDLE", "flags": [], "reason": "", "reason_user": None, "reason_time": None,
                  "slurmd_start": 1_000_000_000.0},  # long ago: before any test clock's "now"
        "jobs": [],
        "k8s": {"ready": "True", "boot_id": uuid.uuid4().hex, "unschedulable": False, "ours": False,
                "taint": False, "pods": 0, "blocked": 0},
        "vm": {"boots": 1, "broken": False},
    }


def _free_if_idle(d: dict[str, Any]) -> None:
    """As slurmctld does: a node whose last job left is no longer ALLOCATED or MIXED."""
    if not d["jobs"] and d["slurm"]["state"] in ("ALLOCATED", "MIXED", "COMPLETING"):
        d["slurm"]["state"] = "IDLE"
    d["slurm"]["flags"] = [f for f in d["slurm"]["flags"] if d["jobs"] or f not in ("FAILING", "COMPLETING")]


@dataclass(frozen=True)
class OpTiming:
    """When a VM operation completes: after ``polls`` polls of it or, on a simulated ``clock`` (None:
    wall time, and operations count polls), ``seconds`` after it started."""

    polls: int = 1
    clock: Callable[[], datetime] | None = None
    seconds: float | None = None


class MemoryWorld:
    """The simulated cluster. ``mutate()`` is the single way to read-modify-write its state."""

    def __init__(self, nodes: list[str] | None = None, journal: str | Path | None = None,
                 *, timing: OpTiming = OpTiming(), call_delay_s: dict[str, float] | None = None,
                 restart_clears_conditions: bool = False) -> None:
        self.journal = Path(journal) if journal else None
        self._state: dict[str, Any] = {"nodes": {}, "ops": {}, "keys": {}, "calls": []}
        self.op_polls = timing.polls
        self.clock = timing.clock  # the simulated clock; None: wall time, and operations count polls
        self.op_seconds = timing.seconds if timing.clock is not None else None
        # A restart that fixes the VM also clears its problem conditions (the rehearsal's faults); off,
        # conditions stay as a test set them.
        self.restart_clears_conditions = restart_clears_conditions
        self.call_delay_s = call_delay_s or {}
        if self.journal and self.journal.exists():
            with self.mutate():
                pass
        elif nodes:
            with self.mutate() as st:
                for n in nodes:
                    st["nodes"][n] = _node(n)

    @contextlib.contextmanager
    def mutate(self) -> Iterator[dict[str, Any]]:
        if self.journal is None:
            yield self._state
            return
        lock_path = self.journal.with_suffix(".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.journal.exists():
                    self._state = json.loads(self.journal.read_text())
                yield self._state
                tmp = self.journal.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._state))
                os.replace(tmp, self.journal)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def snapshot(self) -> dict[str, Any]:
        with self.mutate() as st:
            copy: dict[str, Any] = json.loads(json.dumps(st))
            return copy

    def calls(self, op: str | None = None, effect: bool | None = None) -> list[dict[str, Any]]:
        return [c for c in self.snapshot()["calls"]
                if (op is None or c["op"] == op) and (effect is None or c["effect"] == effect)]

    def double_vm_actions(self) -> int:
        """VM actions performed beyond the first for the same remediation, VM and rung.

        The remediation is the ``r<id>:`` the workflow writes at the head of every idempotency key (a key
        without one counts for its VM alone, the strictest reading); the rung is told by the action it
        performed, since the provider sees nothing else of the ladder. The key's attempt part plays no
        part: a retry sent under a new key that acted again is a double action, one its key deduplicated
        performed nothing and is not.
        """
        performed = Counter(
            (m[1] if (m := REMEDIATION_IN_KEY.match(c["key"])) else None, c["node"], c["op"])
            for c in self.calls(effect=True) if c["op"].startswith("vm.")
        )
        return sum(n - 1 for n in performed.values())

    def _log(self, st: dict[str, Any], op: str, node: str, *, effect: bool = True, **kw: Any) -> None:
        st["calls"].append({"at": time.time(), "op": op, "node": node, "effect": effect, "pid": os.getpid(), **kw})

    def now_s(self) -> float:
        return self.clock().timestamp() if self.clock is not None else time.time()

    def op_done_at(self, ref: str) -> datetime | None:
        """When a time-based operation finishes (None: it counts polls, or is unknown)."""
        rec = self._state["ops"].get(ref)
        issued = rec and rec["data"].get("issued_at")
        if not issued or self.op_seconds is None:
            return None
        return datetime.fromisoformat(issued) + timedelta(seconds=self.op_seconds)

    def _op_finished(self, data: dict[str, Any]) -> bool:
        if self.clock is not None and self.op_seconds is not None and data.get("issued_at"):
            return self.clock() >= datetime.fromisoformat(data["issued_at"]) + timedelta(seconds=self.op_seconds)
        return bool(data["polls"] >= self.op_polls)

    def _get(self, st: dict[str, Any], name: str) -> dict[str, Any]:
        try:
            return st["nodes"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise UnknownNode(f"Invalid node name specified: {name}") from None

    def _pause(self, op: str) -> None:
        delay = self.call_delay_s.get(op)
        if delay:
            time.sleep(delay)

    # -- test levers (the "outside world" changing) ------------------------------------------------
    def set_slurm(self, name: str, state: str | None = None, flags: list[str] | None = None,
                  *, reason: str | None = None, user: str | None = "admin") -> None:
        with self.mutate() as st:
            s = self._get(st, name)["slurm"]
            if state is not None:
                s["state"] = state
            if flags is not None:
                s["flags"] = flags
            if reason is not None:
                s["reason"], s["reason_user"], s["reason_time"] = reason, user, time.time()

    def set_jobs(self, name: str, jobs: int | list[str]) -> None:
        """Put ``jobs`` (a count, or the job ids) on the node; 0 or [] empties it."""
        ids = [str(1000 + i) for i in range(jobs)] if isinstance(jobs, int) else list(jobs)
        with self.mutate() as st:
            d = self._get(st, name)
            d["jobs"] = ids
            _free_if_idle(d)

    def set_k8s(self, name: str, **fields: Any) -> None:
        with self.mutate() as st:
            self._get(st, name)["k8s"].update(fields)

    def node(self, name: str) -> dict[str, Any]:
        return self.snapshot()["nodes"][name]  # type: ignore[no-any-return]


class MemorySlurm:
    def __init__(self, world: MemoryWorld) -> None:
        self.w = world

    def list_nodes(self) -> list[SlurmNode]:
        delayed = "slurm.list_nodes" in self.w.call_delay_s
        with self.w.mutate() as st:
            nodes = [self._view(n, d) for n, d in st["nodes"].items()]
            if delayed:  # a mark, so that a test can catch the reader inside its delay (after it read)
                self.w._log(st, "slurm.list_nodes", "*", effect=False)
        if delayed:
            self.w._pause("slurm.list_nodes")
        return nodes

    def get_node(self, name: str) -> SlurmNode:
        with self.w.mutate() as st:
            return self._view(name, self.w._get(st, name))

    @staticmethod
    def _view(name: str, d: dict[str, Any]) -> SlurmNode:
        s = d["slurm"]
        at = s.get("reason_time")
        start = s.get("slurmd_start")
        return SlurmNode(name, s["state"], frozenset(s["flags"]), s["reason"], s["reason_user"],
                         datetime.fromtimestamp(at, UTC) if at else None,
                         datetime.fromtimestamp(start, UTC) if start else None)

    def running_jobs(self, name: str) -> int:
        return len(self.jobs_on(name))

    def jobs_on(self, name: str) -> list[str]:
        with self.w.mutate() as st:
            jobs = self.w._get(st, name)["jobs"]
            return sorted(jobs) if isinstance(jobs, list) else [str(1000 + i) for i in range(int(jobs))]

    def requeue_jobs(self, job_ids: list[str]) -> None:
        self._end_jobs("slurm.requeue", job_ids)

    def cancel_jobs(self, job_ids: list[str]) -> None:
        self._end_jobs("slurm.cancel", job_ids)

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        """Logged only: whether a job saves and leaves is the test's to say (``set_jobs``)."""
        self._end_jobs("slurm.signal", job_ids, leave=False, signal=signal, scope=scope)
        self.w._pause("slurm.signal")

    def _end_jobs(self, op: str, job_ids: list[str], leave: bool = True, **kw: Any) -> None:
        """A requeued or cancelled job leaves its node (a requeued one waits in the queue again)."""
        wanted = set(job_ids)
        with self.w.mutate() as st:
            for name, d in st["nodes"].items():
                held = set(d["jobs"]) if isinstance(d["jobs"], list) else set()
                if held & wanted and leave:
                    d["jobs"] = sorted(held - wanted)
                    _free_if_idle(d)
                if held & wanted:
                    self.w._log(st, op, name, effect=True, jobs=sorted(held & wanted), **kw)

    def drain(self, name: str, reason: str) -> None:
        with self.w.mutate() as st:
            s = self.w._get(st, name)["slurm"]
            effect = "DRAIN" not in s["flags"] or s["reason"] != reason
            s["flags"] = sorted(set(s["flags"]) | {"DRAIN"})
            if s["reason"] != reason:
                s["reason_time"] = time.time()
            s["reason"], s["reason_user"] = reason, "root"
            self.w._log(st, "slurm.drain", name, effect=effect, reason=reason)
        self.w._pause("slurm.drain")

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        with self.w.mutate() as st:
            s = self.w._get(st, name)["slurm"]
            if state == "DOWN":
                s["state"] = "DOWN"
            else:
                s["flags"] = sorted(set(s["flags"]) | {"FAIL"})
            s["reason"], s["reason_user"], s["reason_time"] = reason, "root", time.time()
            self.w._log(st, f"slurm.{state.lower()}", name, reason=reason)

    def resume(self, name: str) -> None:
        with self.w.mutate() as st:
            s = self.w._get(st, name)["slurm"]
            effect = bool(set(s["flags"]) & {"DRAIN", "FAIL"}) or s["state"] == "DOWN"
            s["flags"] = [f for f in s["flags"] if f not in ("DRAIN", "FAIL", "NOT_RESPONDING")]
            s["state"] = "IDLE" if s["state"] == "DOWN" else s["state"]
            s["reason"], s["reason_user"], s["reason_time"] = "", None, None
            self.w._log(st, "slurm.resume", name, effect=effect)


class MemoryKube:
    """Kubernetes Node names equal Slurm node names; providerIDs are ``memory:///NAME``."""

    def __init__(self, world: MemoryWorld) -> None:
        self.w = world

    def node_for(self, slurm_node: str) -> str:
        with self.w.mutate() as st:
            self.w._get(st, slurm_node)
        return slurm_node

    def get(self, name: str) -> KubeNode:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            return KubeNode(name, k["ready"], k["boot_id"], f"memory:///{name}", k["unschedulable"],
                            k["ours"] and k["unschedulable"], k["taint"],
                            {**k.get("conditions", {}), "Ready": k["ready"]}, dict(k.get("messages", {})))

    def cordon(self, name: str, reason: str) -> KubeNode:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            already = bool(k["unschedulable"])
            if not already:
                k["unschedulable"], k["ours"] = True, True
            self.w._log(st, "k8s.cordon", name, effect=not already)
        if not already:
            self.w._pause("k8s.cordon")
        return self.get(name)

    def uncordon(self, name: str) -> bool:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            if not (k["unschedulable"] and k["ours"]):
                k["ours"] = False  # a stale mark (a human uncordoned) must not claim a later cordon
                self.w._log(st, "k8s.uncordon", name, effect=False)
                return False
            k["unschedulable"], k["ours"] = False, False
            self.w._log(st, "k8s.uncordon", name)
            return True

    def evict_pods(self, name: str) -> EvictionProgress:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            evictable = k["pods"] - k["blocked"]
            if evictable:
                self.w._log(st, "k8s.evict", name, pods=evictable)
            k["pods"] = k["blocked"]
            blocked = tuple(f"default/pod-{i}" for i in range(k["blocked"]))
            return EvictionProgress(k["pods"], blocked, 1.0 if blocked else None)

    def request_checkpoint(self, name: str, requested_at: datetime, deadline: datetime) -> list[str]:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            if k["pods"] and not k.get("checkpoint"):
                k["checkpoint"] = requested_at.isoformat()
                self.w._log(st, "k8s.checkpoint", name, pods=k["pods"], deadline=deadline.isoformat())
            return [f"default/pod-{i}" for i in range(k["pods"])]

    def set_quarantine_taint(self, name: str, on: bool) -> None:
        with self.w.mutate() as st:
            k = self.w._get(st, name)["k8s"]
            if k["taint"] != on:
                k["taint"] = on
                self.w._log(st, "k8s.taint" if on else "k8s.untaint", name)
