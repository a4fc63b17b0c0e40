"""The world's side of a rehearsal: what a fault does to a node, what a repair by hand undoes, and how
long each node was out of service.

The loop calls :func:`strike` when a fault is due and :func:`repair` when a human's repair lands;
:class:`Fleet` reads the world after every simulated moment and splits node-hours out by fault class.
:class:`WorldJobs` runs the service's jobs on a node (the GPU reset and the GPU check) at the
validator port.

Why: docs/rehearsal.md#how-the-rehearsal-is-built
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from remediation.adapters.memory import MemoryWorld
from remediation.domain.events import Source
from remediation.domain.gpu_reset import PURPOSE as RESET_PURPOSE
from remediation.evidence_collection.rules import PURPOSE as EVIDENCE_PURPOSE
from remediation.rehearsal.goodput import Span
from remediation.rehearsal.trace import Fault
from remediation.validation.port import ValidationCheck, ValidationResult


def strike(world: MemoryWorld, fault: Fault) -> None:
    ev = fault.event
    with world.mutate() as st:
        node = st["nodes"].get(ev.node)
        if node is None:
            return
        if ev.source is Source.SLURM:
            s = node["slurm"]
            if ev.state_upper == "DOWN":
                s["state"], s["flags"] = "DOWN", sorted(set(s["flags"]) | {"NOT_RESPONDING"})
            elif ev.state_upper in ("FAIL", "DRAIN"):
                s["flags"] = sorted(set(s["flags"]) | {ev.state_upper})
            s["reason"], s["reason_user"] = ev.reason, ev.reason_user or "user"
        elif ev.state.startswith("Ready="):
            node["k8s"]["ready"] = ev.state.split("=", 1)[1]
        else:  # a problem condition (GpuXidError=True): the Node reports it until a restart or a repair
            cond, _, status = ev.state.partition("=")
            node["k8s"].setdefault("conditions", {})[cond] = status
        if fault.outcome is not None:
            # The outcome model decides what fixes it: the actions in fixed_by, else hands.
            o = fault.outcome
            node["vm"]["broken"] = True
            node["vm"]["fault"] = {"category": o.category, "fixed_by": sorted(o.fixed_by), "fabric": o.fabric}
        elif not fault.fixed_by_restart:
            node["vm"]["broken"] = True


def repair(world: MemoryWorld, name: str, fabric_only: bool = False) -> None:
    """The hand repair of ``name`` (``fabric_only``: the fabric's repair, which fixes a node only if
    the fabric was what it was waiting for)."""
    with world.mutate() as st:
        node = st["nodes"][name]
        fault = node["vm"].get("fault") or {}
        if fabric_only and not fault.get("fabric"):
            return
        node["vm"]["broken"] = False
        node["vm"]["fault"] = None
        node["k8s"]["ready"] = "True"
        node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
        s = node["slurm"]
        s["flags"] = [f for f in s["flags"] if f != "NOT_RESPONDING"]
        if s["state"] == "DOWN":
            s["state"] = "IDLE"
        if s["reason"].startswith("maintenance"):  # the human who drained it for maintenance resumes it
            s["flags"] = [f for f in s["flags"] if f != "DRAIN"]
            s["reason"] = ""


OUT_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING"})


def in_service(node: dict[str, Any]) -> bool:
    """A node a job could land on: nothing broken, not drained, failed or down, Ready and schedulable."""
    s, k = node["slurm"], node["k8s"]
    return (not node["vm"]["broken"] and s["state"] != "DOWN" and not OUT_FLAGS & set(s["flags"])
            and k["ready"] == "True" and not k["unschedulable"])


class WorldJobs:
    """The rehearsal's validator: a job ends ``reset_s`` (a GPU reset), ``check_s`` (the GPU check) or
    ``evidence_s`` (the evidence job) after it started on the world's clock, and the world decides its exit code."""

    backend = "rehearsal"

    def __init__(self, world: MemoryWorld, clock: Callable[[], datetime], *, reset_s: float, check_s: float,
                 evidence_s: float = 10.0) -> None:
        self.world, self.clock, self.reset_s, self.check_s = world, clock, reset_s, check_s
        self.evidence_s = evidence_s
        self.jobs: dict[str, dict[str, Any]] = {}
        self.resets: list[bool] = []  # every reset that ended, and whether it fixed the node

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        took = self.reset_s if check.purpose == RESET_PURPOSE else self.check_s
        if check.purpose == EVIDENCE_PURPOSE:  # reads the node, changes nothing: ends with no output
            self.jobs.setdefault(check.name, {"node": check.node,
                                              "done_at": self.clock() + timedelta(seconds=self.evidence_s),
                                              "result": ValidationResult(True, 0, "", "COMPLETED")})
            return {"job_ref": check.name}
        self.jobs.setdefault(check.name, {"node": check.node, "reset": check.purpose == RESET_PURPOSE,
                                          "done_at": self.clock() + timedelta(seconds=took), "result": None})
        return {"job_ref": check.name}

    def ends_after(self, ref: dict[str, Any], now: datetime) -> datetime | None:
        """When the job ends, if that is still to come (None: unknown or already ended, poll it)."""
        job = self.jobs.get(str(ref.get("job_ref")))
        return job["done_at"] if job is not None and job["done_at"] > now else None

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        job = self.jobs[ref["job_ref"]]
        if self.clock() < job["done_at"]:
            return ValidationResult(done=False, state="RUNNING")
        if job["result"] is None:
            job["result"] = self._reset(job["node"]) if job["reset"] else self._check(job["node"])
        return job["result"]  # type: ignore[no-any-return]

    def finish(self, ref: dict[str, Any]) -> str:
        return "job ended"

    def _reset(self, name: str) -> ValidationResult:
        with self.world.mutate() as st:
            node = st["nodes"][name]
            fault = node["vm"].get("fault") or {}
            fixed = not node["vm"]["broken"] or "reset" in fault.get("fixed_by", ())
            self.resets.append(fixed)
            if not fixed:
                return ValidationResult(True, 1, "Unable to reset GPU: the GPU is lost; a reboot is required\n",
                                        "FAILED")
            node["vm"].update(broken=False, fault=None)
            node["k8s"]["conditions"] = {c: "False" for c in node["k8s"].get("conditions", {})}
        return ValidationResult(True, 0, "GPU was successfully reset.\n", "COMPLETED")

    def _check(self, name: str) -> ValidationResult:
        with self.world.mutate() as st:
            broken = st["nodes"][name]["vm"]["broken"]
        return ValidationResult(True, 1 if broken else 0, "", "FAILED" if broken else "COMPLETED")


class Fleet:
    """Time out of service per node, read from the world after every simulated moment that touched it,
    in all and by the fault class of the fault that took the node out (``cause``, set by the loop
    through :meth:`struck`), and each span out of service (``spans``) for the job model: whether a
    fault had struck the node since it was last in service, or our own action took a healthy node out."""

    def __init__(self) -> None:
        self.out_since: dict[str, datetime] = {}
        self.hours = 0.0
        self.cause: dict[str, str] = {}  # node -> fault class of its latest fault
        self.by_class: dict[str, float] = defaultdict(float)
        self.by_node: dict[str, float] = defaultdict(float)  # per node: a profile's pool adds its nodes'
        self.spans: list[Span] = []
        self._span_class: dict[str, str] = {}
        self._struck: dict[str, str] = {}  # node -> source of a fault since it was last in service
        self._span_source: dict[str, str | None] = {}  # None: no fault had struck (a false positive)

    def struck(self, name: str, fault_class: str, source: str) -> None:
        """A fault struck ``name``: its class, as the policy reads it, and its signal's source."""
        self.cause[name] = fault_class
        self._struck[name] = source

    def observe(self, world: MemoryWorld, names: list[str], now: datetime) -> None:
        with world.mutate() as st:
            for name in names:
                node = st["nodes"].get(name)
                if node is None:
                    continue
                up = in_service(node)
                if not up and name not in self.out_since:
                    self.out_since[name] = now
                    self._span_class[name] = self.cause.get(name, "-")
                    self._span_source[name] = self._struck.get(name)
                elif up and name in self.out_since:
                    self._add(name, now)

    def _add(self, name: str, now: datetime) -> None:
        since = self.out_since.pop(name)
        hours = (now - since).total_seconds() / 3600
        self.hours += hours
        self.by_node[name] += hours
        fault_class, source = self._span_class.pop(name), self._span_source.pop(name)
        self.by_class[fault_class] += hours
        self.spans.append(Span(name, since, now, fault_class, broken=source is not None, source=source or ""))
        self._struck.pop(name, None)  # back in service: the next span needs a fault of its own

    def close(self, now: datetime) -> float:
        for name in list(self.out_since):
            self._add(name, now)
        return self.hours
