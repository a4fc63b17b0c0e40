"""The states of the rows beside a remediation: a step attempt, a GPU check, an incident.

Each is spelled once here and typed all the way down to its column (``remediation/db/models.py``), so
that no code compares a state with a string (docs/architecture.md, "Typed state, never text").
"""

from __future__ import annotations

from enum import StrEnum


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
