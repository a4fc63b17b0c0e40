"""The states of the rows beside a remediation: a step attempt, a GPU check, an incident, an audit row.

Each is spelled once here and typed all the way down to its column (``remediation/db/models.py``), so
that no code compares a state with a string (docs/architecture.md, "States are enums down to the
column").
"""

from __future__ import annotations

from enum import StrEnum

from remediation.domain.statemachine import RemediationStatus


class StepStatus(StrEnum):
    """One attempt of a step (``remediation_steps.status``): written ``started`` before the outside call."""

    STARTED = "started"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"


#: An attempt still in flight: a redelivered task resumes it rather than starting another.
LIVE_STEP_STATUSES = frozenset({StepStatus.STARTED, StepStatus.WAITING})


class ValidationOutcome(StrEnum):
    """How a GPU check (or a GPU reset, run the same way) ended (``validations.outcome``)."""

    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"  # not done by its deadline, or the backend's own limit ended it
    NO_RESULT = "no_result"  # cancelled, its node failed, or its record and output are gone
    CANNOT_RUN = "cannot_run"  # exit 126 or 127: the check is missing, not the GPUs bad
    DRY_RUN = "dry_run"  # recorded only, never run


class IncidentStatus(StrEnum):
    """A topology-correlated incident (``incidents.status``): open until it recovers or a human resolves it."""

    OPEN = "open"
    RECOVERED = "recovered"
    RESOLVED = "resolved"


class AuditAction(StrEnum):
    """What an audit row records (``audit_log.action``): a human lever or an automated action."""

    # Human levers (the CLI, the API, the dashboard)
    PAUSE = "pause"
    RESUME = "resume"
    QUARANTINE = "quarantine"
    RELEASE = "release"
    RELEASE_DONE = "release_done"
    CANCEL = "cancel"
    UNHOLD = "unhold"
    REPORT = "report"
    # The workflow
    OPEN = "open"
    ESCALATE = "escalate"
    HOLD = "hold"
    FAULT_HOLD = "fault_hold"
    UNPROVEN_HOLD = "unproven_hold"
    JOBS_TIMEOUT = "jobs_timeout"
    JOBS_REQUEUED = "jobs_requeued"
    JOBS_CANCELLED = "jobs_cancelled"
    CHECKPOINT_REQUESTED = "checkpoint_requested"
    VALIDATION_HELD = "validation_held"
    QUARANTINE_TAKEN_BACK = "quarantine_taken_back"
    REMEDIATION_SUCCEEDED = "remediation_succeeded"
    REMEDIATION_QUARANTINED = "remediation_quarantined"
    REMEDIATION_CANCELLED = "remediation_cancelled"
    REMEDIATION_FAILED = "remediation_failed"
    # The storm breaker and incidents
    BREAKER_OPEN = "breaker_open"
    BREAKER_CLOSED = "breaker_closed"
    INCIDENT_OPENED = "incident_opened"
    INCIDENT_JOINED = "incident_joined"
    INCIDENT_RECOVERED = "incident_recovered"
    INCIDENT_RESOLVED = "incident_resolved"
    # A domain repair (remediation.domain_repair): one ladder for a whole NVLink domain
    DOMAIN_REPAIR_OPENED = "domain_repair_opened"
    DOMAIN_REPAIR_JOINED = "domain_repair_joined"
    DOMAIN_REPAIR_RETURNED = "domain_repair_returned"
    DOMAIN_REPAIR_QUARANTINED = "domain_repair_quarantined"
    DOMAIN_REPAIR_CANCELLED = "domain_repair_cancelled"
    PARTIAL_DOMAIN = "partial_domain"  # the healthy rest of a partial block drained, or given back
    # A repair request (remediation.repair_requests): hardware handed to the site's repair system
    REPAIR_REQUESTED = "repair_requested"
    REPAIR_DELIVERY_FAILED = "repair_delivery_failed"
    REPAIR_DONE = "repair_done"  # the repair system or on-call says it is repaired: the re-check opens
    REPAIR_ABANDONED = "repair_abandoned"
    REPAIR_RETURNED = "repair_returned"  # the re-check passed
    REPAIR_NEW_HARDWARE = "repair_new_hardware"  # the re-check saw other hardware than the request named
    # A GPU check a human asked for: ``validate`` or ``release --validate``, started and ended
    VALIDATE_STARTED = "validate_started"
    VALIDATE_PASSED = "validate_passed"
    VALIDATE_FAILED = "validate_failed"
    VALIDATE_TIMEOUT = "validate_timeout"
    VALIDATE_NO_RESULT = "validate_no_result"
    VALIDATE_CANNOT_RUN = "validate_cannot_run"
    VALIDATE_DRY_RUN = "validate_dry_run"
    RELEASE_VALIDATE_STARTED = "release_validate_started"
    RELEASE_VALIDATE_PASSED = "release_validate_passed"
    RELEASE_VALIDATE_FAILED = "release_validate_failed"
    RELEASE_VALIDATE_TIMEOUT = "release_validate_timeout"
    RELEASE_VALIDATE_NO_RESULT = "release_validate_no_result"
    RELEASE_VALIDATE_CANNOT_RUN = "release_validate_cannot_run"
    RELEASE_VALIDATE_DRY_RUN = "release_validate_dry_run"

    @property
    def closes_a_remediation(self) -> bool:
        """The row a remediation's close writes (its timeline tells the close already)."""
        return self in REMEDIATION_CLOSES.values()


#: The audit action a remediation's close writes, by the status it closed with.
REMEDIATION_CLOSES = {
    RemediationStatus.SUCCEEDED: AuditAction.REMEDIATION_SUCCEEDED,
    RemediationStatus.QUARANTINED: AuditAction.REMEDIATION_QUARANTINED,
    RemediationStatus.CANCELLED: AuditAction.REMEDIATION_CANCELLED,
    RemediationStatus.FAILED: AuditAction.REMEDIATION_FAILED,
}
#: The audit action an incident's close writes, by the status it closed with.
INCIDENT_CLOSES = {IncidentStatus.RECOVERED: AuditAction.INCIDENT_RECOVERED,
                   IncidentStatus.RESOLVED: AuditAction.INCIDENT_RESOLVED}


class CheckPurpose(StrEnum):
    """Why a human ran a GPU check: its audit rows are named for it."""

    VALIDATE = "validate"
    RELEASE_VALIDATE = "release_validate"

    def started(self) -> AuditAction:
        return AuditAction(f"{self.value}_started")

    def ended(self, outcome: ValidationOutcome) -> AuditAction:
        return AuditAction(f"{self.value}_{outcome.value}")
