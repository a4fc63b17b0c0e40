"""The one lever service: every on-call lever, one transaction each, then the follow-up work.

The CLI and the API call this class and only format what it returns. It adds the session, the clock
and the dispatcher it was given around :mod:`remediation.services.lever_rules`, dispatching only after
the commit. Audit rows record the door (``via``: ``api`` or ``db``). A release whose undo cannot be
queued is still committed, with ``undo_error`` set.

Why: docs/architecture.md#one-lever-service-one-set-of-read-models
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from remediation.db.scope import scoped
from remediation.domain.policy import Clock
from remediation.domain_repair import service as repairs
from remediation.incidents import service as incidents
from remediation.ports.dispatch import Dispatcher, FollowUp
from remediation.profiles.rules import Governance
from remediation.repair_requests import service as repair_requests
from remediation.services import lever_rules
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

    def in_cluster(self, cluster: str) -> LeverService:
        """This service over sessions scoped to ``cluster``: its audit rows, controls and remediations."""
        return LeverService(scoped(self._factory, cluster), self._dispatcher, self._policy, clock=self._clock,
                            via=self._via, governance=self._governance)

    def set_paused_in(self, clusters: list[str], paused: bool, actor: str, *, reason: str) -> dict[str, bool]:
        """Pause or resume each of ``clusters`` (each audited in its own cluster); each one's state before."""
        return {c: self.in_cluster(c).set_paused(paused, actor, reason) for c in clusters}

    def close_breakers(self, clusters: list[str], actor: str, *, reason: str,
                       profile: str | None = None) -> dict[str, list[FollowUp]]:
        """Close the storm breaker of each of ``clusters`` that is open (the one named must be); a
        :class:`lever_rules.LeverError` when none is."""
        if len(clusters) == 1:
            return {clusters[0]: self.in_cluster(clusters[0]).close_breaker(actor, reason, profile)}
        latched = [c for c in clusters if self.in_cluster(c).breaker_status(profile).get("open")]
        if not latched:
            whose = f"profile {profile}'s storm breaker" if profile is not None else "the storm breaker"
            raise lever_rules.LeverError(f"{whose} is not open in any cluster; nothing to close")
        return {c: self.in_cluster(c).close_breaker(actor, reason, profile) for c in latched}

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

    def cancel_repair(self, repair_id: int, actor: str, reason: str) -> list[int]:
        """A human stops a domain repair where it stands; returns the trays' own remediations it held,
        which re-check their trigger now (the sweeper resumes them)."""
        with self._sessions() as s, s.begin():
            return repairs.cancel_repair(s, repair_id, actor, reason=lever_rules.checked_reason(reason),
                                         now=self._clock.now())

    def answer_repair(self, request_id: int, said: repair_requests.Answer) -> FollowUp | None:
        """The repair system or on-call answers a repair request: done opens the re-check (queued
        after the commit), abandoned leaves the node quarantined. Raises RepairNotFound, RepairRefused."""
        with self._sessions() as s, s.begin():
            followup = repair_requests.answer(s, request_id, said, now=self._clock.now())
        if followup is not None:
            self._dispatcher.steps([followup])
        return followup

    def _sessions(self) -> Session:
        return through(self._factory(), self._via)

    def _undo(self, actions: lever_rules.ReleaseActions) -> Undo:
        try:
            self._dispatcher.release(actions.audit_id)
        except Exception as exc:  # committed; the caller says plainly that Slurm/Kubernetes were not touched
            return Undo(actions.node, exc)
        return Undo(actions.node)
