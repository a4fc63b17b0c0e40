"""No-op adapters for dry-run: they record what would have been done and change nothing.

Reads go to a real reader when one is given, else answer with a healthy, idle world. The no-op Node
reports a fresh bootID on every read, so ``VERIFY`` passes and the steps say "would restart ...".

Why: docs/policy.md#honest-dry-run
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from remediation.ports.cluster import (
    DRY_RUN_REF,
    EvictionProgress,
    KubeNode,
    KubeNodes,
    MachinesByNode,
    Operation,
    OperationStatus,
    SlurmControl,
    SlurmNode,
    VMAction,
    VMRef,
)
from remediation.validation.port import Backend, ValidationCheck, ValidationResult

log = logging.getLogger("remediation.dry_run")


@dataclass
class Recorder:
    """What the no-op adapters would have done, in order."""

    actions: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, what: str, **kw: Any) -> None:
        entry = {"at": datetime.now(UTC).isoformat(), "would": what, **kw}
        self.actions.append(entry)
        log.info("dry-run: would %s %s", what, kw)


class NoopSlurm:
    def __init__(self, reader: SlurmControl | None = None, recorder: Recorder | None = None) -> None:
        self.reader = reader
        self.record = recorder or Recorder()

    def list_nodes(self) -> list[SlurmNode]:
        return self.reader.list_nodes() if self.reader else []

    def get_node(self, name: str) -> SlurmNode:
        if self.reader:
            return self.reader.get_node(name)
        return SlurmNode(name, "IDLE")

    def running_jobs(self, name: str) -> int:
        return len(self.jobs_on(name))

    def jobs_on(self, name: str) -> list[str]:
        # The real jobs, when a reader is given: a dry run says honestly that it "would wait for"
        # them (it does not wait: nothing was drained, so it would wait for ever).
        return self.reader.jobs_on(name) if self.reader else []

    def requeue_jobs(self, job_ids: list[str]) -> None:
        self.record("requeue jobs", jobs=list(job_ids))

    def cancel_jobs(self, job_ids: list[str]) -> None:
        self.record("cancel jobs", jobs=list(job_ids))

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        self.record("signal jobs", jobs=list(job_ids), signal=signal, scope=scope)

    def drain(self, name: str, reason: str) -> None:
        self.record("drain", node=name, reason=reason)

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        self.record(f"set {state}", node=name, reason=reason)

    def resume(self, name: str) -> None:
        self.record("resume", node=name)


class NoopKube:
    def __init__(self, reader: KubeNodes | None = None, recorder: Recorder | None = None) -> None:
        self.reader = reader
        self.record = recorder or Recorder()

    def node_for(self, slurm_node: str) -> str:
        return self.reader.node_for(slurm_node) if self.reader else slurm_node

    def get(self, name: str) -> KubeNode:
        provider_id = self.reader.get(name).provider_id if self.reader else f"memory:///{name}"
        return KubeNode(name, "True", f"dry-run-{uuid.uuid4().hex[:8]}", provider_id)

    def cordon(self, name: str, reason: str) -> KubeNode:
        self.record("cordon", node=name, reason=reason)
        return self.get(name)  # as it stands: nothing was written, so no cordon of ours

    def uncordon(self, name: str) -> bool:
        self.record("uncordon", node=name)
        return True

    def evict_pods(self, name: str) -> EvictionProgress:
        self.record("evict pods", node=name)
        return EvictionProgress(0)

    def request_checkpoint(self, name: str, requested_at: datetime, deadline: datetime) -> list[str]:
        self.record("annotate pods with a checkpoint request", node=name, deadline=deadline.isoformat())
        return []  # as evict_pods: the twin reads no pods, so it never waits on one

    def set_quarantine_taint(self, name: str, on: bool) -> None:
        self.record("taint" if on else "untaint", node=name)


class NoopMachine:
    def __init__(self, recorder: Recorder | None = None) -> None:
        self.record = recorder or Recorder()

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        self.record(str(action), vm=vm.provider_id or vm.name, key=idempotency_key)
        return Operation(vm.provider, f"{DRY_RUN_REF}{idempotency_key}", action, vm, recorded_only=True)

    def poll(self, op: Operation) -> OperationStatus:
        return OperationStatus(done=True)


class NoopMachineByNode(NoopMachine):
    """Dry-run's twin of ``auto`` beside a bare-metal inventory: it finds a node's machine as the real
    router does (the inventory's BMC, else None: the Node's providerID), and records the action."""

    def __init__(self, finder: MachinesByNode, recorder: Recorder | None = None) -> None:
        super().__init__(recorder)
        self.finder = finder

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef | None:
        return self.finder.machine_of(node, k8s_node)


class NoopSlurmReboot(NoopMachine):
    """Dry-run's Slurm reboot (``machine.backend = slurm``): the machine is the Slurm node, as for the real
    one, so a dry run needs no providerID either; the reboot is recorded, never asked for."""

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef:
        return VMRef("slurm", node)

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        self.record("slurm reboot", node=vm.name, action=str(action), key=idempotency_key)
        return Operation(vm.provider, f"{DRY_RUN_REF}{idempotency_key}", action, vm, recorded_only=True)


@dataclass
class NoopValidator:
    """Dry-run's validation: records the check (or the GPU reset) it would run; reports it done with no
    exit code, which the step records as "would ..." (never a pass or a fail, never a verdict)."""

    recorder: Recorder = field(default_factory=Recorder)
    backend: str = Backend.NOOP

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        """One record per check; a check across several nodes (the domain check) names them all."""
        spans = {"nodes": list(check.nodes)} if check.nodes else {}
        self.recorder(check.purpose, node=check.node, name=check.name, command=list(check.command), **spans)
        return {"backend": "noop", "name": check.name, "node": check.node, "dry_run": True, **spans}

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        return ValidationResult(done=True, exit_code=None, state="DRY-RUN")

    def finish(self, ref: dict[str, Any]) -> str:
        return "nothing to take down (dry-run)"
