"""The validation's port: run one check on a node (or one check across several: an NVLink domain) before
anyone else's job can land there.

It also runs the GPU reset (:mod:`remediation.domain.gpu_reset`). Implementations: Slurm
(:mod:`remediation.adapters.slurm.validator`), Kubernetes (:mod:`remediation.adapters.kube.validator`)
and ``NoopValidator`` for dry-run. Every call is idempotent and never blocks: ``start`` with a used name
finds that check, ``poll`` looks once, ``finish`` undoes the set-up and may be repeated.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ValidationCheck:
    """One check to run: ``name`` is derived from the remediation (or the human's request) and names
    the reservation, the job and the Job, so that a repeat finds what the first call made. ``nonce`` is
    the random part of that name the step recorded before the check started: a job found by the name is
    taken for this check only if it carries the nonce and is the service's own (its user, reservation
    and node), never because it bears the name."""

    node: str
    name: str
    command: tuple[str, ...]
    timeout_s: float
    cause_class: str = "unknown"
    purpose: str = "validate"  # what the job is for, as dry-run records it: validate, or reset GPU
    nonce: str = ""  # the random part of ``name``; empty for a check started before it was recorded
    #: Every node one check spans at once (one job over the NVLink domain); empty: ``node`` alone. ``node``
    #: is the node the check is recorded under (the remediation's).
    nodes: tuple[str, ...] = ()
    #: Bytes of output a poll reads back (its end); 0: ``validation.output_bytes``. The evidence job's
    #: outputs are its record, so it asks for all it can write.
    output_bytes: int = 0

    def __post_init__(self) -> None:
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"check {self.name}: a node is named twice in {self.nodes!r:.200}")

    @property
    def targets(self) -> tuple[str, ...]:
        """The nodes the check runs on: ``nodes``, or ``node`` alone."""
        return self.nodes or (self.node,)


@dataclass(frozen=True)
class ValidationResult:
    """What one look at a running check saw. ``done`` with ``exit_code`` 0 is a pass."""

    done: bool
    exit_code: int | None = None
    output: str = ""  # the end of the check's output (the caller keeps the last validation.output_bytes)
    state: str = ""  # the backend's word for it: RUNNING, COMPLETED, FAILED, TIMEOUT, DeadlineExceeded...
    timed_out: bool = False  # the backend's own deadline ended it
    waiting: str = ""  # why it has not started yet (pending reason), for on-call
    run_s: float | None = None  # the check's own run time as the backend measured it, when it says

    @property
    def passed(self) -> bool:
        return self.done and not self.timed_out and self.exit_code == 0


class Backend(StrEnum):
    """What runs a job on a node: the validation's backends (``validation.backend``) and the no-op."""

    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    NOOP = "noop"


#: The most output any job's poll reads back, whatever its reference says (a row is data).
OUTPUT_BYTES_MAX = 64 * 1024 * 1024


def output_limit(ref: dict[str, Any], default: int) -> int:
    """The bytes of output a poll of ``ref`` reads: what the check asked for, within bounds."""
    asked = ref.get("output_bytes")
    return min(asked, OUTPUT_BYTES_MAX) if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 \
        else default


@runtime_checkable
class Validator(Protocol):
    backend: str

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        """Set up (reservation or Job) and start the check; returns what ``poll`` and ``finish`` need (recorded on
        the step before anyone waits on it)."""
        ...

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        ...

    def finish(self, ref: dict[str, Any]) -> str:
        """Undo the set-up (stop a check still running); returns what was done, for the step row."""
        ...

