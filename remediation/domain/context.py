"""A remediation's context: every fact its steps learn and later steps decide on, typed.

Every key of the ``remediations.context`` JSON column is declared here, with its type and who writes
it; the JSON keeps its shape. A step returns the keys it learnt as a partial context
(``Done.context``): the fields it sets replace the stored ones (:meth:`RemediationContext.merged`),
the rest stay.

Why: docs/architecture.md#typed-records-kept-as-json
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Self

from remediation.domain.record import JsonRecord
from remediation.ports.cluster import DRY_RUN_REF


@dataclass(frozen=True)
class Held(JsonRecord):
    """An error nobody mapped (or a GPU check that never ended) holds the remediation until a human
    resumes or cancels it (services.holds, services.validation)."""

    kind: str | None = None  # the error's kind, e.g. "unmapped builtins.ValueError" or "ValidationTimeout"
    error: str | None = None  # its message, for people
    at: str | None = None  # ISO time it was held
    step: str | None = None  # the step it was held at
    extra: Mapping[str, Any] = field(default_factory=dict)


#: Keys older rows carry under a retired name -> the field that reads them; only the new name is written.
RENAMED = {"vm_action_at": "machine_action_at", "vm_op_ref": "machine_op_ref"}


@dataclass(frozen=True)
class RemediationContext(JsonRecord):
    # -- the opening event (services.ingest)
    event_state: str | None = None  # the event's state: a Slurm state, or "Type=Status" for a Node condition
    reason: str | None = None  # the event's reason (what Slurm or the condition said)
    observed_at: str | None = None  # ISO time the watcher observed it (stale events are re-checked)
    fault_class: str | None = None  # the fault's class (policy.faults); None: unknown, the default ladder
    cause_class: str | None = None  # the validation's class, where it differs from fault_class
    gpu_pci: str | None = None  # the PCI address of the GPU the XID named ("0000:3b:00"): what gpu-reset resets
    # -- quarantine (ingest, the engine's escalation, levers)
    quarantine_reason: str | None = None  # why the node is quarantined, for people
    quarantine_decided: bool | None = None  # opened straight into quarantine on this failure (N-in-W, lemon)
    quarantine_taken_back: str | None = None  # an incident explained that failure: the cause it took back
    rma: bool | None = None  # the quarantine is for hardware to return (its reason says RMA): a repair request opens
    # -- a repair request's re-check (remediation.repair_requests): the request whose "done" opened it
    repair_request: int | None = None
    # -- k8s_cordon
    k8s_node: str | None = None  # the Kubernetes Node of the Slurm node
    boot_id_before: str | None = None  # its bootID before any machine action (verify wants a new one)
    provider_id: str | None = None  # its providerID: which VM the machine actions act on
    we_cordoned: bool | None = None  # the cordon is ours (a human's cordon placed first is never ours)
    # -- the site (the engine, at the first claim): a half it lacks, whose steps this remediation skips
    no_kubernetes: bool | None = None  # kube.backend none: nothing cordoned, evicted or tainted
    no_machine: bool | None = None  # machine.backend none: nothing restarted, moved or reimaged, nothing verified
    # -- collect_evidence
    evidence_at: str | None = None  # ISO: when the node's state was last collected (or found uncollectable)
    no_evidence: str | None = None  # why the node's state could not be kept, where the site runs no job
    # -- vm_restart
    machine_action_at: str | None = None  # ISO start of the attempt that completed a machine action
    machine_op_ref: str | None = None  # the completed operation's reference
    machine_op_recorded: bool | None = None  # the dry-run twin recorded the action, never issued it
    slurmctld_action_at: str | None = None  # ISO: when slurmctld took it, on its clock (Slurm's reboot); ""
    slurmd_start_before: str | None = None  # ISO: slurmd's start as slurmctld had it before the action; "" none
    # -- admission and holds
    reconfirm: bool | None = None  # re-confirm the trigger before the next disruptive step (breaker, incident)
    incident: int | None = None  # the incident the remediation joined
    domain_repair: int | None = None  # the domain repair its return handed the tray to (the domain check decides)
    incident_closed: int | None = None  # the incident whose close asked for the re-confirmation
    held: Held | None = None  # held for a human; None: not held
    # Keys this version does not know, kept as they were.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, raw: Mapping[str, Any] | None) -> Self:
        """Read a row, a key under its retired name as its field (the new name wins if both are there)."""
        if isinstance(raw, Mapping) and not RENAMED.keys().isdisjoint(raw):
            raw = {RENAMED.get(k, k): v for k, v in raw.items() if RENAMED.get(k) not in raw}
        return super().load(raw)

    @property
    def machine_op_recorded_only(self) -> bool:
        """The machine action was recorded by the dry-run twin, never issued: nothing to verify."""
        if self.machine_op_recorded is not None:
            return self.machine_op_recorded
        # A row written before the flag: the dry-run twin named every reference it recorded so.
        return (self.machine_op_ref or "").startswith(DRY_RUN_REF)

    def merged(self, patch: RemediationContext) -> RemediationContext:
        """This context with every field ``patch`` sets (not None) replaced."""
        changes = {f.name: getattr(patch, f.name) for f in fields(patch)
                   if f.name != "extra" and getattr(patch, f.name) is not None}
        return replace(self, **changes, extra={**self.extra, **patch.extra})

    @property
    def observed(self) -> datetime | None:
        return datetime.fromisoformat(self.observed_at) if self.observed_at else None

    @property
    def condition(self) -> tuple[str, str]:
        """The Node condition that opened it and its bad status ("Ready=False": Ready, False)."""
        cond_type, _, bad = (self.event_state or "").partition("=")
        return cond_type, bad
