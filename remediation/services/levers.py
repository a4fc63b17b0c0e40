"""The one lever service: every on-call lever, one transaction each, then the follow-up work.

The CLI and the API (JSON routes and dashboard forms alike) call this class and only format what it
returns, so a release from the terminal, from ``curl`` and from the browser write the same audit row
and queue the same work. The transactional rules live in :mod:`remediation.services.lever_rules`; this class
adds what every caller needs around them: the session, the clock, and the dispatcher it was given
(never a global), used only after the commit so a follow-up never runs against uncommitted state.

Every audit row it writes records the door the lever came through (``via``, see
:mod:`remediation.services.audit`): the API builds it with ``via="api"``, the CLI in direct database mode
with ``via="db"``.

A release (and a cancel with ``give_back``) is committed even when its undo in Slurm and Kubernetes
cannot be queued; the result says so (``undo_error``) and the caller tells the human what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from remediation.domain.policy import Clock
from remediation.domain.profiles import Governance
from remediation.ports.dispatch import Dispatcher, FollowUp
from remediation.services import incidents, lever_rules
from remediation.services.audit import Via, through
from remediation.settings import PolicySettings


@dataclass(frozen=True)
class Undo:
    """A lever that hands our drain, cordon and taint back: which node, and whether that was queued."""

    node: str
    error: Exception | None = None

    @property
    def queued(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Cancelled:
    remediation_id: int
    node: str
    step: str
    undo: Undo | None  # only with give_back


class LeverService:
    def __init__(self, sessions: sessionmaker[Session], dispatcher: Dispatcher, policy: PolicySettings,
                 *, clock: Clock, via: Via, governance: Governance | None = None) -> None:
        self._factory = sessions
        self._via: Via = via
        self._dispatcher = dispatcher
        self._policy = policy
        self._clock = clock
        self._governance = governance

    def quarantine(self, node: str, actor: str, reason: str) -> FollowUp:
        with self._sessions() as s, s.begin():
            followup = lever_rules.quarantine(s, node, actor, reason=reason, now=self._clock.now(),
                                              governance=self._governance)
        self._dispatcher.steps([followup])
        return followup

    def release(self, node: str, actor: str, reason: str) -> Undo:
        with self._sessions() as s, s.begin():
            actions = lever_rules.release(s, node, actor, reason=reason, now=self._clock.now())
        return self._undo(actions)

    def cancel(self, remediation_id: int, actor: str, reason: str, *, give_back: bool = False) -> Cancelled:
        with self._sessions() as s, s.begin():
            done = lever_rules.cancel(s, remediation_id, actor, reason=reason, now=self._clock.now(),
                                      give_back=give_back)
            rid, node, step = done.remediation.id, done.remediation.node, done.remediation.step
        return Cancelled(rid, node, step, self._undo(done.give_back) if done.give_back else None)

    def report(self, node: str, actor: str, reason: str) -> list[FollowUp]:
        with self._sessions() as s, s.begin():
            followups = lever_rules.report(s, lever_rules.HumanReport(node, actor, reason),
                                           now=self._clock.now(),
                                           policy=self._policy, governance=self._governance)
        self._dispatcher.steps(followups)
        return followups

    def set_paused(self, paused: bool, actor: str, reason: str) -> bool:
        """Pause or resume all automation; returns whether it was paused before."""
        with self._sessions() as s, s.begin():
            return lever_rules.set_paused(s, paused, actor, reason=reason, now=self._clock.now())

    def breaker_status(self, profile: str | None = None) -> dict[str, Any]:
        with self._sessions() as s:
            return lever_rules.breaker_status(s, profile)

    def close_breaker(self, actor: str, reason: str, profile: str | None = None) -> list[FollowUp]:
        with self._sessions() as s, s.begin():
            followups = lever_rules.close_breaker(s, actor, reason, now=self._clock.now(), profile=profile)
        self._dispatcher.steps(followups)
        return followups

    def resolve_incident(self, incident_id: int, actor: str, reason: str) -> list[FollowUp]:
        """A human closes a correlated incident; its members re-check their trigger and go on alone."""
        with self._sessions() as s, s.begin():
            followups = incidents.resolve(s, incident_id, actor, reason=lever_rules.checked_reason(reason),
                                          now=self._clock.now())
        self._dispatcher.steps(followups)
        return followups

    def _sessions(self) -> Session:
        return through(self._factory(), self._via)

    def _undo(self, actions: lever_rules.ReleaseActions) -> Undo:
        try:
            self._dispatcher.release(actions.audit_id)
        except Exception as exc:  # committed; the caller says plainly that Slurm/Kubernetes were not touched
            return Undo(actions.node, exc)
        return Undo(actions.node)
