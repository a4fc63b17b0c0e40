"""Where work goes after a lever or an ingest commits: the port the entry points fill.

Whoever builds a :class:`remediation.services.levers.LeverService` passes it a dispatcher: the Celery
one (:class:`remediation.adapters.celery.CeleryDispatcher`) in production, :class:`SweeperOnly` where
there is no broker.

Why: docs/architecture.md#without-a-broker-the-sweeper-resumes-the-work
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

log = logging.getLogger(__name__)


class Hint(StrEnum):
    """Why a step waits, for a scheduler that can do better than a countdown (the rehearsal's event
    loop; Celery ignores it)."""

    NONE = ""  # anything else: run it after its countdown
    ADMISSION = "admission"  # admission refused the step; its verdict may change with the cluster view
    ADMISSION_NEW_MACHINE = "admission:new_machine"  # refused a step that would start a machine action
    WAIT = "wait"  # the step body asked to look again (an operation, a reboot, jobs or pods leaving)
    INCIDENT = "incident"  # held by an open incident: nothing changes until the incident closes


@dataclass(frozen=True)
class FollowUp:
    """A step to enqueue after the commit. ``due``: the remediation's ``next_run_at`` this delivery was
    scheduled as. Once the remediation is scheduled anew (it ran, or the sweeper re-sent it), a delivery
    still carrying the old ``due`` is superseded and dropped unrun, so a re-send never starts a second
    chain of polls. None: accepted whenever it arrives (work queued from outside the workflow).
    Why: docs/architecture.md#without-a-broker-the-sweeper-resumes-the-work"""

    remediation_id: int
    step: str
    countdown: float = 0.0
    hint: Hint = Hint.NONE
    due: datetime | None = None
    # A hold that ends by time alone (an incident's grace period) ends then: a scheduler that can do
    # better than a countdown may skip the looks before it. None: no such end is known.
    not_before: datetime | None = None


class Dispatcher(Protocol):
    def steps(self, followups: Sequence[FollowUp | None]) -> None: ...

    def release(self, audit_id: int) -> None:
        """Undo our quarantine as the committed human release in audit row ``audit_id`` asked."""
        ...


class SweeperOnly:
    """No broker: steps wait for the sweeper; a release cannot be carried out."""

    def steps(self, followups: Sequence[FollowUp | None]) -> None:
        if any(followups):
            log.info("no dispatcher installed; the sweeper will pick up %d step(s)", len(followups))

    def release(self, audit_id: int) -> None:
        raise RuntimeError("no dispatcher installed: cannot queue release actions")
