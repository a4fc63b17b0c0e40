"""What each workflow step records on its row: one typed record per step.

A step body returns its record in the outcome; the engine merges ``dump()`` into the row's JSON
``detail``, beside the engine's own keys (:mod:`remediation.domain.stepdetail`), under the key names
the CLI, the API and the dashboard read. ``load()`` reads any row, old or written by hand: a missing
or malformed value reads as "not recorded". docs/architecture.md, "A step runs in three phases".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TypeVar

from remediation.domain.statemachine import Step
from remediation.domain.states import ValidationOutcome
from remediation.domain.stepdetail import Json, Stored, read_number, read_strs, read_text, read_time
from remediation.evidence_collection.rules import Item, JournalLine
from remediation.ports.cluster import HardwareIdentity, VMAction

E = TypeVar("E", bound=StrEnum)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _jobs(jobs: tuple[str, ...] | None) -> Json:
    """The jobs a step found on the node (``jobs``, ``job_count``); nothing when it did not look."""
    return {} if jobs is None else {"jobs": list(jobs), "job_count": len(jobs)}


@dataclass(frozen=True)
class StepDetail:
    """A step's record; this base records nothing (``k8s_cordon`` and ``return`` keep their word in
    the row's ``outcome``)."""

    def dump(self) -> Json:
        return {}

    @classmethod
    def load(cls, stored: Stored | None) -> StepDetail:
        return cls()


@dataclass(frozen=True)
class JobRecord:
    """One job run on the node (the GPU check, a GPU reset) as the database keeps it. A stored record
    without its times or outcome reads as no record."""

    started_at: datetime
    finished_at: datetime
    outcome: ValidationOutcome
    backend: str = ""
    name: str = ""
    node: str = ""
    cause_class: str = "unknown"
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    state: str = ""  # the backend's word for how it ended
    duration_s: float = 0.0
    output: str = ""  # the end of its output

    def dump(self) -> Json:
        return {
            "backend": self.backend, "name": self.name, "node": self.node, "cause_class": self.cause_class,
            "command": list(self.command), "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(), "outcome": self.outcome.value,
            "exit_code": self.exit_code, "state": self.state, "duration_s": self.duration_s, "output": self.output,
        }  # fmt: skip

    @classmethod
    def load(cls, stored: object) -> JobRecord | None:
        if not isinstance(stored, Mapping):
            return None
        started, finished = read_time(stored.get("started_at")), read_time(stored.get("finished_at"))
        outcome = _member(ValidationOutcome, stored.get("outcome"))
        if started is None or finished is None or outcome is None:
            return None
        code = read_number(stored.get("exit_code"))
        return cls(started, finished, outcome, read_text(stored.get("backend")),
                   read_text(stored.get("name")), read_text(stored.get("node")),
                   read_text(stored.get("cause_class")) or "unknown", read_strs(stored.get("command")) or (),
                   int(code) if code is not None else None, read_text(stored.get("state")),
                   read_number(stored.get("duration_s")) or 0.0, read_text(stored.get("output")))


@dataclass(frozen=True)
class Identity:
    """Who the machine's hardware is (``hardware``), or why that could not be read (``hardware_error``):
    recorded, never decided on."""

    hardware: HardwareIdentity | None = None
    error: str | None = None

    def dump(self) -> Json:
        out: Json = {}
        if self.hardware is not None:
            out["hardware"] = self.hardware.to_dict()
        if self.error is not None:
            out["hardware_error"] = self.error
        return out

    @classmethod
    def load(cls, stored: Stored) -> Identity:
        return cls(_hardware(stored.get("hardware")), read_text(stored.get("hardware_error")) or None)


def _hardware(stored: object) -> HardwareIdentity | None:
    if not isinstance(stored, Mapping) or not isinstance(provider := stored.get("provider"), str):
        return None
    fields = ("instance_id", "host", "bmc_uuid", "bmc_serial", "sku")
    given = {k: v if isinstance(v := stored.get(k), str) else None for k in fields}
    return HardwareIdentity(provider, given["instance_id"], given["host"], given["bmc_uuid"],
                            given["bmc_serial"], given["sku"])


@dataclass(frozen=True)
class DrainDetail(StepDetail):
    """``slurm_drain``: the jobs it waits for, and what it did about them at the deadline
    (:mod:`remediation.domain.jobsafety`)."""

    jobs: tuple[str, ...] | None = None  # None: not looked at by this write
    acted: tuple[str, ...] | None = None  # jobs requeued or cancelled once: never acted on (and paged) again
    timeout_paged: bool = False  # on-call was paged about the jobs holding the node

    def dump(self) -> Json:
        out = _jobs(self.jobs)
        if self.acted is not None:
            out["jobs_acted"] = list(self.acted)
        if self.timeout_paged:
            out["jobs_timeout_paged"] = True
        return out

    @classmethod
    def load(cls, stored: Stored | None) -> DrainDetail:
        stored = stored or {}
        return cls(read_strs(stored.get("jobs")), read_strs(stored.get("jobs_acted")),
                   stored.get("jobs_timeout_paged") is True)


@dataclass(frozen=True)
class EvictDetail(StepDetail):
    """``k8s_evict``: the pods left and those a disruption budget blocks, or the jobs it waits for."""

    jobs: tuple[str, ...] | None = None
    remaining: int | None = None
    blocked: tuple[str, ...] | None = None

    def dump(self) -> Json:
        out = _jobs(self.jobs)
        if self.remaining is not None:
            out["remaining"] = self.remaining
        if self.blocked is not None:
            out["blocked"] = list(self.blocked)
        return out

    @classmethod
    def load(cls, stored: Stored | None) -> EvictDetail:
        stored = stored or {}
        remaining = read_number(stored.get("remaining"))
        return cls(read_strs(stored.get("jobs")), int(remaining) if remaining is not None else None,
                   read_strs(stored.get("blocked")))


@dataclass(frozen=True)
class MachineDetail(StepDetail):
    """``vm_restart``: slurmd's start before the action (read in a write of its own, so that a worker
    killed inside the provider's call resumes with the start from before it), the hardware before and
    after, and on a ``gpu-reset`` rung the reset job's record."""

    jobs: tuple[str, ...] | None = None
    slurmd_read: bool = False  # slurmd's start was read before the action (the time may be unknown)
    slurmd_start_before: datetime | None = None
    identity: Identity = field(default_factory=Identity)
    after_action: VMAction | None = None  # the identity was read after this action
    gpu_reset: JobRecord | None = None
    undone: str | None = None  # what taking the reset job's set-up down did

    def dump(self) -> Json:
        out = _jobs(self.jobs)
        if self.slurmd_read:
            out["slurmd_start_before"] = _iso(self.slurmd_start_before) or ""
        out.update(self.identity.dump())
        if self.after_action is not None:
            out["after_action"] = str(self.after_action)
        if self.gpu_reset is not None:
            out["gpu_reset"] = self.gpu_reset.dump()
        if self.undone is not None:
            out["undone"] = self.undone
        return out

    @classmethod
    def load(cls, stored: Stored | None) -> MachineDetail:
        stored = stored or {}
        before = stored.get("slurmd_start_before")
        action = stored.get("after_action")
        return cls(read_strs(stored.get("jobs")), isinstance(before, str), read_time(before), Identity.load(stored),
                   _member(VMAction, action), JobRecord.load(stored.get("gpu_reset")),
                   _maybe_text(stored.get("undone")))


def _maybe_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _member(kind: type[E], value: object) -> E | None:
    """``value`` as a member of ``kind``; None for anything else (a word a later release wrote)."""
    if not isinstance(value, str):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class VerifyDetail(StepDetail):
    """``verify``: the Kubernetes bootID that proved the reboot."""

    boot_id: str | None = None

    def dump(self) -> Json:
        return {"boot_id": self.boot_id} if self.boot_id is not None else {}

    @classmethod
    def load(cls, stored: Stored | None) -> VerifyDetail:
        return cls(_maybe_text((stored or {}).get("boot_id")))


@dataclass(frozen=True)
class GpuCheckDetail(StepDetail):
    """``validate``: the GPU check's record, and what taking its set-up down did."""

    validation: JobRecord | None = None
    undone: str | None = None

    def dump(self) -> Json:
        out: Json = {}
        if self.validation is not None:
            out["validation"] = self.validation.dump()
        if self.undone is not None:
            out["undone"] = self.undone
        return out

    @classmethod
    def load(cls, stored: Stored | None) -> GpuCheckDetail:
        stored = stored or {}
        return cls(JobRecord.load(stored.get("validation")), _maybe_text(stored.get("undone")))


@dataclass(frozen=True)
class QuarantineDetail(StepDetail):
    """``quarantine``: the hardware kept out."""

    identity: Identity = field(default_factory=Identity)

    def dump(self) -> Json:
        return self.identity.dump()

    @classmethod
    def load(cls, stored: Stored | None) -> QuarantineDetail:
        return cls(Identity.load(stored or {}))


@dataclass(frozen=True)
class EvidenceDetail(StepDetail):
    """``collect_evidence``: what the job kept (its items travel to the engine whole, which stores their
    content apart: the row keeps a line per item), what became of the journal line, and why there is
    no evidence where there is none."""

    items: tuple[Item, ...] = ()
    journal: JournalLine | None = None
    job: str = ""
    none: str = ""  # "no evidence: why"; empty when the job ran

    def dump(self) -> Json:
        out: Json = {"evidence": [{"name": i.name, "status": i.status.value, "exit_code": i.exit_code,
                                   "bytes": len(i.content), "truncated": i.truncated} for i in self.items]}
        if self.journal is not None:
            out["journal"] = self.journal.value
        if self.job:
            out["job"] = self.job
        if self.none:
            out["no_evidence"] = self.none
        return out

    @classmethod
    def load(cls, stored: Stored | None) -> EvidenceDetail:
        stored = stored or {}
        return cls(journal=_member(JournalLine, stored.get("journal")), job=read_text(stored.get("job")) or "",
                   none=read_text(stored.get("no_evidence")) or "")


@dataclass(frozen=True)
class ReturnDetail(QuarantineDetail):
    """``return`` of a repair request's re-check: the hardware that comes back (new hardware, if the
    repair changed it); any other return records nothing."""

    @classmethod
    def load(cls, stored: Stored | None) -> ReturnDetail:
        return cls(Identity.load(stored or {}))


#: The record each step writes (``k8s_cordon`` records nothing; ``return`` only a re-check's hardware).
RECORDS: dict[Step, type[StepDetail]] = {
    Step.SLURM_DRAIN: DrainDetail, Step.K8S_CORDON: StepDetail, Step.K8S_EVICT: EvictDetail,
    Step.COLLECT_EVIDENCE: EvidenceDetail,
    Step.VM_RESTART: MachineDetail, Step.VERIFY: VerifyDetail, Step.VALIDATE: GpuCheckDetail,
    Step.RETURN: ReturnDetail, Step.QUARANTINE: QuarantineDetail,
}  # fmt: skip


def load_detail(step: Step | str, stored: Stored | None) -> StepDetail:
    """The record of a stored row of ``step`` (a step this code does not know: the empty record)."""
    known = _member(Step, str(step))
    return RECORDS.get(known, StepDetail).load(stored) if known is not None else StepDetail.load(stored)


def dumped(detail: StepDetail | None) -> Json:
    """What an outcome's record adds to the row's ``detail`` (nothing for no record)."""
    return detail.dump() if detail is not None else {}
